"""The asynchronous runner (the default): lanes per worker, one policy call per batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval import EvalConfig, PolicyError, run_eval
from genmanip_testbed import serve_testbed


def _outcomes(summary: Any) -> set[tuple[str, str, bool]]:
    return {(e["task_name"], e["seed"], e["success"]) for e in summary.episodes}


def test_async_and_lockstep_give_the_same_per_seed_results(tmp_path: Path) -> None:
    results = {}
    for runner in ("async", "lockstep"):
        with serve_testbed(tasks="testbed/reach/easy", run_id=f"r-{runner}") as tb:
            cfg = EvalConfig(url=tb.url, worker_ids=["0", "1", "2"], policy="expert", runner=runner,
                             results_dir=str(tmp_path))
            summary = run_eval(cfg)
        assert summary.complete and len(summary.episodes) == 8
        results[runner] = _outcomes(summary)
    assert results["async"] == results["lockstep"]


def test_one_batched_instance_serves_every_worker_in_shared_batches(reach: Any, tmp_path: Path) -> None:
    from helper_policies import BatchedRecorder

    BatchedRecorder.instances.clear()
    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1", "2", "3"], policy="helper_policies:batched",
                     policy_args={"sleep_ms": "20"}, results_dir=str(tmp_path))
    summary = run_eval(cfg)
    assert summary.complete and len(summary.episodes) == 8
    (pol,) = BatchedRecorder.instances  # the factory ran once: one copy of the model
    sizes = [len(b) for b in pol.batches]
    assert sum(sizes) == summary.steps and max(sizes) >= 2
    for batch in pol.batches:
        assert len({wid for wid, _, _ in batch}) == len(batch)  # a worker at most once per batch
    # every episode's first observation came with new_episode, after a reset(worker_id)
    firsts = [(wid, eid) for b in pol.batches for wid, eid, new in b if new]
    assert len(firsts) == 8 and sorted(pol.resets) == sorted(w for w, _ in firsts)
    assert summary.batching is not None and summary.batching["items"] == summary.steps
    run_json = json.loads(next(tmp_path.rglob("run.json")).read_text())
    assert run_json["runner"] == "async" and run_json["batching"]["items"] == summary.steps
    # steps.jsonl: each request's latency split has the batch queue wait, and its batch size
    rows = [json.loads(line) for p in tmp_path.rglob("steps.jsonl") for line in p.read_text().splitlines()]
    assert len(rows) == summary.steps
    assert all(r["latency_ms"]["queue"] >= 0 and 1 <= r["batch_size"] <= 4 for r in rows)
    assert all(r["latency_ms"]["policy"] >= 15 for r in rows)  # the policy sleeps 20 ms per call


def test_a_slow_reset_holds_no_other_worker(tmp_path: Path) -> None:
    # Worker 0's resets take 4 s; worker 1 goes on meanwhile (the lockstep loop would hold it at
    # every episode end of worker 0 only partly; here nothing waits for worker 0 at all).
    events: list[tuple[str, dict[str, Any]]] = []
    with serve_testbed(tasks="testbed/reach/easy", num_steps=4,
                       faults={"slow_reset": [("0", 4.0)]}) as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], record=False, max_episodes=4,
                         policy="helper_policies:batched")
        run_eval(cfg, emit=lambda k, p: events.append((k, p)))
    done = [p["worker_id"] for k, p in events if k == "episode"]
    assert done[:3] == ["1", "1", "1"], done  # three of worker 1 before worker 0's first reset ends


def test_events_reach_the_caller_one_at_a_time(reach: Any) -> None:
    # The progress line and its counters are not thread-safe: lanes must not call emit at once.
    import threading
    import time

    busy = threading.Lock()
    overlaps = 0

    def emit(kind: str, payload: dict[str, Any]) -> None:
        nonlocal overlaps
        if not busy.acquire(blocking=False):
            overlaps += 1
            return
        try:
            time.sleep(0.002)  # widen the window a concurrent call would hit
        finally:
            busy.release()

    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1", "2", "3"], policy="helper_policies:batched",
                     record=False)
    run_eval(cfg, emit=emit)
    assert overlaps == 0


def test_a_policy_error_stops_every_lane_and_names_the_policy(reach: Any) -> None:
    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1", "2"], policy="helper_policies:raiser",
                     record=False)
    with pytest.raises(PolicyError, match="policy exploded"):
        run_eval(cfg)


def test_chunk_modes_run_on_lanes(reach: Any, tmp_path: Path) -> None:
    for extra in ({"chunk_size": 3}, {"step_chunk": True}):
        with serve_testbed(tasks=("testbed/reach/easy",), num_steps=5) as tb:
            cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], policy="helper_policies:batched",
                             policy_args={"chunk": "3"}, results_dir=str(tmp_path), **extra)
            summary = run_eval(cfg)
        assert summary.complete and summary.steps == 8 * 5, extra


def test_an_unknown_runner_is_refused(reach: Any) -> None:
    with pytest.raises(PolicyError, match="--runner"):
        run_eval(EvalConfig(url=reach.url, runner="warp", record=False))
