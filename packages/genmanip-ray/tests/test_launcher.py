"""``--launcher ray`` on one real Ray instance: the same per-seed results as the local launcher,
one run.json naming the cluster, the options, the router."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from genmanip_eval import EvalConfig, run_eval
from genmanip_eval.errors import PolicyError
from genmanip_ray.actors import Route, Router
from genmanip_ray.launcher import RayOptions, split_groups
from genmanip_testbed import serve_testbed
from ray_helpers import EventLog, assert_exactly_once, run_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TASKS = ("testbed/reach/easy",)


@pytest.fixture(scope="module", autouse=True)
def ray_instance() -> Iterator[None]:
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def _per_seed(summary: object) -> dict[tuple[str, str], tuple[float, float]]:
    return {(e["task_name"], str(e["seed"])): (e["score"], e["sr"]) for e in summary.episodes}  # type: ignore[attr-defined]


def test_four_workers_over_two_actors_match_the_local_launcher(tmp_path: Path) -> None:
    results = {}
    for launcher in ("local", "ray"):
        with serve_testbed(tasks=TASKS, run_id=f"same-{launcher}", results_root=tmp_path / f"srv-{launcher}") as tb:
            log = EventLog()
            cfg = EvalConfig(url=tb.url, worker_ids=["0", "1", "2", "3"], policy="expert",
                             results_dir=str(tmp_path / f"res-{launcher}"), launcher=launcher,
                             launcher_options={"workers_per_actor": 2} if launcher == "ray" else {})
            summary = run_eval(cfg, emit=log)
            assert summary.complete
            total = len(summary.episodes)
            assert total == 8
            run_dir = Path(summary.run_dirs[0])
            assert_exactly_once(tb, run_dir, summary, total)
            results[launcher] = (summary, run_dir, log)
    local, ray_run = results["local"], results["ray"]
    assert _per_seed(ray_run[0]) == _per_seed(local[0])
    assert ray_run[0].steps == local[0].steps == ray_run[2].steps()
    # one progress stream on the driver: every episode once, every step counted
    assert ray_run[2].count("episode") == 8
    manifest = run_json(ray_run[1])
    assert manifest["launcher"] == "ray"
    # (the workers that recorded: under load one actor may start after the other's workers took
    # every episode; the cluster section below names every actor's workers whatever they did)
    assert set(manifest["workers"]) <= {"0", "1", "2", "3"} and manifest["workers"]
    cluster = manifest["cluster"]
    assert [a["workers"] for a in cluster["actors"]] == [["0", "1"], ["2", "3"]]
    assert len(cluster["replicas"]) == 1 and cluster["replicas"][0]["num_gpus"] == 0.0
    assert cluster["routing"]["routes"] == {"0": 0, "1": 0}
    assert len(cluster["nodes"]) == 1 and cluster["nodes"][0]["alive"]
    assert cluster["replica_batching"][0]["served"] >= ray_run[0].steps
    assert ray_run[0].batching and ray_run[0].batching["items"] >= ray_run[0].steps


def _hold_after_one_episode(core: Any, first: str, second: str, cap_s: float = 120.0) -> None:
    """Make ``first`` wait, before claiming its second episode, until ``second`` claimed one.

    The server hands episodes to whichever worker resets first, so an actor that starts late
    (a loaded machine: seconds of process start-up) can find every episode taken; this fixes
    the interleaving the test needs instead of hoping for it. The wait runs in the testbed's
    reset thread of ``first`` (its pending reset), never under the core's lock."""
    original = core._claim_next
    second_claimed = threading.Event()
    claims = {first: 0}

    def claim(w: Any) -> Any:
        wid = str(w.wid)
        if wid == first and claims[first] >= 1:
            second_claimed.wait(cap_s)
        key = original(w)
        if key is not None and wid == second:
            second_claimed.set()
        if key is not None and wid == first:
            claims[first] += 1
        return key

    core._claim_next = claim


def test_the_driver_ends_the_segment_once_with_the_whole_runs_totals(tmp_path: Path) -> None:
    # Each actor records its own share into the one segment of the invocation; the driver ends
    # it once with the run's outcome and totals (not the last actor's own episodes and steps).
    with serve_testbed(tasks=TASKS, run_id="seg", results_root=tmp_path / "srv") as tb:
        _hold_after_one_episode(tb.core, "0", "1")  # both actors must run episodes
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], policy="expert", results_dir=str(tmp_path / "res"),
                         launcher="ray", launcher_options={"workers_per_actor": 1})
        summary = run_eval(cfg)
        assert tb.wait_finalizes(60)
        stats = tb.stats.snapshot()
    assert summary.complete and len(summary.episodes) == 8
    by_actor = [sum(1 for e in summary.episodes if e["worker_id"] == w) for w in ("0", "1")]
    assert all(0 < n < 8 for n in by_actor), by_actor  # both actors ran episodes
    (run_dir,) = summary.run_dirs
    manifest = run_json(Path(run_dir))
    assert len(manifest["cluster"]["actors"]) == 2
    (seg,) = manifest["segments"]
    assert seg["outcome"] == "complete" and seg["finished"] >= seg["started"]
    assert seg["episodes"] == len(summary.episodes) == stats["episodes_finished"] == 8
    assert seg["steps"] == summary.steps == sum(stats["steps_by_worker"].values()) > 0
    assert seg["workers"] == ["0", "1"]


def test_two_replicas_share_the_groups_and_batch_across_them(tmp_path: Path) -> None:
    with serve_testbed(tasks=TASKS, run_id="two", results_root=tmp_path / "srv") as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=[str(i) for i in range(4)], policy="expert",
                         results_dir=str(tmp_path / "res"), launcher="ray",
                         launcher_options={"workers_per_actor": 1, "policy_replicas": 2,
                                           "cpus_per_replica": 0.5, "cpus_per_actor": 0.5})
        summary = run_eval(cfg)
        assert summary.complete
        run_dir = Path(summary.run_dirs[0])
        assert_exactly_once(tb, run_dir, summary, 8)
    cluster = run_json(run_dir)["cluster"]
    assert sorted(cluster["routing"]["routes"].values()) == [0, 0, 1, 1]  # 2 groups per replica
    assert cluster["routing"]["load"] == {"0": 2, "1": 2}
    assert len(cluster["actors"]) == 4


def test_a_policy_that_does_not_load_is_named(tmp_path: Path) -> None:
    with serve_testbed(tasks=TASKS, run_id="bad", results_root=tmp_path / "srv") as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0"], policy="zero",
                         policy_args={"control_type": "nonsense"}, results_dir=str(tmp_path / "res"),
                         launcher="ray")
        with pytest.raises(PolicyError, match="policy replica 0"):
            run_eval(cfg)


def test_max_episodes_stops_every_actor(tmp_path: Path) -> None:
    with serve_testbed(tasks=TASKS, run_id="max", results_root=tmp_path / "srv") as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1", "2", "3"], policy="expert", max_episodes=3,
                         results_dir=str(tmp_path / "res"), launcher="ray",
                         launcher_options={"workers_per_actor": 2})
        summary = run_eval(cfg)
    assert 3 <= len(summary.episodes) < 8
    assert not summary.complete


def test_options_and_groups() -> None:
    assert split_groups([str(i) for i in range(10)], 4) == [["0", "1", "2", "3"], ["4", "5", "6"], ["7", "8", "9"]]
    assert split_groups(["0", "1"], 4) == [["0", "1"]]
    assert split_groups([str(i) for i in range(32)], 4)[-1] == ["28", "29", "30", "31"]
    opts = RayOptions.from_config(EvalConfig(launcher="ray", launcher_options={
        "address": "auto", "workers_per_actor": 8, "policy_replicas": 2, "gpus_per_replica": 0.5}))
    assert (opts.address, opts.workers_per_actor, opts.policy_replicas, opts.gpus_per_replica) == ("auto", 8, 2, 0.5)
    with pytest.raises(PolicyError, match="workers-per-actor"):
        RayOptions.from_config(EvalConfig(launcher="ray", launcher_options={"workers_per_actor": -1}))
    with pytest.raises(PolicyError, match="unknown option"):
        RayOptions.from_config(EvalConfig(launcher="ray", launcher_options={"bogus": 1}))


def test_router_balances_groups_and_moves_them_off_a_dead_replica() -> None:
    r = Router()
    r.add(0, "h0", "ws://a:1")
    r.add(1, "h1", "ws://b:2")
    r0, r1 = Route(0, "ws://a:1", "h0"), Route(1, "ws://b:2", "h1")
    assert r.route(0, 4) == r0
    assert r.route(1, 4) == r1
    assert r.route(2, 2) == r0
    assert r.route(3, 2) == r1
    assert r.route(0, 4) == r0  # sticky
    assert r.failed(0, 0) == r1
    assert r.failed(2, 0) == r1  # already known dead: moved, not counted twice
    assert r.take_dead() == [0] and r.take_dead() == []
    assert r.table()["load"] == {"1": 12}
    r.add(2, "h2", "ws://c:3")
    assert r.failed(1, 1) == Route(2, "ws://c:3", "h2")
    r.dead.add(2)
    assert r.route(3, 2) is None
