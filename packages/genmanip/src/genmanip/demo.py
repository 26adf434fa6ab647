"""``gmp demo``: a local testbed server, the expert policy on several workers, recorded results.

The README's first command: it shows the whole loop (server, parallel workers, recording, the
per-task table with confidence intervals) in under a minute, offline.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_results.layout import DEMO_RESULTS_DIR
from genmanip_runtime.console import Console

__all__ = ["run_demo"]


class DemoNeedsTestbed(GenmanipError):
    """``gmp demo`` needs genmanip-testbed and genmanip-eval."""

    exit_code = ExitCode.NOT_INSTALLED


def run_demo(
    *,
    workers: int,
    processes: int,
    tasks: str,
    policy: str,
    results_dir: str,
    console: Console,
) -> int:
    """Start the testbed in-process, evaluate ``--policy`` (default: expert), print the results."""
    try:
        from genmanip_eval.cli import evaluate
        from genmanip_eval.runner import EvalConfig
        from genmanip_testbed import serve_testbed
    except ModuleNotFoundError as exc:
        # Name the distribution that is missing; anything else missing is one of their
        # dependencies, which reinstalling both brings back.
        missing = {"genmanip_eval": "genmanip-eval", "genmanip_testbed": "genmanip-testbed"}.get(
            (exc.name or "").split(".")[0], "genmanip-eval genmanip-testbed"
        )
        raise DemoNeedsTestbed(
            f"'gmp demo' needs genmanip-eval and genmanip-testbed ({exc.name} is missing)",
            hint=f"pip install {missing}",
        ) from exc
    root = Path(results_dir or DEMO_RESULTS_DIR).expanduser().absolute()
    workers = max(1, int(workers or 4))
    processes = max(1, min(workers, int(processes or 1)))
    tasks = tasks or "testbed/reach"
    policy = policy or "expert"
    with tempfile.TemporaryDirectory(prefix="gmp-demo-server-") as server_root:
        with serve_testbed(tasks=(tasks,), results_root=server_root, save_process=False) as tb:
            console.info(
                f"demo: testbed server at {tb.url} ({tasks}); policy {policy!r} on {workers} "
                f"workers in {processes} process(es); recording to {root}"
            )
            cfg = EvalConfig(
                url=tb.url,
                worker_ids=[str(i) for i in range(workers)],
                processes=processes,
                policy=policy,
                results_dir=str(root),
            )
            summary = evaluate(cfg, console, label="demo")
    console.info(f"browse the results: gmp viz --root {root}")
    return int(ExitCode.OK) if summary.complete else int(ExitCode.FAILURE)
