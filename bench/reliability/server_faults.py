"""Item 1: a whole multi-worker ``gmp eval`` job against a testbed that answers a share of the eval
calls (10%, 2%, 1%) with 500/503/504 or drops the connection (before or after doing the work).

For each seed: a fresh testbed (``--fault error_rate=...,errors=500|503|504,reset_before=...,
reset_after=...,seed=S``), then ``python -m genmanip eval --worker-ids 0,1,2,3 --processes 2`` as a
real process: recovering from failures in the run (the default), or stopping at the first one and
re-run with the same ``--run-id`` until the job completes. Checked: every run exits 0, or non-zero
with a ``gmp: error:`` line (a precise error, never a traceback / exit 70); every finished
episode's ``steps.jsonl`` has exactly the actions of the attempt the server scored (a step applied
twice would show up as more server steps; the testbed counts per attempt); every server-finished
episode is recorded exactly once, or is INCOMPLETE with the reason (its result's reply was lost);
no episode is recorded that the server did not finish; videos decode.

Usage: python bench/reliability/server_faults.py [--runs 5] [--tasks testbed/all]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table
from checks import GMP, check_run, find_run_dir, python_env, unrecorded_with_reason

DEFAULT_FAULT = "error_rate=0.06,errors=500|503|504,reset_before=0.02,reset_after=0.02"
TWO_PERCENT = "error_rate=0.012,errors=500|503|504,reset_before=0.004,reset_after=0.004"
RESUME_FAULT = "error_rate=0.006,errors=500|503|504,reset_before=0.002,reset_after=0.002"


def run_one(seed: int, *, tasks: str = "testbed/reach/easy", workers: int = 4, processes: int = 2,
            fault: str = DEFAULT_FAULT, timeout: float = 900.0, extra: tuple[str, ...] = (),
            max_attempts: int = 1, max_recoveries: int = 5) -> dict[str, Any]:
    """One job; with ``max_attempts`` > 1, ``gmp eval --run-id`` is re-run after each stop (what a
    user does) until the job completes."""
    from genmanip_testbed import serve_testbed

    with tempfile.TemporaryDirectory(prefix="gmp-faults-") as tmp:
        results = Path(tmp) / "results"
        spec = f"{fault},seed={seed}"
        with serve_testbed(tasks=tasks, run_id=f"faults{seed}", results_root=Path(tmp) / "srv",
                           faults=spec) as tb:
            t0 = time.monotonic()
            problems: list[str] = []
            errors: list[str] = []
            recovered = restarted = 0
            attempts = 0
            while attempts < max_attempts:
                attempts += 1
                proc = subprocess.run(
                    [*GMP, "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                     "--run-id", f"faults{seed}", "--worker-ids", ",".join(str(i) for i in range(workers)),
                     "--processes", str(processes), "--max-recoveries", str(max_recoveries), *extra],
                    capture_output=True, text=True, timeout=timeout, env=python_env(), check=False)
                err_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gmp: error:")]
                errors += [ln[len("gmp: error: "):] for ln in err_lines]
                recovered += proc.stderr.count("; recovering (failure ")
                restarted += len(re.findall(r"^warning: worker \S+: episode \S+ restarted", proc.stderr, re.M))
                if proc.returncode == 70 or "Traceback" in proc.stderr:
                    problems.append(f"crash (exit {proc.returncode}): {proc.stderr[-800:]}")
                    break
                if proc.returncode != 0 and not err_lines:
                    problems.append(f"exit {proc.returncode} without a 'gmp: error:' line: {proc.stderr[-400:]}")
                if proc.returncode == 0:
                    break
            elapsed = time.monotonic() - t0
            tb.wait_finalizes(60)
            stats = tb.stats.snapshot()
            attempts_by_ep = {k: list(v) for k, v in tb.stats.steps_by_attempt.items()}
            server_done = {p.parent.relative_to(tb.run_dir) for p in tb.run_dir.rglob("result_info.json")}
        run_dir = find_run_dir(results)
        # The attempt the server scored is the last one of each episode id: a finished episode's
        # steps.jsonl must have exactly its actions (an earlier, interrupted attempt is a different
        # recording that the client replaced). This compares every finished episode.
        exact = {k: v[-1] for k, v in attempts_by_ep.items() if v}
        chk = check_run(run_dir, server_steps=exact) if run_dir else None
        problems += list(chk.problems) if chk else ["no run directory"]
        client_done = {d.relative_to(run_dir) for d in chk.finished.values()} if chk and run_dir else set()
        lost_ok = 0
        for rel in sorted(server_done - client_done):
            d = run_dir / rel if run_dir else None
            if d is not None and unrecorded_with_reason(d):
                lost_ok += 1
            else:
                problems.append(f"{rel}: finished on the server, not recorded, no reason given")
        for rel in sorted(client_done - server_done):
            problems.append(f"{rel}: recorded as finished, but the server never finished it")
        faults = stats.get("faults", {})
        return {
            "seed": seed,
            "rc": proc.returncode,
            "error": errors[-1][:160] if errors else "",
            "errors": errors,
            "attempts": attempts,
            "recovered": recovered,
            "restarted": restarted,
            "retried_episodes": sum(1 for v in attempts_by_ep.values() if len(v) > 1),
            "exact_compared": sum(1 for e in (chk.finished if chk else ()) if e in exact),
            "seconds": round(elapsed, 1),
            "requests": sum(stats.get("requests", {}).values()),
            "faults": sum(faults.values()) if isinstance(faults, dict) else faults,
            "fault_kinds": faults,
            "server_steps": sum(stats.get("steps_by_episode", {}).values()),
            "server_finished": len(server_done),
            "client_finished": len(client_done),
            "lost_with_reason": lost_ok,
            "client_rows": sum(chk.rows.values()) if chk else 0,
            "incomplete": len(chk.incomplete) if chk else 0,
            "videos_checked": chk.videos_checked if chk else 0,
            "problems": problems,
            "stderr_tail": proc.stderr[-600:],
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tasks", default="testbed/all")
    ap.add_argument("--fault", default=DEFAULT_FAULT)
    ap.add_argument("--low-fault", default=TWO_PERCENT)
    ap.add_argument("--resume-fault", default=RESUME_FAULT)
    ap.add_argument("--max-attempts", type=int, default=60)
    a = ap.parse_args(argv)
    bad = 0
    modes = (("recovering in the run (--max-recoveries 5, the default)", a.fault, 1, 5),
             ("recovering in the run (--max-recoveries 5, the default)", a.low_fault, 1, 5),
             ("stop at each failure (--max-recoveries 0), re-run with --run-id until complete",
              a.resume_fault, a.max_attempts, 0))
    for label, fault, attempts, recoveries in modes:
        rows = []
        for seed in range(1, a.runs + 1):
            r = run_one(seed, tasks=a.tasks, fault=fault, max_attempts=attempts, max_recoveries=recoveries)
            bad += bool(r["problems"])
            rows.append([r["seed"], r["rc"], r["attempts"], r["requests"], r["faults"], r["recovered"],
                         r["restarted"], r["server_steps"], r["client_rows"], r["exact_compared"],
                         f"{r['client_finished']}/{r['server_finished']}", r["lost_with_reason"],
                         r["videos_checked"], len(r["problems"]), r["seconds"],
                         (r["error"] or "-").replace("|", "/")[:110]])
            for p in r["problems"][:5]:
                print(f"seed {seed}: {p}", file=sys.stderr)
        print(f"\n### Server faults, {label}: `{fault}`, {a.tasks}, 4 workers in 2 processes\n")
        print(md_table(["seed", "exit", "gmp eval runs", "requests", "faults injected", "recovered",
                        "episodes restarted", "server steps", "steps.jsonl rows",
                        "finished episodes compared step-exact", "finished client/server",
                        "unrecorded, reason given", "videos decoded", "problems", "s", "last error"], rows))
    print(f"\nverdict: {'PASS' if not bad else 'FAIL'} ({bad} runs with problems)")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
