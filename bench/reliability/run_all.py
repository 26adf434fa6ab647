#!/usr/bin/env python3
"""Run every long reliability run in turn (each prints its markdown figures); exit 1 if one fails.

The figures in docs/reliability.md come from this. Takes about 30-60 minutes on 2 cores
(server_restart waits out the real server's 300 s lock staleness after each server kill).

Usage: python bench/reliability/run_all.py [NAME_SUBSTRING ...]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (script, arguments): the published configuration of each row of docs/reliability.md
RUNS: list[tuple[str, list[str]]] = [
    ("fuzz_codecs.py", ["--n", "100000", "--seed", "1"]),
    ("concurrent_merge.py", ["--processes", "8", "--merges", "1000"]),
    ("client_kill.py", ["--kills", "60", "--tasks", "testbed/all", "--seed", "2"]),
    ("server_faults.py", ["--runs", "3", "--tasks", "testbed/all"]),
    ("server_restart.py", ["--runs", "3"]),
    ("disk_full.py", ["--sizes", "300k,1m,3m,6m"]),
    ("slow_server.py", ["--repeats", "3"]),
]


def main(argv: list[str]) -> int:
    runs = [r for r in RUNS if not argv or any(a in r[0] for a in argv)]
    if not runs:
        print("error: no reliability run matched", file=sys.stderr)
        return 1
    failed = []
    for script, args in runs:
        print(f"\n## {script} {' '.join(args)}\n", flush=True)
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, str(HERE / script), *args], check=False)
        print(f"\n_{script}: exit {res.returncode} in {time.monotonic() - t0:.0f} s_", flush=True)
        if res.returncode != 0:
            failed.append(script)
    if failed:
        print(f"error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
