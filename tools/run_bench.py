#!/usr/bin/env python3
"""Run every ``bench/*.py`` script in turn (each prints a markdown table); exit 1 if one fails.

Usage: python tools/run_bench.py [NAME_SUBSTRING ...]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    scripts = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
    if argv:
        scripts = [p for p in scripts if any(a in p.name for a in argv)]
    if not scripts:
        print("error: no bench scripts matched", file=sys.stderr)
        return 1
    failed = []
    for script in scripts:
        print(f"\n## {script.name}\n", flush=True)
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, str(script)], cwd=ROOT, check=False)
        print(f"\n_{script.name}: exit {res.returncode} in {time.monotonic() - t0:.1f} s_", flush=True)
        if res.returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
