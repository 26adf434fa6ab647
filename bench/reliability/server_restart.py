"""Item 3: the server is SIGKILLed mid-run and restarted (same port, results root and run id).

``gmp testbed serve`` runs as its own process; ``gmp eval`` runs against it; the server is
SIGKILLed, restarted ``--down`` seconds later, and the client is watched: it rides through
(waits for the server, re-creates the workers the new process does not know, restarts the
interrupted episodes) or stops with a clear ``gmp: error:``. ``gmp eval --run-id`` is then re-run
until the job completes. Checked: a clear report, no traceback, the job completes, the results
tree is consistent (bench/reliability/checks.py) and, for the deterministic cases, every finished
episode has exactly the actions of the attempt the server scored (no action counted twice).

Two kinds of kill: at a random moment (plain ``gmp testbed serve``, the real 300 s lock staleness),
and at each server-side moment of ``_testbed_proc.MOMENTS`` (the testbed kills itself there, so
the kill lands at the same point of the protocol on every run; staleness lowered to 3 s), one
case with a restarted server that has no job until ``gmp submit --run-id`` re-submits it.

Usage: python bench/reliability/server_restart.py [--runs 5] [--moment-runs 3]
"""

from __future__ import annotations

import argparse
import json
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
                  lock_stale_s: float | None = None, faults: str | None = None, *,
                  die_at: str | None = None, stats_out: Path | None = None,
                  no_job: bool = False) -> subprocess.Popen[bytes]:
    if lock_stale_s is None and die_at is None and stats_out is None and not no_job:
        cmd = [*GMP, "testbed", "serve", "--port", str(port), "--results-root", str(root), "--run-id", run_id,
               "--tasks", tasks, *(["--fault", faults] if faults else [])]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "_testbed_proc.py"), str(port), str(root),
               run_id, tasks, "-" if lock_stale_s is None else str(lock_stale_s), faults or "",
               *(["--die-at", die_at] if die_at else []),
               *(["--stats-out", str(stats_out)] if stats_out else []),
               *(["--no-job"] if no_job else [])]
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


def _stats(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def _wait_for(cond: Any, timeout: float, poll: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(poll)
    return bool(cond())


def run_one(seed: int, *, tasks: str = "testbed/reach/easy", down: float = 1.0, min_delay: float = 1.0,
            max_delay: float = 6.0, max_attempts: int = 8, lock_stale_s: float | None = None,
            faults: str | None = None, moment: str | None = None, restart_without_job: bool = False,
            client_timeout: float = 600.0, think_ms: float | None = None) -> dict[str, Any]:
    """One run: start a testbed and ``gmp eval``, SIGKILL the testbed, restart it ``down`` s later.

    The kill comes after a random delay (``min_delay``..``max_delay``), or, with ``moment``, at a
    server-side moment (``_testbed_proc.MOMENTS``: the testbed kills itself there, so every run
    kills at the same point of the protocol). ``restart_without_job``: the restarted server is
    idle, like a real one after a crash, until the run is re-submitted (``gmp submit --run-id``),
    which the harness does once the client is seen waiting for it (asking ``/status``).
    ``think_ms``: the policy takes that long per action (``_thinking_policy``), as a real one does.
    """
    rnd = random.Random(seed)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gmp-restart-") as tmp:
        tmpd = Path(tmp)
        port = _free_port()
        run_id = f"restart{seed}"
        results = tmpd / "results"
        log = tmpd / "server.log"
        observed = moment is not None or restart_without_job
        stats1, stats2 = tmpd / "stats1.json", tmpd / "stats2.json"
        server = _start_server(port, tmpd / "srv", run_id, tasks, log, lock_stale_s, faults, die_at=moment,
                               stats_out=stats1 if observed else None)
        url = f"http://127.0.0.1:{port}"
        policy = ["--policy", "expert"]
        env = python_env()
        if think_ms is not None:
            policy = ["--policy", "_thinking_policy:make", "--policy-arg", f"think_ms={think_ms:g}"]
            here = str(Path(__file__).resolve().parent)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        argv = [*GMP, "eval", "--url", url, *policy,
                "--results-dir", str(results), "--run-id", run_id, "--worker-ids", "0,1"]
        t0 = time.monotonic()
        client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                  start_new_session=True)
        if moment is not None:
            # The testbed dies by itself at the moment; a client that finished first is a miss.
            _wait_for(lambda: server.poll() is not None or client.poll() is not None, 120)
            server_killed_mid_run = server.poll() is not None and client.poll() is None
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
        else:
            time.sleep(rnd.uniform(min_delay, max_delay))
            server_killed_mid_run = client.poll() is None
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        t_kill = time.monotonic()
        time.sleep(down)
        server = _start_server(port, tmpd / "srv", run_id, tasks, log, lock_stale_s, faults,
                               stats_out=stats2 if observed else None, no_job=restart_without_job)
        resubmitted = False
        if restart_without_job:
            # Re-submit (what the operator does) once the client has found the job gone and waits:
            # it asks /status while it waits (server-side observation, no wall-clock guess).
            _wait_for(lambda: _stats(stats2).get("requests", {}).get("/status", 0) >= 2
                      or client.poll() is not None, 60)
            sub = subprocess.run([*GMP, "submit", tasks, "--run-id", run_id, "--url", url],
                                 capture_output=True, text=True, env=python_env(), timeout=60, check=False)
            resubmitted = sub.returncode == 0
            if not resubmitted:
                problems.append(f"gmp submit failed (exit {sub.returncode}): {sub.stderr[-300:]}")
        try:
            _, err_b = client.communicate(timeout=client_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(client.pid, signal.SIGKILL)
            _, err_b = client.communicate()
            problems.append(f"the client hung for {client_timeout:g} s after the server restart")
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
            p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
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
        # The attempt each episode was scored in is the last one counted by the process that
        # finished it: the restarted server's, else (finished before the kill) the dead one's.
        s1, s2 = _stats(stats1), _stats(stats2)
        exact: dict[str, int] | None = None
        if observed:
            exact = {k: v[-1] for k, v in s1.get("steps_by_attempt", {}).items() if v}
            exact.update({k: v[-1] for k, v in s2.get("steps_by_attempt", {}).items() if v})
        run_dir = find_run_dir(results)
        chk = check_run(run_dir, server_steps=exact) if run_dir else None
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
        for rel in sorted(recorded - set(server_done)):
            problems.append(f"{rel}: recorded as finished, but the server never finished it")
        if rc != 0:
            problems.append(f"the job did not complete after {attempts} runs: {last_err[-300:]}")
        return {
            "seed": seed,
            "moment": moment or "random",
            "killed_mid_run": server_killed_mid_run,
            "first_rc": first_rc,
            "first_report": report[-1][len("gmp: error: "):][:200] if report else "",
            "first_stderr": [ln for ln in first_err.splitlines() if ln.strip()][-6:],
            "stderr": first_err,
            "restart_messages": [ln for ln in first_err.splitlines() if "restarted" in ln and "server" in ln][:4],
            "seconds_to_report": detect_s,
            "attempts": attempts,
            "final_rc": rc,
            "client_finished": len(chk.finished) if chk else 0,
            "server_finished": server_finished,
            "incomplete_left": len(chk.incomplete) if chk else 0,
            "lost_with_reason": lost,
            "exact_compared": sum(1 for e in (chk.finished if chk else ()) if exact and e in exact),
            "attempts_restarted": sum(1 for v in s2.get("steps_by_attempt", {}).values() if v)
            if observed else None,
            "resubmitted": resubmitted,
            "problems": problems,
            "seconds": round(elapsed, 1),
        }


#: The deterministic cases: (label, --die-at moment, restarted server without a job).
MOMENT_CASES = [
    ("first_step", "first_step", False),
    ("mid_episode", "mid_episode", False),
    ("after_reply", "after_reply", False),
    ("reset_request", "reset_request", False),
    ("first_reset", "first_reset", False),
    ("during_reset", "during_reset", False),
    ("between_episodes", "between_episodes", False),
    ("no_job", "mid_episode", True),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="random-moment kills (plain gmp testbed serve)")
    ap.add_argument("--moment-runs", type=int, default=3, help="runs per deterministic moment (0: none)")
    ap.add_argument("--think-ms", type=float, default=50.0, help="policy time per action (moment runs)")
    ap.add_argument("--tasks", default="testbed/reach/easy")
    a = ap.parse_args(argv)
    bad = 0
    if a.moment_runs:
        rows = []
        for label, moment, no_job in MOMENT_CASES:
            for seed in range(1, a.moment_runs + 1):
                r = run_one(seed, tasks=a.tasks, moment=moment, restart_without_job=no_job,
                            lock_stale_s=3.0, max_attempts=1, think_ms=a.think_ms)
                bad += bool(r["problems"])
                rows.append([label, seed, "yes" if r["killed_mid_run"] else "no", r["first_rc"],
                             f"{r['client_finished']}/{r['server_finished']}", r["lost_with_reason"],
                             f"{r['exact_compared']}/{r['client_finished']}", r["attempts_restarted"],
                             len(r["problems"]), r["seconds"]])
                for p in r["problems"][:5]:
                    print(f"{label} seed {seed}: {p}", file=sys.stderr)
        print(f"### Server SIGKILLed at a server-side moment, restarted after 1 s ({a.tasks}, 2 workers, "
              f"policy {a.think_ms:g} ms/action, lock staleness 3 s)\n")
        print(md_table(["moment", "seed", "killed mid-run", "client exit (one run)", "finished client/server",
                        "unrecorded, reason given", "step-exact vs scored attempt",
                        "episodes served by the restarted server", "problems", "s"], rows))
        print()
    rows = []
    for seed in range(1, a.runs + 1):
        r = run_one(seed, tasks=a.tasks)
        bad += bool(r["problems"])
        rows.append([seed, "yes" if r["killed_mid_run"] else "no", r["first_rc"], r["seconds_to_report"],
                     (r["first_report"] or "-").replace("|", "/")[:120], r["attempts"], r["final_rc"],
                     f"{r['client_finished']}/{r['server_finished']}", r["lost_with_reason"], len(r["problems"])])
        for p in r["problems"][:5]:
            print(f"seed {seed}: {p}", file=sys.stderr)
    if rows:
        print(f"### Server SIGKILLed mid-run and restarted after 1 s ({a.tasks}, 2 workers)\n")
        print(md_table(["seed", "killed mid-run", "client exit", "s from kill to client exit", "client report",
                        "gmp eval runs", "final exit", "finished client/server",
                        "unrecorded, reason given", "problems"],
                       rows))
    print(f"\nverdict: {'PASS' if not bad else 'FAIL'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
