"""Item 5 (fast subset): slow and stalled servers. Per-call timeouts name the call and the limit
and fire at the limit; reset_result polling stops at its deadline; SIGINT during a wait exits 130
promptly without a traceback. The long run is ``python bench/reliability/slow_server.py``."""

from __future__ import annotations

import pytest
import slow_server

pytestmark = pytest.mark.slow


def test_step_timeout_names_the_call_and_the_limit() -> None:
    r = slow_server.step_timeout_case(0.5, latency=3.0)
    assert r["raised"] == "StepTimeout"
    assert "POST /step" in r["message"] and "0.5 s" in r["message"]
    assert 0.45 <= r["elapsed"] < 1.5


def test_reset_result_polling_respects_its_deadline() -> None:
    r = slow_server.reset_deadline_case(1.5)
    assert r["raised"] == "ResetTimeout"
    assert "1.5 s" in r["message"] and "/reset_result" in r["message"]
    assert 1.4 <= r["elapsed"] < 3.0


@pytest.mark.parametrize(("wait", "processes"), [("slow-step", 1), ("stalled-reset", 2), ("no-answer", 1)])
def test_ctrl_c_during_a_wait_exits_promptly_and_cleanly(wait: str, processes: int) -> None:
    r = slow_server.sigint_case(wait, processes)
    assert r["was_waiting"], r["stderr_tail"]
    assert r["rc"] == 130, r["stderr_tail"]
    # (a child blocked in the wait is stopped by SIGTERM after a 0.25 s grace: ~0.6 s in all)
    assert r["exit_s"] < 2.0
    assert not r["traceback"], r["stderr_tail"]


def test_ctrl_c_while_gmp_starts_never_shows_a_traceback() -> None:
    # The signals spread over the whole start-up as long as it takes on this machine now
    # (interpreter start-up, importing gmp and the eval handler, connecting): ~0.6 s when quiet,
    # several times that under load, when fixed delays all landed in the interpreter's start-up.
    window = slow_server.startup_duration() * 1.2  # (and a little of the connecting)
    interrupted = 0
    for i in range(12):
        r = slow_server.startup_sigint_case(i * window / 12)
        assert not r["traceback"], r["stderr_tail"]
        if not r["python_startup"]:
            # -2: before Python installed its SIGINT handler; 6 (connection refused): the signal
            # came after the run had already failed
            assert r["rc"] in (130, -2, 6), r
            interrupted += r["rc"] == 130 and "gmp: interrupted" in r["stderr_tail"]
    # (not vacuous: most of the window is gmp's own start-up, even on a loaded machine)
    assert interrupted >= 3


def test_sigterm_to_the_process_group_stops_cleanly_and_loses_nothing() -> None:
    # What a batch scheduler (or `timeout`) does to a recording multi-process run.
    r = slow_server.sigterm_group_case(after_steps=40)
    assert r["was_running"], r["stderr_tail"]
    assert r["rc"] == 143 and r["terminated"], r["stderr_tail"]
    assert not r["traceback"] and not r["leaked"], r["stderr_tail"]
    assert not r["left"]
    assert r["exit_s"] < 5.0
    assert r["problems"] == []
    assert r["rerun_rc"] == 0, r["rerun_tail"]
    assert r["final_problems"] == [] and r["finished"] + r["final_incomplete"] == 16
    # Nothing lost silently: the only episodes the re-run may not finish are those whose result
    # was in a /reset_result reply the signal cut short (the server hands a result out once): at
    # most one per worker, each saying so.
    assert r["final_incomplete"] <= 4 and all(r["incomplete_reasons"].values()), r["incomplete_reasons"]
