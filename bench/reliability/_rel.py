"""Small helpers shared by the reliability runs (bench/reliability/*.py and tests/reliability)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

__all__ = ["HERE", "ROOT", "md_table", "peak_rss_mb", "run_child_json"]


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown table (the output format of every bench script)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_child_json(script: Path, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``script --child ARGS`` in a fresh interpreter; return the JSON it prints last on stdout.

    A child process gives each run its own peak-RSS figure and lets a hang be bounded by a timeout
    that cannot be swallowed by the code under test.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    proc = subprocess.run(
        [sys.executable, str(script), "--child", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{script.name} child exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
            f"stderr:\n{proc.stderr[-4000:]}"
        )
    last = proc.stdout.strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(last)
    return result
