"""Item 2: SIGKILL ``gmp eval`` at random moments; after each kill the finished episodes are intact,
the partial ones marked INCOMPLETE, and re-running with the same run id finishes the job.

One testbed job (``--tasks``); ``python -m genmanip eval --run-id R --worker-ids 0,1 --processes 2``
is started in its own process group and killed (SIGKILL to the whole group: the eval process, its
worker processes and their ffmpeg children) after a random delay, then started again, until
``--kills`` kills happened; then it runs to the end. After every kill the results tree is checked
(bench/reliability/checks.py: every finished episode's ``result.json`` parses and matches
``steps.jsonl``, every video decodes, ``episode_result.json`` lists exactly the finished seeds,
unfinished episode directories carry ``INCOMPLETE``), and finished episodes are fingerprinted: a
later attempt must never rewrite one (``result.json`` bytes unchanged), i.e. re-runs do exactly the
missing seeds. The kill moment is classified by what the process tree was doing (an ffmpeg child
alive = mid-transcode).

Usage: python bench/reliability/client_kill.py [--kills 50] [--tasks testbed/all]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table
from checks import GMP, check_run, find_run_dir, python_env, unrecorded_with_reason


def _descendants(pid: int) -> list[int]:
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
                out += kids
                stack += kids
        except OSError:
            continue
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _fingerprints(run_dir: Path | None) -> dict[str, str]:
    if run_dir is None:
        return {}
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in run_dir.rglob("result.json")}


def run(kills: int = 50, *, tasks: str = "testbed/all", seed: int = 1, min_delay: float = 1.0,
        max_delay: float = 6.0, max_attempts_after: int = 10, decode_videos: bool = True,
        faults: str | None = None) -> dict[str, Any]:
    from genmanip_testbed import serve_testbed

    rnd = random.Random(seed)
    moments: dict[str, int] = {}
    problems: list[str] = []
    rewritten: list[str] = []
    stale_seen: set[str] = set()
    finishing_seen: set[str] = set()
    killed = 0
    attempts = 0
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gmp-kill-") as tmp:
        results = Path(tmp) / "results"
        run_id = f"kill{seed}"
        with serve_testbed(tasks=tasks, run_id=run_id, results_root=Path(tmp) / "srv", faults=faults) as tb:
            argv = [*GMP, "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                    "--run-id", run_id, "--worker-ids", "0,1", "--processes", "2"]
            known: dict[str, str] = {}
            final_rc = None
            final_err = ""
            while True:
                attempts += 1
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        env=python_env(), start_new_session=True)
                if killed < kills:
                    delay = rnd.uniform(min_delay, max_delay)
                    deadline = time.monotonic() + delay
                    # every third kill waits for an ffmpeg child: random times rarely hit a transcode
                    want_ffmpeg = killed % 3 == 2
                    if want_ffmpeg:
                        deadline = time.monotonic() + 3 * max_delay
                    while time.monotonic() < deadline and proc.poll() is None:
                        if want_ffmpeg and any("ffmpeg" in _comm(k) for k in _descendants(proc.pid)):
                            time.sleep(rnd.uniform(0.0, 0.05))
                            break
                        time.sleep(0.01 if want_ffmpeg else 0.02)
                    if proc.poll() is None:
                        kids = _descendants(proc.pid)
                        names = {_comm(k) for k in kids}
                        moment = ("mid-transcode (ffmpeg running)" if any("ffmpeg" in n for n in names)
                                  else "stepping/recording" if kids else "starting up")
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        killed += 1
                        moments[moment] = moments.get(moment, 0) + 1
                        proc.stderr.close()  # type: ignore[union-attr]
                    else:
                        final_rc = proc.returncode
                        final_err = proc.stderr.read().decode("utf-8", "replace")  # type: ignore[union-attr]
                else:
                    try:
                        _, err = proc.communicate(timeout=900)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        _, err = proc.communicate()
                        problems.append("the final run did not finish within 900 s")
                    final_rc = proc.returncode
                    final_err = err.decode("utf-8", "replace")
                run_dir = find_run_dir(results)
                if run_dir is not None:
                    chk = check_run(run_dir, decode_videos=decode_videos)
                    problems += [f"after attempt {attempts}: {p}" for p in chk.problems]
                    stale_seen |= set(chk.stale_markers)
                    finishing_seen |= set(chk.finishing)
                    now = _fingerprints(run_dir)
                    for k, h in known.items():
                        if now.get(k) != h:
                            rewritten.append(k)
                    known.update(now)
                if final_rc is not None:
                    if final_rc == 0 or attempts > kills + max_attempts_after:
                        break
                    final_rc = None  # a clean non-zero stop (e.g. a lock lost to the kill): run again
            tb.wait_finalizes(60)
            server_finished = {str(p.parent.relative_to(tb.run_dir)) for p in tb.run_dir.rglob("result_info.json")}
        run_dir = find_run_dir(results)
        chk = check_run(run_dir, decode_videos=decode_videos) if run_dir else None
        client_finished = {str(d.relative_to(run_dir)) for d in chk.finished.values()} if chk and run_dir else set()
        if final_rc != 0:
            problems.append(f"the final run exited {final_rc}: {final_err[-400:]}")
        if chk and chk.finishing:
            problems.append(f"episodes left unfinished after the final run: {chk.finishing[:5]}")
        if chk and chk.stale_markers:
            problems.append(f"stale INCOMPLETE markers left after the final run: {chk.stale_markers[:5]}")
        if "Traceback" in final_err:
            problems.append(f"traceback in the final run: {final_err[-600:]}")
        server_only = sorted(server_finished - client_finished)
        explained = [e for e in server_only if run_dir is not None and unrecorded_with_reason(run_dir / e)]
        return {
            "kills": killed,
            "attempts": attempts,
            "moments": moments,
            "final_rc": final_rc,
            "server_finished": len(server_finished),
            "client_finished": len(client_finished),
            "server_only": server_only,
            "server_only_explained": explained,
            "incomplete_left": sorted(chk.incomplete) if chk else [],
            "rewritten_finished": sorted(set(rewritten)),
            "stale_seen": sorted(stale_seen),
            "finishing_seen": sorted(finishing_seen),
            "videos_checked": chk.videos_checked if chk else 0,
            "problems": problems,
            "seconds": round(time.monotonic() - t_start, 1),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--tasks", default="testbed/all")
    ap.add_argument("--seed", type=int, default=1)
    # The job must outlast the kills whatever the machine's speed: a per-step latency sets its
    # floor (a quiet 2-core machine runs testbed/all's 32 expert episodes in ~60 s).
    ap.add_argument("--fault", default="latency=250ms,routes=step",
                    help="testbed fault spec (default: %(default)s; '' for none)")
    a = ap.parse_args(argv)
    r = run(a.kills, tasks=a.tasks, seed=a.seed, faults=a.fault or None)
    unexplained = sorted(set(r["server_only"]) - set(r["server_only_explained"]))
    ok = (not r["problems"] and not r["rewritten_finished"] and r["final_rc"] == 0
          and not unexplained and r["kills"] == a.kills)
    if r["kills"] < a.kills:
        print(f"the job ended after {r['kills']} of {a.kills} kills: a longer job (--fault latency) "
              "is needed for the rest", file=sys.stderr)
    print(f"### Client killed with SIGKILL: {r['kills']} kills, {a.tasks}, 2 workers in 2 processes\n")
    print(md_table(["figure", "value"], [
        ["kills (SIGKILL to the whole process group)", r["kills"]],
        ["kill moments", ", ".join(f"{k}: {v}" for k, v in sorted(r["moments"].items()))],
        ["gmp eval runs (same --run-id)", r["attempts"]],
        ["integrity problems found after any kill", len(r["problems"])],
        ["finished episodes rewritten by a later run", len(r["rewritten_finished"])],
        ["finished episodes seen with a stale INCOMPLETE after a kill (tidied by the next run)",
         len(r["stale_seen"])],
        ["episodes seen with their result saved and listed but the transcode cut short (finished by "
         "the next run)", len(r["finishing_seen"])],
        ["finished episodes client / server", f"{r['client_finished']} / {r['server_finished']}"],
        ["server-finished episodes not recorded, reason in INCOMPLETE", len(r["server_only_explained"])],
        ["server-finished episodes not recorded, no reason", len(unexplained)],
        ["videos decoded in the final check", r["videos_checked"]],
        ["final exit code", r["final_rc"]],
        ["wall time (s)", r["seconds"]],
        ["verdict", "PASS" if ok else "FAIL"],
    ]))
    for p in r["problems"][:20]:
        print(f"- {p}")
    if r["server_only"]:
        print("\nserver-finished, client-incomplete: " + ", ".join(r["server_only"][:20]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
