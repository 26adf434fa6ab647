"""EvalClient.interrupt(): from any thread, the request or wait in progress ends at once
(``Interrupted``), with a Ctrl-C's bookkeeping; close() then settles the unanswered workers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval import EvalClient, Interrupted, ZeroPolicy
from genmanip_runtime.testing import silent_server as _silent_server
from genmanip_testbed import serve_testbed

NUM_STEPS = 6


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    with _silent_server() as url:
        yield url


def _run(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _interrupt_after(c: EvalClient, delay: float) -> dict[str, float]:
    at: dict[str, float] = {}

    def fire() -> None:
        at["t"] = time.monotonic()
        c.interrupt()

    threading.Timer(delay, fire).start()
    return at


def test_interrupt_releases_a_request_to_a_server_that_never_answers(silent_server: str) -> None:
    c = EvalClient(silent_server, ["0"], codec="legacy", timeouts={"docs": 30.0, "status": 30.0})
    t, out = _run(c.connect)
    time.sleep(0.3)
    t0 = time.monotonic()
    c.interrupt()
    c.interrupt()  # idempotent
    t.join(1.0)
    assert not t.is_alive() and time.monotonic() - t0 < 1.0
    assert isinstance(out["error"], Interrupted) and isinstance(out["error"], KeyboardInterrupt)
    # Every later request is refused at once.
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        c.status()
    assert time.monotonic() - t0 < 0.5
    t0 = time.monotonic()
    c.close()  # nothing started: nothing to kill
    assert time.monotonic() - t0 < 1.0


def test_interrupt_wakes_a_reset_result_polling_wait(tmp_path: Path) -> None:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv",
                       reset_delay=30.0) as tb:
        c = EvalClient(tb.url, ["0"])
        at = _interrupt_after(c, 0.5)
        with pytest.raises(Interrupted):
            c.reset()
        assert time.monotonic() - at["t"] < 0.5
        kills = tb.stats.requests.get("/kill", 0)
        t0 = time.monotonic()
        c.close()  # the interrupt is cleared first: close() kills the resetting worker
        assert time.monotonic() - t0 < 5.0
        assert tb.stats.requests.get("/kill", 0) == kills + 1


def test_interrupt_mid_step_counts_nothing_twice_and_close_settles_the_worker(
    tmp_path: Path,
) -> None:
    res = tmp_path / "results"
    pol = ZeroPolicy()
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv") as tb:
        c = EvalClient(tb.url, ["0"], record=True, results_dir=str(res))
        e = c.reset()
        e, _ = c.step(pol.get_action(e["0"]["obs"]))
        eid = e["0"]["obs"]["episode_id"]
        # The next /step waits 3 s in the server before it runs: interrupted meanwhile.
        tb.set_faults({"latency": 3.0, "routes": ["step"]})
        at = _interrupt_after(c, 0.3)
        with pytest.raises(Interrupted):
            c.step(pol.get_action(e["0"]["obs"]))
        assert time.monotonic() - at["t"] < 0.5
        assert c.stats["executed_steps"] == {"0": 1}  # the unanswered step is not counted
        assert c._state["0"].in_flight is not None  # kept for close()
        tb.set_faults(None)
        kills = tb.stats.requests.get("/kill", 0)
        probes = tb.stats.requests.get("/reset_result", 0)
        t0 = time.monotonic()
        c.close()
        assert time.monotonic() - t0 < 5.0
        # close() asked the server (the step had not ended the episode) and killed the worker.
        assert tb.stats.requests.get("/reset_result", 0) == probes + 1
        assert tb.stats.requests.get("/kill", 0) == kills + 1
        assert c.stats["executed_steps"] == {"0": 1}
        assert (res / eid / "INCOMPLETE").exists() and not (res / eid / "result.json").exists()
        # A new client does the job; the interrupted attempt counts for nothing.
        time.sleep(3.2)  # (the delayed step lands on the killed worker meanwhile)
        with EvalClient(tb.url, ["0"], record=True, results_dir=str(res)) as c2:
            e = c2.reset()
            while not c2.done:
                e, _ = c2.step(pol.get_action(e["0"]["obs"]))
        tb.wait_finalizes()
        attempts = tb.stats.snapshot()["steps_by_attempt"]
    assert attempts[eid][-1] == NUM_STEPS
    rows = [json.loads(x) for x in (res / eid / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(NUM_STEPS))
    assert json.loads((res / eid / "result.json").read_text())["steps"] == NUM_STEPS
