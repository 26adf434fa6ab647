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
import time
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval import EvalClient, StepError, ZeroPolicy
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
    import genmanip_eval.client as client_mod

    kills = tb.stats.requests.get("/kill", 0)
    tb.server.core.cfg.reset_delay = reset_delay

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(client_mod, parser, interrupted)
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
