"""Item 1 (fast subset): a 4-worker, 2-process job against a testbed injecting 10% 500/503/504
replies and connection resets before/after the work. The long run (several seeds, the whole task
set, and re-runs until complete) is ``python bench/reliability/server_faults.py``."""

from __future__ import annotations

import pytest
import server_faults

pytestmark = pytest.mark.slow

TEN_PERCENT = "error_rate=0.06,errors=500|503|504,reset_before=0.02,reset_after=0.02"


@pytest.mark.parametrize("seed", [3])
def test_faulty_server_run_stops_precisely_and_never_replays_a_step(seed: int) -> None:
    r = server_faults.run_one(seed, fault=TEN_PERCENT, max_attempts=1)
    assert r["faults"] >= 1, "the fault injection did not fire"
    assert r["problems"] == [], r["problems"]
    if r["rc"] != 0:
        # a precise error: the call, the status or the dropped connection, and the consequence
        assert r["error"] and ("POST /" in r["error"] or "GET /" in r["error"]), r["stderr_tail"]
        assert "may have been applied" in r["error"] or "failed" in r["error"]
    # every action the client recorded was executed exactly once on the server
    assert r["client_rows"] <= r["server_steps"]


def test_rerunning_after_faults_completes_the_job_without_replays() -> None:
    r = server_faults.run_one(5, tasks="testbed/smoke", workers=2, processes=2,
                              fault="error_rate=0.04,errors=500|503|504,reset_before=0.02,reset_after=0.02",
                              max_attempts=40)
    assert r["rc"] == 0, r["errors"]
    assert r["problems"] == [], r["problems"]
    assert r["client_finished"] >= 1
