"""Handler of ``gmp compare`` (the parser is in the meta package).

Data goes to stdout (the table, or ``--json``); talk goes to stderr.
"""

from __future__ import annotations

import sys

from genmanip_protocol.errors import ExitCode
from genmanip_runtime.console import Console
from genmanip_runtime.redact import scrub_secrets

from .compare import compare_runs, comparison_table, dumps, resolve_run

__all__ = ["compare"]


def compare(
    *,
    run_a: str,
    run_b: str,
    as_json: bool,
    alpha: float,
    delta: float,
    root: str | None,
    console: Console,
) -> int:
    """``gmp compare RUN_A RUN_B``: B against A on shared (task, seed); table or ``--json``.

    Returns ``ExitCode.OK``; ``ExitCode.USAGE`` for an ``alpha``/``delta`` outside (0, 1) and
    ``ExitCode.NOTHING_TO_DO`` when the runs share no complete (task, seed) (the output is still
    written).
    """
    console = console or Console()
    for name, value in (("--alpha", alpha), ("--delta", delta)):
        if not 0.0 < value < 1.0:
            console.error(f"{name} must be within (0, 1), got {value:g}")
            return int(ExitCode.USAGE)
    a = resolve_run(run_a, root)
    b = resolve_run(run_b, root)
    console.info(f"comparing {b.key} (B) against {a.key} (A) on shared (task, seed)")
    result = compare_runs(a, b, alpha=alpha, delta=delta)
    text = dumps(result) + "\n" if as_json else comparison_table(result)
    sys.stdout.write(scrub_secrets(text))
    sys.stdout.flush()
    if result["overall"]["pairs"] == 0:
        console.warn("the runs share no complete (task, seed): nothing is paired")
        return int(ExitCode.NOTHING_TO_DO)
    return int(ExitCode.OK)
