"""Item 4: the disk fills up while ``gmp eval`` records.

The results root is a small tmpfs (``mount -t tmpfs -o size=...``, needs root); where mounting is
not permitted the run falls back to ``RLIMIT_FSIZE`` in the client process (SIGXFSZ ignored, so
writes past the limit fail with EFBIG) and says so. Checked: the client stops with a clear
``gmp: error:`` (no traceback, no hang), and the tree holds no corrupt result file: every finished
episode intact (bench/reliability/checks.py), unfinished ones marked or without ``result.json``,
no leftover temporary files of atomic writes.

Usage: python bench/reliability/disk_full.py [--sizes 300k,600k,1m,2m]
"""

from __future__ import annotations

import argparse
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table
from checks import GMP, check_run, find_run_dir, python_env


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)


def _bytes(size: str) -> int:
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3}
    s = size.strip().lower()
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def run_one(size: str = "600k", *, tasks: str = "testbed/reach/easy", method: str = "auto") -> dict[str, Any]:
    from genmanip_testbed import serve_testbed

    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gmp-diskfull-") as tmp:
        mnt = Path(tmp) / "mnt"
        used = "tmpfs" if method in ("auto", "tmpfs") and _mount_tmpfs(mnt, size) else "RLIMIT_FSIZE"
        if method == "tmpfs" and used != "tmpfs":
            raise RuntimeError("mount -t tmpfs is not permitted here")
        mnt.mkdir(exist_ok=True)
        preexec: Callable[[], None] | None = None
        if used == "RLIMIT_FSIZE":
            limit = _bytes(size)

            def preexec() -> None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        results = mnt / "results"
        try:
            with serve_testbed(tasks=tasks, run_id="diskfull", results_root=Path(tmp) / "srv") as tb:
                t0 = time.monotonic()
                try:
                    proc = subprocess.run(
                        [*GMP, "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                         "--run-id", "diskfull", "--worker-ids", "0,1"],
                        capture_output=True, text=True, env=python_env(), timeout=600, check=False,
                        preexec_fn=preexec)
                    rc, err = proc.returncode, proc.stderr
                except subprocess.TimeoutExpired:
                    rc, err = None, ""
                    problems.append("gmp eval hung for 600 s on a full disk")
                elapsed = time.monotonic() - t0
            report = [ln for ln in err.splitlines() if ln.startswith("gmp: error:")]
            if "Traceback" in err or rc == 70:
                problems.append(f"crash (exit {rc}): {err[-800:]}")
            if rc not in (0, None) and not report:
                problems.append(f"exit {rc} without a 'gmp: error:' line: {err[-300:]}")
            run_dir = find_run_dir(results)
            chk = check_run(run_dir) if run_dir else None
            if chk:
                problems += chk.problems
            leftovers = [str(p.relative_to(results)) for p in results.rglob(".*.tmp")] if results.exists() else []
            if leftovers:
                problems.append(f"temporary files left behind: {leftovers[:5]}")
            return {
                "size": size,
                "method": used,
                "rc": rc,
                "report": report[-1][len("gmp: error: "):][:220] if report else "",
                "finished": len(chk.finished) if chk else 0,
                "incomplete": len(chk.incomplete) if chk else 0,
                "videos_checked": chk.videos_checked if chk else 0,
                "problems": problems,
                "seconds": round(elapsed, 1),
                "stderr_tail": err[-500:],
            }
        finally:
            if used == "tmpfs":
                _umount(mnt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="200k,400k,600k,1m")
    ap.add_argument("--method", choices=["auto", "tmpfs", "rlimit"], default="auto")
    a = ap.parse_args(argv)
    rows = []
    bad = 0
    for size in a.sizes.split(","):
        r = run_one(size, method=a.method)
        bad += bool(r["problems"])
        rows.append([size, r["method"], r["rc"], r["finished"], r["incomplete"], r["videos_checked"],
                     len(r["problems"]), (r["report"] or "-").replace("|", "/")[:150]])
        for p in r["problems"][:5]:
            print(f"{size}: {p}", file=sys.stderr)
    print("### Disk full during recording (testbed/reach/easy, 8 episodes, 2 workers)\n")
    print(md_table(["size", "method", "exit", "finished intact", "incomplete", "videos decoded",
                    "problems", "client report"], rows))
    print(f"\nverdict: {'PASS' if not bad else 'FAIL'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
