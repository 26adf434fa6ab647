"""Item 1 (fast subset): a 4-worker, 2-process job against a testbed injecting 10% 500/503/504
replies and connection resets before/after the work. The long run (several seeds, the whole task
set, and stop-and-resume until complete) is ``python bench/reliability/server_faults.py``."""

from __future__ import annotations

import pytest
import server_faults

pytestmark = pytest.mark.slow

TEN_PERCENT = "error_rate=0.06,errors=500|503|504,reset_before=0.02,reset_after=0.02"


@pytest.mark.parametrize("seed", [3])
def test_faulty_server_run_recovers_and_never_replays_a_step(seed: int) -> None:
    r = server_faults.run_one(seed, fault=TEN_PERCENT, max_attempts=1, max_recoveries=5)
    assert r["faults"] >= 3, "the fault injection did not fire"
    # the job completes despite the faults, each failed request resolved in the run
    assert r["rc"] == 0, r["stderr_tail"]
    assert r["recovered"] >= 1
    # every finished episode's steps.jsonl has exactly the actions of the attempt the server
    # scored, every server-finished episode is recorded (or says why not), nothing else is
    assert r["problems"] == [], r["problems"]
    assert r["exact_compared"] == r["client_finished"] >= 1
    assert r["client_finished"] + r["lost_with_reason"] == r["server_finished"]


def test_stopping_at_each_failure_and_resuming_completes_the_job() -> None:
    r = server_faults.run_one(5, tasks="testbed/smoke", workers=2, processes=2,
                              fault="error_rate=0.04,errors=500|503|504,reset_before=0.02,reset_after=0.02",
                              max_attempts=40, max_recoveries=0)
    assert r["rc"] == 0, r["errors"]
    assert r["attempts"] > 1, "no failure stopped a run: the resume path was not exercised"
    assert r["problems"] == [], r["problems"]
    assert r["client_finished"] + r["lost_with_reason"] == r["server_finished"] == 2
