"""``gmp demo``: a local testbed server, the expert policy on several workers, recorded results.

The README's first command: it shows the whole loop (server, parallel workers, recording, the
per-task table with confidence intervals) in under a minute, offline.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.console import Console

__all__ = ["run_demo"]


class DemoNeedsTestbed(GenmanipError):
    """``gmp demo`` needs genmanip-testbed and genmanip-eval."""

    exit_code = ExitCode.NOT_INSTALLED


def run_demo(args: argparse.Namespace) -> int:
    """Start the testbed in-process, evaluate ``--policy`` (default: expert), print the results."""
    try:
        from genmanip_eval.cli import evaluate
        from genmanip_eval.runner import EvalConfig
        from genmanip_testbed import serve_testbed
    except ModuleNotFoundError as exc:
        raise DemoNeedsTestbed(
            f"'gmp demo' needs genmanip-eval and genmanip-testbed ({exc.name} is missing)",
            hint="pip install 'genmanip[testbed]'",
        ) from exc
    console = Console.from_args(args)
    root = Path(getattr(args, "results_dir", None) or "gmp-demo").expanduser().absolute()
    workers = max(1, int(getattr(args, "workers", 4) or 4))
    processes = max(1, min(workers, int(getattr(args, "processes", 2) or 1)))
    tasks = getattr(args, "tasks", None) or "testbed/reach"
    policy = getattr(args, "policy", None) or "expert"
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
