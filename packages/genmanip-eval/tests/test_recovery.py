"""A failed request never counts an action twice and never loses a finished episode.

Each test injects one fault at a chosen moment into a real testbed (``max_faults=1``) and checks
the server's per-attempt step counts against what the client recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval import EvalClient, GenmanipEvalError, StepError, ZeroPolicy
from genmanip_testbed import serve_testbed

NUM_STEPS = 6


def _rows(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()]


def _step_to(c: EvalClient, e: dict[str, Any], timestep: int) -> dict[str, Any]:
    pol = ZeroPolicy()
    while e["0"]["obs"]["timestep"] < timestep:
        e, _ = c.step(pol.get_action(e["0"]["obs"]))
    assert e["0"]["obs"]["timestep"] == timestep
    return e


def _finish(c: EvalClient, e: dict[str, Any]) -> None:
    pol = ZeroPolicy()
    while not c.done:
        e, _ = c.step(pol.get_action(e["0"]["obs"]))


def _assert_recorded(d: Path, steps: int) -> None:
    rows = _rows(d)
    assert [r["step"] for r in rows] == list(range(steps))
    assert json.loads((d / "result.json").read_text())["steps"] == steps
    assert not (d / "INCOMPLETE").exists()
    assert not list(d.glob(".*_result.*.json"))
    seeds = json.loads((d.parent / "episode_result.json").read_text())
    assert d.name in seeds


def _interrupt_then_hand_over(
    tb: Any, c: EvalClient, res: Path, monkeypatch: pytest.MonkeyPatch, parser: str,
    actions: Any, eid: str, reset_delay: float,
) -> None:
    """Ctrl-C arrives once the server has answered ``actions`` (the episode's end), before the
    client applies the reply (``parser`` raises); then ``close()``. A reset still under way
    (``reset_delay`` > 1 s) must leave the worker unkilled for the next client, which collects
    the result."""
    import genmanip_eval.stepping as stepping_mod  # (the step path's parsers live there)

    kills = tb.stats.requests.get("/kill", 0)
    tb.server.core.cfg.reset_delay = reset_delay

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(stepping_mod, parser, interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.step(actions)
    monkeypatch.undo()
    time.sleep(0.1)
    c.close()
    if reset_delay > 1:
        assert tb.stats.requests.get("/kill", 0) == kills  # left resetting, result held
        assert (res / eid / "INCOMPLETE").exists()
        tb.server.core.cfg.reset_delay = 0.01
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res)) as c2:
            c2.reset()
            assert [r.episode_id for r in c2.episode_results] == [eid]


def test_lost_reply_to_the_ending_step_is_collected_not_replayed(tmp_path: Path) -> None:
    res = tmp_path / "results"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv") as tb:
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res)) as c:
            e = _step_to(c, c.reset(), NUM_STEPS - 1)
            eid = e["0"]["obs"]["episode_id"]
            # The server runs the episode's last action, then the connection drops: no reply.
            tb.set_faults({"reset_after": 1.0, "routes": ["step"], "max_faults": 1})
            e, _ = c.step(ZeroPolicy().get_action(e["0"]["obs"]))
            assert tb.stats.snapshot()["faults"].get("reset_after") == 1
            assert c.stats["recoveries"] == 1 and c.stats["restarts"] == 0
            assert [r.episode_id for r in c.episode_results] == [eid]
            assert e["0"]["obs"]["reset"] is True and e["0"]["obs"]["episode_id"] != eid
            _finish(c, e)
        tb.wait_finalizes()
        attempts = tb.stats.snapshot()["steps_by_attempt"]
    assert attempts[eid] == [NUM_STEPS]
    _assert_recorded(res / eid, NUM_STEPS)


@pytest.mark.parametrize("reset_delay", [0.01, 3.0])
def test_ctrl_c_during_the_ending_step_records_the_episode_instead_of_killing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset_delay: float
) -> None:
    """Ctrl-C / SIGTERM after the server ran an episode's last action, before its reply was
    applied: close() asks the server before it kills anything. A finished reset hands over the
    result at once; one still under way leaves the worker to the next client, which collects it."""
    res = tmp_path / "results"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv",
                       reset_delay=0.01) as tb:
        c = EvalClient(tb.url, ["0"], record=True, results_dir=str(res))
        e = _step_to(c, c.reset(), NUM_STEPS - 1)
        eid = e["0"]["obs"]["episode_id"]
        _interrupt_then_hand_over(tb, c, res, monkeypatch, "parse_step_response",
                                  ZeroPolicy().get_action(e["0"]["obs"]), eid, reset_delay)
        assert tb.stats.steps_by_worker["0"] == NUM_STEPS
        tb.wait_finalizes()
        attempts = tb.stats.snapshot()["steps_by_attempt"]
    assert attempts[eid] == [NUM_STEPS]
    _assert_recorded(res / eid, NUM_STEPS)


def test_uncertain_mid_episode_step_restarts_the_episode(tmp_path: Path) -> None:
    res = tmp_path / "results"
    events: list[tuple[str, dict[str, Any]]] = []
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv") as tb:
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res),
                        on_event=lambda n, p: events.append((n, p))) as c:
            e = _step_to(c, c.reset(), 2)
            eid = e["0"]["obs"]["episode_id"]
            tb.set_faults({"reset_after": 1.0, "routes": ["step"], "max_faults": 1})
            e, _ = c.step(ZeroPolicy().get_action(e["0"]["obs"]))
            # Ran or not is unknowable from here: the episode starts over (same seed, re-queued).
            assert c.stats["restarts"] == 1
            assert e["0"]["obs"]["reset"] is True and e["0"]["obs"]["timestep"] == 0
            assert e["0"]["obs"]["episode_id"] == eid
            _finish(c, e)
        tb.wait_finalizes()
        attempts = tb.stats.snapshot()["steps_by_attempt"]
    assert attempts[eid] == [3, NUM_STEPS]
    _assert_recorded(res / eid, NUM_STEPS)
    restarted = [p for n, p in events if n == "episode_restarted"]
    assert len(restarted) == 1 and restarted[0]["episode_id"] == eid
    assert restarted[0]["reason"] == "the failed request may have run"


def test_lost_result_reply_is_reported_and_the_run_completes(tmp_path: Path) -> None:
    res = tmp_path / "results"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv") as tb:
        # poll_initial: the first poll comes after the background reset finished, so the reply
        # dropped below is the one carrying the result.
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res), poll_initial=2.0) as c:
            e = _step_to(c, c.reset(), NUM_STEPS - 1)
            eid = e["0"]["obs"]["episode_id"]
            tb.set_faults({"reset_after": 1.0, "routes": ["reset_result"], "max_faults": 1})
            e, _ = c.step(ZeroPolicy().get_action(e["0"]["obs"]))
            assert c.stats["restarts"] == 1
            _finish(c, e)
        tb.wait_finalizes()
        snap = tb.stats.snapshot()
    assert snap["episodes_finished"] == 2
    d = res / eid
    info = json.loads((d / "INCOMPLETE").read_text())
    assert "reply carrying its result was lost" in info["reason"]
    assert not (d / "result.json").exists() and not (d / ".frames").exists()
    seeds = json.loads((d.parent / "episode_result.json").read_text())
    assert d.name not in seeds and len(seeds) == 1


def test_lost_reply_to_the_ending_chunk_keeps_the_server_result(tmp_path: Path) -> None:
    res = tmp_path / "results"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv") as tb:
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res)) as c:
            e = _step_to(c, c.reset(), 3)
            eid = e["0"]["obs"]["episode_id"]
            tb.set_faults({"reset_after": 1.0, "routes": ["step_chunk"], "max_faults": 1})
            e, _ = c.step([ZeroPolicy().get_action(e["0"]["obs"])] * 4)  # runs 3 of 4, ends
            assert c.stats["recoveries"] == 1 and c.stats["restarts"] == 0
            _finish(c, e)
        tb.wait_finalizes()
        attempts = tb.stats.snapshot()["steps_by_attempt"]
    assert attempts[eid] == [NUM_STEPS]
    info = json.loads((res / eid / "INCOMPLETE").read_text())
    assert "how many of that chunk's actions ran is unknown" in info["reason"]
    assert info["server_result"]["score"] == pytest.approx(0.0, abs=1.0)
    assert "not counted as recorded" in info["server_note"]


def test_ctrl_c_during_the_ending_chunk_keeps_the_worker_for_the_server_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = tmp_path / "results"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv",
                       reset_delay=0.01) as tb:
        c = EvalClient(tb.url, ["0"], record=True, results_dir=str(res))
        e = _step_to(c, c.reset(), 3)
        eid = e["0"]["obs"]["episode_id"]
        _interrupt_then_hand_over(tb, c, res, monkeypatch, "parse_chunk_response",
                                  [ZeroPolicy().get_action(e["0"]["obs"])] * 4,  # runs 3 of 4, ends
                                  eid, 3.0)
        tb.wait_finalizes()
        attempts = tb.stats.snapshot()["steps_by_attempt"]
    assert attempts[eid] == [NUM_STEPS]
    info = json.loads((res / eid / "INCOMPLETE").read_text())
    assert "how many of that chunk's actions ran is unknown" in info["reason"]
    assert info["server_result"]["score"] == pytest.approx(0.0, abs=1.0)


def test_gives_up_after_max_recoveries_in_a_row(tmp_path: Path) -> None:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv") as tb:
        with EvalClient(tb.url, ["0"], max_recoveries=2) as c:
            e = c.reset()
            tb.set_faults({"error_rate": 1.0, "errors": "503", "routes": ["step"]})
            with pytest.raises(StepError, match="HTTP 503") as info:
                for _ in range(10):
                    e, _ = c.step(ZeroPolicy().get_action(e["0"]["obs"]))
            assert info.value.transient and c.stats["recoveries"] == 2 and c.stats["restarts"] == 2
            assert info.value.hint is not None
            assert "worker(s) 0 failed 2 times in a row" in info.value.hint
            assert "same run id" in info.value.hint


_DIE_AFTER_ENDING = """
import sys
from genmanip_eval import EvalClient, ZeroPolicy
c = EvalClient(sys.argv[1], ["0"], record=True, results_dir=sys.argv[2])
e = c.reset()
while True:
    e, _ = c.step(ZeroPolicy().get_action(e["0"]["obs"]))
"""


def _kill_while_awaiting(tb: Any, res: Path) -> str:
    """Run a recording client in a subprocess and SIGKILL it while it waits for its first
    episode's result (the testbed's resets take 3 s); return that episode's id."""
    proc = subprocess.Popen([sys.executable, "-c", _DIE_AFTER_ENDING, tb.url, str(res)],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        done: list[str] = []
        while time.monotonic() < deadline and not done:
            done = [k for k, v in tb.stats.snapshot()["steps_by_attempt"].items() if v == [NUM_STEPS]]
            assert proc.poll() is None
            time.sleep(0.05)
        assert done, "the first episode never ended"
        time.sleep(1.0)  # the episode's last row and its marker reach the disk
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    d = res / done[0]
    assert (d / "INCOMPLETE").exists() and list(d.glob(".awaiting_result.*.json"))
    return done[0]


def test_resumed_client_collects_the_result_a_killed_one_was_waiting_for(tmp_path: Path) -> None:
    res = tmp_path / "results"
    # Slow background resets: the killed client is waiting for its result when it dies.
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv",
                       reset_delay=3.0) as tb:
        eid = _kill_while_awaiting(tb, res)
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res)) as c:
            e = c.reset()
            assert c.stats["adopted"] == 1 and [r.episode_id for r in c.episode_results] == [eid]
            _finish(c, e)
        tb.wait_finalizes()
        snap = tb.stats.snapshot()
    assert snap["steps_by_attempt"][eid] == [NUM_STEPS] and snap["kills"] == 0
    d = res / eid
    _assert_recorded(d, NUM_STEPS)
    assert len(json.loads((d.parent / "episode_result.json").read_text())) == 2


def test_a_result_gone_from_the_server_is_reported_not_waited_for(tmp_path: Path) -> None:
    res = tmp_path / "results"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv",
                       reset_delay=3.0) as tb:
        eid = _kill_while_awaiting(tb, res)
        # Another client takes the stored result (what a reply lost on its way amounts to).
        with EvalClient(tb.url, ["0"], kill_on_close=False) as other:
            other.reset()
            assert [r.episode_id for r in other.episode_results] == [eid]
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res)) as c:
            _finish(c, c.reset())
            assert c.stats["adopted"] == 0
        tb.wait_finalizes()
        assert tb.stats.snapshot()["episodes_finished"] == 2
    d = res / eid
    info = json.loads((d / "INCOMPLETE").read_text())
    assert "reply carrying its result was lost" in info["reason"]
    assert not list(d.glob(".awaiting_result.*")) and not (d / ".frames").exists()
    assert d.name not in json.loads((d.parent / "episode_result.json").read_text())



# ============================================================== a server that lost its workers ====
# A restart is emulated in-process: the testbed is shut down and a new one serves the same port,
# results tree and run id (what a restarted server is: the run on disk, no worker, no memory of
# the old process). tests/reliability/test_server_restart.py does it with SIGKILLed processes.


class _Restartable:
    """A testbed that can be stopped and started again on the same port and results tree."""

    def __init__(self, root: Path, **kw: Any) -> None:
        self.kw: dict[str, Any] = {"tasks": ("testbed/smoke",), "num_steps": NUM_STEPS, "run_id": "rs",
                                   "results_root": root, "reset_delay": 0.01, **kw}
        self._cm: Any = None
        self.tb: Any = None
        self.port = 0
        self.snapshots: list[dict[str, Any]] = []

    def start(self, **kw: Any) -> Any:
        cm = serve_testbed(port=self.port, **{**self.kw, **kw})
        self.tb = cm.__enter__()
        self._cm, self.port = cm, self.tb.port
        if self.snapshots:
            # The old process's seed locks block for 300 s on the real server; not here.
            self.tb.server.core.cfg.lock_stale_s = 0.5
        return self.tb

    def stop(self) -> None:
        if self._cm is not None:
            self.tb.wait_finalizes()
            self.snapshots.append(self.tb.stats.snapshot())
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)

    def __enter__(self) -> _Restartable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait(cond: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test thread
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize(("down", "chunk"), [(0.0, False), (1.0, False), (0.0, True)])
def test_restart_between_requests_recreates_the_workers(tmp_path: Path, down: float, chunk: bool) -> None:
    """The server restarts while the client is between requests. Back at once: the next /step
    meets ``KeyError: '0'`` (/step_chunk: a bare 500), the real answer for an unknown worker, not a
    faulty request. Down for a second: nothing can be sent; the client waits, then finds via
    /status that the new process lost its workers. Either way the episode restarts from its first
    step on a re-created worker, nothing is resent, and the job completes."""
    res = tmp_path / "results"
    events: list[tuple[str, dict[str, Any]]] = []
    with _Restartable(tmp_path / "srv") as srv:
        srv.start()
        with EvalClient(srv.tb.url, ["0"], record=True, results_dir=str(res),
                        on_event=lambda n, p: events.append((n, p))) as c:
            e = _step_to(c, c.reset(), 2)
            eid = e["0"]["obs"]["episode_id"]
            act = ZeroPolicy().get_action(e["0"]["obs"])
            srv.stop()
            if down:
                t, out = _in_thread(lambda: c.step(act))
                time.sleep(down)
                srv.start()
                t.join(60)
                assert out and not isinstance(out[0], BaseException), out
                e = out[0][0]
            else:
                srv.start()
                e, _ = c.step([act] * 2 if chunk else act)
            assert c.stats["recoveries"] == 1 and c.stats["restarts"] == 1
            assert e["0"]["obs"]["reset"] is True and e["0"]["obs"]["timestep"] == 0
            _finish(c, e)
        srv.stop()
    old, new = srv.snapshots
    assert old["steps_by_attempt"][eid] == [2]  # ran on the old process, died with it
    assert new["steps_by_attempt"][eid] == [NUM_STEPS]  # served again from its first step
    assert sorted(new["steps_by_attempt"].values()) == [[NUM_STEPS], [NUM_STEPS]]
    for ep in new["steps_by_attempt"]:
        _assert_recorded(res / ep, NUM_STEPS)
    restarted = [p for n, p in events if n == "episode_restarted"]
    assert [p["episode_id"] for p in restarted] == [eid]
    assert "the server lost the worker" in restarted[0]["reason"]


def test_restart_while_waiting_for_a_result_marks_it_lost(tmp_path: Path) -> None:
    """The server restarts after ending an episode, before handing out its result: the new process
    has no pending reset ("no pending reset result" to a poll of a resetting worker) and the old
    one's result died with it. The new server keeps the score (result_info.json) and never serves
    the seed again: the recording is INCOMPLETE with that reason, the run goes on."""
    res = tmp_path / "results"
    with _Restartable(tmp_path / "srv") as srv:
        old = srv.start(reset_delay=3.0)  # the result waits in the old process's memory
        with EvalClient(old.url, ["0"], record=True, results_dir=str(res)) as c:
            e = _step_to(c, c.reset(), NUM_STEPS - 1)
            eid = e["0"]["obs"]["episode_id"]
            polls = old.stats.requests.get("/reset_result", 0)
            t, out = _in_thread(lambda: c.step(ZeroPolicy().get_action(e["0"]["obs"])))
            _wait(lambda: old.stats.episodes_finished == 1
                  and old.stats.requests.get("/reset_result", 0) > polls)  # the client is polling
            srv.stop()
            srv.start()
            t.join(60)
            assert out and not isinstance(out[0], BaseException), out
            e = out[0][0]
            assert c.stats["recoveries"] == 1
            assert e["0"]["obs"]["episode_id"] != eid and e["0"]["obs"]["timestep"] == 0
            _finish(c, e)
        srv.stop()
    old_snap, new_snap = srv.snapshots
    assert old_snap["steps_by_attempt"][eid] == [NUM_STEPS] and eid not in new_snap["steps_by_attempt"]
    d = res / eid
    info = json.loads((d / "INCOMPLETE").read_text())
    assert "server restarted before handing out this episode's result" in info["reason"]
    assert not (d / "result.json").exists() and d.name not in json.loads(
        (d.parent / "episode_result.json").read_text())
    (other,) = new_snap["steps_by_attempt"]
    _assert_recorded(res / other, NUM_STEPS)


def test_restarted_server_without_a_job_is_waited_for_then_reattached(tmp_path: Path) -> None:
    """A real server restarts idle. The client says so and waits; once the run is submitted again
    with the same run id, it re-creates its workers and restarts the episode."""
    res = tmp_path / "results"
    with _Restartable(tmp_path / "srv") as srv:
        srv.start()
        with EvalClient(srv.tb.url, ["0"], run_id="rs", record=True, results_dir=str(res)) as c:
            e = _step_to(c, c.reset(), 2)
            act = ZeroPolicy().get_action(e["0"]["obs"])
            srv.stop()
            new = srv.start(job=False)
            t, out = _in_thread(lambda: c.step(act))
            _wait(lambda: new.stats.requests.get("/status", 0) >= 2)  # the client waits for a job
            assert t.is_alive()
            with EvalClient(new.url, ["9"], kill_on_close=False) as submitter:
                submitter._json_call("/start_new_job", {"data": {"config_path": ["testbed/smoke"],
                                                                 "run_id": "rs"}},
                                     timeout_key="start_new_job", retry=False)
            t.join(60)
            assert out and not isinstance(out[0], BaseException), out
            e = out[0][0]
            assert c.stats["restarts"] == 1 and e["0"]["obs"]["reset"] is True
            _finish(c, e)
        srv.stop()
    for ep in srv.snapshots[-1]["steps_by_attempt"]:
        _assert_recorded(res / ep, NUM_STEPS)


def test_restarted_server_with_another_run_or_no_job_is_a_clear_error(tmp_path: Path) -> None:
    with _Restartable(tmp_path / "srv") as srv:
        srv.start()
        with EvalClient(srv.tb.url, ["0"], timeouts={"reset_deadline": 1.5}) as c:
            e = _step_to(c, c.reset(), 1)
            act = ZeroPolicy().get_action(e["0"]["obs"])
            srv.stop()
            srv.start(run_id="another")  # its episodes would be recorded as this run's
            with pytest.raises(GenmanipEvalError, match="not mixing runs") as info:
                c.step(act)
            assert info.value.hint is not None and "--run-id" in info.value.hint
    with _Restartable(tmp_path / "srv2") as srv:
        srv.start()
        with EvalClient(srv.tb.url, ["0"], run_id="rs", timeouts={"reset_deadline": 1.5}) as c:
            e = _step_to(c, c.reset(), 1)
            act = ZeroPolicy().get_action(e["0"]["obs"])
            srv.stop()
            srv.start(job=False)  # and nobody submits the run again
            with pytest.raises(GenmanipEvalError, match="has had no job") as info:
                c.step(act)
            assert info.value.hint is not None and "gmp submit CONFIG... --run-id rs" in info.value.hint
