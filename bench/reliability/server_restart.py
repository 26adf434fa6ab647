"""Item 3: the server is SIGKILLed mid-run and restarted (same port, results root and run id).

``gmp testbed serve`` runs as its own process; ``gmp eval`` runs against it; after a random delay
the server is SIGKILLed, restarted ``--down`` seconds later, and the client is watched: it either
rides through (reconnect) or stops with a clear ``gmp: error:`` naming the unreachable server.
``gmp eval --run-id`` is then re-run until the job completes. Checked: a clear report, no
traceback, the job completes, and the results tree is consistent (bench/reliability/checks.py).

Usage: python bench/reliability/server_restart.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table
from checks import GMP, check_run, find_run_dir, python_env, unrecorded_with_reason


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(port: int, root: Path, run_id: str, tasks: str, log: Path,
                  lock_stale_s: float | None = None, faults: str | None = None) -> subprocess.Popen[bytes]:
    if lock_stale_s is None:
        cmd = [*GMP, "testbed", "serve", "--port", str(port), "--results-root", str(root), "--run-id", run_id,
               "--tasks", tasks, *(["--fault", faults] if faults else [])]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "_testbed_proc.py"), str(port), str(root),
               run_id, tasks, str(lock_stale_s), faults or ""]
    proc = subprocess.Popen(
        cmd,
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=python_env(), start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"testbed exited {proc.returncode}: {log.read_text()[-800:]}") from None
            time.sleep(0.1)
    raise RuntimeError("testbed did not start within 60 s")


def run_one(seed: int, *, tasks: str = "testbed/reach/easy", down: float = 1.0, min_delay: float = 1.0,
            max_delay: float = 6.0, max_attempts: int = 8, lock_stale_s: float | None = None,
            faults: str | None = None) -> dict[str, Any]:
    rnd = random.Random(seed)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gmp-restart-") as tmp:
        tmpd = Path(tmp)
        port = _free_port()
        run_id = f"restart{seed}"
        results = tmpd / "results"
        log = tmpd / "server.log"
        server = _start_server(port, tmpd / "srv", run_id, tasks, log, lock_stale_s, faults)
        argv = [*GMP, "eval", "--url", f"http://127.0.0.1:{port}", "--policy", "expert",
                "--results-dir", str(results), "--run-id", run_id, "--worker-ids", "0,1"]
        t0 = time.monotonic()
        client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=python_env(),
                                  start_new_session=True)
        time.sleep(rnd.uniform(min_delay, max_delay))
        server_killed_mid_run = client.poll() is None
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        t_kill = time.monotonic()
        time.sleep(down)
        server = _start_server(port, tmpd / "srv", run_id, tasks, log, lock_stale_s, faults)
        try:
            _, err_b = client.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(client.pid, signal.SIGKILL)
            _, err_b = client.communicate()
            problems.append("the client hung for 600 s after the server restart")
        first_rc = client.returncode
        first_err = err_b.decode("utf-8", "replace")
        report = [ln for ln in first_err.splitlines() if ln.startswith("gmp: error:")]
        detect_s = round(time.monotonic() - t_kill, 1)
        if "Traceback" in first_err or first_rc == 70:
            problems.append(f"crash: {first_err[-600:]}")
        if first_rc not in (0,) and not report:
            problems.append(f"exit {first_rc} without a clear 'gmp: error:' line: {first_err[-300:]}")
        attempts = 1
        rc = first_rc
        last_err = first_err
        while rc != 0 and attempts < max_attempts:
            attempts += 1
            p = subprocess.run(argv, capture_output=True, text=True, env=python_env(), timeout=600, check=False)
            rc, last_err = p.returncode, p.stderr
            if "Traceback" in last_err:
                problems.append(f"crash on re-run: {last_err[-600:]}")
        elapsed = time.monotonic() - t0
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        srv_run = next((tmpd / "srv").glob(f"saved/eval_results/*/{run_id}"), None)
        server_done = [str(p.parent.relative_to(srv_run)) for p in srv_run.rglob("result_info.json")] if srv_run else []
        server_finished = len(server_done)
        run_dir = find_run_dir(results)
        chk = check_run(run_dir) if run_dir else None
        if chk:
            problems += chk.problems
        # A result the crashed server never handed out is gone with it: such an episode must be
        # INCOMPLETE with that reason; any other unrecorded one is a problem.
        recorded = {str(d.relative_to(run_dir)) for d in chk.finished.values()} if chk and run_dir else set()
        lost = 0
        for rel in sorted(set(server_done) - recorded):
            if run_dir is not None and unrecorded_with_reason(run_dir / rel):
                lost += 1
            else:
                problems.append(f"{rel}: finished on the server, not recorded, no reason given")
        if rc != 0:
            problems.append(f"the job did not complete after {attempts} runs: {last_err[-300:]}")
        return {
            "seed": seed,
            "killed_mid_run": server_killed_mid_run,
            "first_rc": first_rc,
            "first_report": report[-1][len("gmp: error: "):][:200] if report else "",
            "first_stderr": [ln for ln in first_err.splitlines() if ln.strip()][-6:],
            "seconds_to_report": detect_s,
            "attempts": attempts,
            "final_rc": rc,
            "client_finished": len(chk.finished) if chk else 0,
            "server_finished": server_finished,
            "incomplete_left": len(chk.incomplete) if chk else 0,
            "lost_with_reason": lost,
            "problems": problems,
            "seconds": round(elapsed, 1),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tasks", default="testbed/reach/easy")
    a = ap.parse_args(argv)
    rows = []
    bad = 0
    for seed in range(1, a.runs + 1):
        r = run_one(seed, tasks=a.tasks)
        bad += bool(r["problems"])
        rows.append([seed, "yes" if r["killed_mid_run"] else "no", r["first_rc"], r["seconds_to_report"],
                     (r["first_report"] or "-").replace("|", "/")[:120], r["attempts"], r["final_rc"],
                     f"{r['client_finished']}/{r['server_finished']}", r["lost_with_reason"], len(r["problems"])])
        for p in r["problems"][:5]:
            print(f"seed {seed}: {p}", file=sys.stderr)
    print(f"### Server SIGKILLed mid-run and restarted after 1 s ({a.tasks}, 2 workers)\n")
    print(md_table(["seed", "killed mid-run", "client exit", "s from kill to client exit", "client report",
                    "gmp eval runs", "final exit", "finished client/server",
                    "unrecorded, reason given", "problems"],
                   rows))
    print(f"\nverdict: {'PASS' if not bad else 'FAIL'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
