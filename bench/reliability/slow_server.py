"""Item 5: slow and stalled servers.

* per-call timeouts: a testbed delaying every ``/step`` by ``latency``; ``EvalClient`` with a step
  limit below it must raise ``StepTimeout`` naming the call and the limit, close to the limit;
* ``reset_result`` polling: a testbed whose resets never finish (``stall_reset``); ``reset()`` must
  raise ``ResetTimeout`` naming the workers and the deadline, close to the deadline;
* Ctrl-C: ``gmp eval`` (1 and 2 processes) receives SIGINT while it waits on a slow ``/step``, on a
  stalled reset, and on a server that accepts connections but never answers; it must exit 130
  promptly with no traceback;
* SIGTERM (what a batch scheduler sends) to the whole process group of a recording ``gmp eval
  --processes 2``: exit 143 (``gmp: terminated``) promptly, no traceback, no process left, the
  results tree intact, and the same run id finishes the job (an episode it cannot finish carries
  INCOMPLETE with the reason).

Usage: python bench/reliability/slow_server.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table
from checks import check_run, find_run_dir, python_env


def step_timeout_case(limit: float = 0.5, latency: float = 3.0) -> dict[str, Any]:
    from genmanip_eval import EvalClient
    from genmanip_eval.errors import StepTimeout
    from genmanip_eval.policy import ZeroPolicy
    from genmanip_testbed import serve_testbed

    with serve_testbed(tasks="testbed/smoke", faults=f"latency={latency}s,routes=step") as tb:
        # max_recoveries=0: the timeout itself is measured (with recovery on, the client would
        # restart the episode and go on; tests/test_recovery.py covers that).
        client = EvalClient(tb.url, ["0"], timeouts={"step": limit}, max_recoveries=0)
        try:
            entries = client.reset()
            act = ZeroPolicy().get_action(entries["0"]["obs"])
            t0 = time.monotonic()
            err: BaseException | None = None
            try:
                client.step({"0": act})
            except StepTimeout as exc:
                err = exc
            elapsed = time.monotonic() - t0
        finally:
            client.close()
    return {"limit": limit, "latency": latency, "raised": type(err).__name__ if err else None,
            "message": str(err) if err else "", "elapsed": round(elapsed, 2)}


def reset_deadline_case(deadline: float = 1.5) -> dict[str, Any]:
    from genmanip_eval import EvalClient
    from genmanip_eval.errors import ResetTimeout
    from genmanip_testbed import serve_testbed

    with serve_testbed(tasks="testbed/smoke", faults="stall_reset=5") as tb:
        client = EvalClient(tb.url, ["0"], timeouts={"reset_deadline": deadline})
        t0 = time.monotonic()
        err: BaseException | None = None
        try:
            client.reset()
        except ResetTimeout as exc:
            err = exc
        elapsed = time.monotonic() - t0
        client.close()
    return {"deadline": deadline, "raised": type(err).__name__ if err else None,
            "message": str(err) if err else "", "elapsed": round(elapsed, 2)}


class _Blackhole:
    """A TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


@contextlib.contextmanager
def _children_start_with_default_sigint() -> Iterator[None]:
    """An interactive shell starts commands with SIGINT at its default; a test runner or a CI job
    started with ``&`` may ignore it, and an ignored signal stays ignored across exec (Ctrl-C
    would be a no-op in gmp). A handled one is reset to the default by exec: handle it here
    meanwhile. (An earlier Python wrapper that reset it and exec'ed gmp was itself interruptible
    while importing ``signal``: its tracebacks were counted against gmp.)"""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _gmp(*args: str) -> subprocess.Popen[bytes]:
    """``gmp`` (``python -m genmanip``) with ``args``, SIGINT at its default, stderr piped."""
    with _children_start_with_default_sigint():
        return subprocess.Popen(
            [sys.executable, "-m", "genmanip", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=python_env())


def _waiting(wait: str, tb: Any, hole: _Blackhole | None) -> bool:
    """True once the client is inside the wait under test (seen from the server side)."""
    if hole is not None:
        return bool(hole.conns)
    route = "/step" if wait == "slow-step" else "/reset_result"
    return bool(tb.stats.requests.get(route, 0))


def sigint_case(wait: str, processes: int = 1, after: float = 0.5) -> dict[str, Any]:
    """SIGINT to ``gmp eval`` while it waits on ``wait``: slow-step | stalled-reset | no-answer."""
    from genmanip_testbed import serve_testbed

    faults = {"slow-step": "latency=60s,routes=step", "stalled-reset": "stall_reset=5", "no-answer": None}[wait]
    hole = _Blackhole() if wait == "no-answer" else None
    ctx = serve_testbed(tasks="testbed/smoke", faults=faults) if hole is None else None
    tb = ctx.__enter__() if ctx is not None else None
    try:
        url = hole.url if hole is not None else tb.url  # type: ignore[union-attr]
        proc = _gmp("eval", "--url", url, "--policy", "zero", "--no-record", "--worker-ids", "0,1",
                    "--processes", str(processes))
        # SIGINT only once the client is in the wait (on a loaded machine start-up alone can take
        # seconds), then a little later so it is blocked in it
        limit = time.monotonic() + 120
        while not _waiting(wait, tb, hole) and proc.poll() is None and time.monotonic() < limit:
            time.sleep(0.05)
        time.sleep(after)
        still_running = proc.poll() is None and _waiting(wait, tb, hole)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            _, err_b = proc.communicate(timeout=30)
            elapsed = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err_b = proc.communicate()
            elapsed = float("inf")
        err = err_b.decode("utf-8", "replace")
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if hole is not None:
            hole.close()
    return {"wait": wait, "processes": processes, "was_waiting": still_running, "rc": proc.returncode,
            "exit_s": round(elapsed, 2), "traceback": "Traceback" in err, "stderr_tail": err[-400:]}


def sigterm_group_case(after_steps: int = 40) -> dict[str, Any]:
    """SIGTERM to the process group of a recording ``gmp eval --processes 2`` once the server has
    applied ``after_steps`` actions; then ``gmp eval`` again with the same run id."""
    import os
    import tempfile

    from genmanip_testbed import serve_testbed

    with tempfile.TemporaryDirectory(prefix="gmp-sigterm-") as tmp, \
            serve_testbed(tasks="testbed/reach") as tb:
        results = Path(tmp) / "results"
        args = ["eval", "--url", tb.url, "--policy", "expert", "--worker-ids", "0,1,2,3",
                "--processes", "2", "--results-dir", str(results), "--run-id", "term"]
        with _children_start_with_default_sigint():
            proc = subprocess.Popen([sys.executable, "-m", "genmanip", *args], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=python_env(), start_new_session=True)
        limit = time.monotonic() + 120
        while tb.stats.requests.get("/step", 0) < after_steps and proc.poll() is None \
                and time.monotonic() < limit:
            time.sleep(0.02)
        running = proc.poll() is None
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        _, err_b = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
        left = True  # some process of the group is still alive (a worker, ffmpeg, a tracker)
        gone_by = time.monotonic() + 5.0
        while left and time.monotonic() < gone_by:
            try:
                os.killpg(proc.pid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                left = False
        err = err_b.decode("utf-8", "replace")
        run_dir = find_run_dir(results)
        chk = check_run(run_dir) if run_dir else None
        again = subprocess.run([sys.executable, "-m", "genmanip", *args], capture_output=True, text=True,
                               env=python_env(), timeout=300, check=False)
        final = check_run(run_dir) if run_dir else None
        reasons = {}
        for eid, d in (final.incomplete.items() if final else ()):
            try:
                reasons[eid] = str(json.loads((d / "INCOMPLETE").read_text()).get("reason") or "")
            except (OSError, ValueError, AttributeError):
                reasons[eid] = ""
    return {
        "incomplete_reasons": reasons,
        "was_running": running, "rc": proc.returncode, "exit_s": round(elapsed, 2),
        "terminated": "gmp: terminated" in err, "traceback": "Traceback" in err,
        "leaked": "leaked" in err, "left": left, "stderr_tail": err[-600:],
        "problems": (chk.problems if chk else ["no run directory"]),
        "rerun_rc": again.returncode, "rerun_tail": again.stderr[-600:],
        "final_problems": (final.problems if final else ["no run directory"]),
        "final_incomplete": len(final.incomplete) if final else -1,
        "finished": len(final.finished) if final else 0,
    }


def startup_duration() -> float:
    """Seconds from exec to the first connection of the ``gmp eval`` of
    :func:`startup_sigint_case` (interpreter start-up, importing gmp and the eval handler): the
    window a start-up SIGINT lands in, on this machine as loaded as it is now."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(60)
        t0 = time.perf_counter()
        proc = _gmp("eval", "--url", f"http://127.0.0.1:{srv.getsockname()[1]}", "--policy", "zero",
                    "--no-record")
        try:
            conn, _ = srv.accept()
            took = time.perf_counter() - t0
            conn.close()
        finally:
            proc.kill()
            proc.communicate(timeout=30)
    return took


def startup_sigint_case(delay: float) -> dict[str, Any]:
    """SIGINT ``delay`` seconds after ``gmp eval`` was exec'ed: while Python starts, imports gmp and
    its handler, connects. Python's own handler is installed a few ms into start-up; before that a
    SIGINT simply ends the process (-2), after it gmp must say ``gmp: interrupted`` (130)."""
    proc = _gmp("eval", "--url", "http://127.0.0.1:9", "--policy", "zero", "--no-record")
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err_b = proc.communicate(timeout=30)
    err = err_b.decode("utf-8", "replace")
    # A SIGINT before gmp's entry point runs (the interpreter's ``site`` processing .pth files,
    # ``runpy``, importing the two tiny modules that hold the entry point) gets Python's
    # traceback whatever the program: counted apart. gmp's frames start at ``console_main``.
    in_python = "Traceback" in err and ", in console_main" not in err
    return {"delay": delay, "rc": proc.returncode, "traceback": "Traceback" in err and not in_python,
            "python_startup": in_python, "stderr_tail": err[-400:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    bad = 0
    rows = []
    for limit in (0.3, 1.0):
        for _ in range(a.repeats):
            r = step_timeout_case(limit, latency=limit + 2.5)
            ok = r["raised"] == "StepTimeout" and f"{limit:g} s" in r["message"] and r["elapsed"] < limit + 1.0
            bad += not ok
            rows.append([f"/step limit {limit} s (server +{limit + 2.5} s)", r["raised"], r["elapsed"],
                         r["message"][:110].replace("|", "/"), "ok" if ok else "FAIL"])
    for deadline in (1.0, 2.0):
        for _ in range(a.repeats):
            r = reset_deadline_case(deadline)
            ok = r["raised"] == "ResetTimeout" and r["elapsed"] < deadline + 1.5
            bad += not ok
            rows.append([f"reset_deadline {deadline} s (stalled reset)", r["raised"], r["elapsed"],
                         r["message"][:110].replace("|", "/"), "ok" if ok else "FAIL"])
    print("### Timeouts\n")
    print(md_table(["case", "raised", "s to raise", "message", "verdict"], rows))
    rows = []
    for wait in ("slow-step", "stalled-reset", "no-answer"):
        for processes in (1, 2):
            for _ in range(a.repeats):
                r = sigint_case(wait, processes)
                ok = r["was_waiting"] and r["rc"] == 130 and r["exit_s"] < 2 and not r["traceback"]
                bad += not ok
                rows.append([wait, processes, r["rc"], r["exit_s"], "yes" if r["traceback"] else "no",
                             "ok" if ok else "FAIL"])
    rnd = random.Random(1)
    starts = [startup_sigint_case(rnd.uniform(0.0, 0.6)) for _ in range(10 * a.repeats)]
    codes = sorted({r["rc"] for r in starts})
    tracebacks = sum(r["traceback"] for r in starts)
    in_python = sum(r["python_startup"] for r in starts)
    ok = tracebacks == 0
    bad += not ok
    for r in starts:
        if r["traceback"]:
            print(f"start-up SIGINT after {r['delay']:.3f} s, exit {r['rc']}:\n{r['stderr_tail']}", file=sys.stderr)
    rows.append(["start-up (0-0.6 s after exec)", f"1 ({len(starts)} times)", "/".join(map(str, codes)),
                 "-", f"{tracebacks} of {len(starts)} (+{in_python} before gmp's entry point ran)",
                 "ok" if ok else "FAIL"])
    print("\n### Ctrl-C (SIGINT) while waiting\n")
    print(md_table(["waiting on", "processes", "exit code", "s from SIGINT to exit", "traceback", "verdict"],
                   rows))
    rows = []
    for i in range(3 * a.repeats):
        after = 10 + 30 * i  # spread over the 16-episode job
        r = sigterm_group_case(after_steps=after)
        ok = (r["was_running"] and r["rc"] == 143 and r["terminated"] and not r["traceback"]
              and not r["leaked"] and not r["left"] and r["exit_s"] < 5 and not r["problems"]
              and r["rerun_rc"] == 0 and not r["final_problems"] and r["finished"] + r["final_incomplete"] == 16
              and all(r["incomplete_reasons"].values()))
        bad += not ok
        rows.append([after, r["rc"], r["exit_s"], "yes" if r["traceback"] else "no",
                     "yes" if r["left"] else "no", len(r["problems"]), r["rerun_rc"],
                     f"{r['finished']}/16", r["final_incomplete"],
                     "; ".join(sorted(set(r["incomplete_reasons"].values()))) or "-", "ok" if ok else "FAIL"])
    print("\n### SIGTERM to the process group of a recording `gmp eval --processes 2`, then the same run id\n")
    print(md_table(["after server steps", "exit code", "s to exit", "traceback", "process left",
                    "tree problems", "re-run exit", "finished after re-run", "incomplete", "why", "verdict"], rows))
    print(f"\nverdict: {'PASS' if not bad else 'FAIL'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
