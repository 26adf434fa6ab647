"""A simulated 2-node cluster (``ray.cluster_utils.Cluster``: two raylets on this machine): the
actors are spread over both nodes, and a node removed mid-run loses nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from genmanip_eval import EvalConfig, run_eval
from genmanip_testbed import serve_testbed
from ray.cluster_utils import Cluster
from ray_helpers import EventLog, assert_exactly_once, mid_episode, run_json, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TASKS = ("testbed/reach/easy",)
#: the node-loss run's job: 16 episodes, 4 a worker, so that much of it is left when the node goes
#: (8 short episodes left ~1 s after the trigger: a loaded machine removed the node after the run)
NODE_LOSS_TASKS = ("testbed/reach",)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 3})
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()  # type: ignore[no-untyped-call]


def _node_of_each(cluster_info: dict[str, Any]) -> dict[int, str]:
    return {a["group"]: a["node_id"] for a in cluster_info["actors"] if a.get("node_id")}


def test_actors_are_placed_on_both_nodes(cluster: Cluster, tmp_path: Path) -> None:
    second = cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    try:
        with serve_testbed(tasks=TASKS, run_id="spread", results_root=tmp_path / "srv") as tb:
            cfg = EvalConfig(url=tb.url, worker_ids=["0", "1", "2", "3"], policy="expert",
                             results_dir=str(tmp_path / "res"), launcher="ray",
                             launcher_options={"workers_per_actor": 2, "policy_replicas": 2})
            summary = run_eval(cfg)
            assert summary.complete
            run_dir = Path(summary.run_dirs[0])
            assert_exactly_once(tb, run_dir, summary, 8)
        info = run_json(run_dir)["cluster"]
        alive = {n["node_id"] for n in info["nodes"] if n["alive"]}
        assert len(alive) == 2
        assert set(_node_of_each(info).values()) == alive  # one eval actor on each node
        assert {r["node_id"] for r in info["replicas"]} == alive  # and one replica on each
    finally:
        cluster.remove_node(second)


def test_a_node_removed_mid_run_loses_nothing(cluster: Cluster, tmp_path: Path) -> None:
    second = cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    with serve_testbed(tasks=NODE_LOSS_TASKS, run_id="nodeloss", results_root=tmp_path / "srv",
                       faults="latency=40ms,routes=step") as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1", "2", "3"], policy="expert",
                         results_dir=str(tmp_path / "res"), launcher="ray",
                         launcher_options={"workers_per_actor": 2, "policy_replicas": 2,
                                           "cpus_per_replica": 0.5})
        log = EventLog()
        out: dict[str, Any] = {}

        def target() -> None:
            try:
                out["summary"] = run_eval(cfg, emit=log)
            except BaseException as exc:  # handed to the test
                out["error"] = exc

        t = threading.Thread(target=target, daemon=True)
        t.start()
        # (mid-episode for every worker, and with most of the job left)
        log.wait(lambda: log.count("episode") >= 1 and log.steps() >= 20)
        wait_for(lambda: mid_episode(tb, cfg.worker_ids), what="every worker mid-episode", poll_s=0.002)
        assert t.is_alive() and log.count("episode") <= 8, "the run was nearly over before the node went"
        cluster.remove_node(second, allow_graceful=False)
        t.join(240)
        assert not t.is_alive()
        assert "error" not in out, out.get("error")
        summary = out["summary"]
        assert summary.complete
        run_dir = Path(summary.run_dirs[0])
        assert_exactly_once(tb, run_dir, summary, 16, killed=2)  # that node's eval actor (and replica)
    info = run_json(run_dir)["cluster"]
    gone = second.node_id
    assert any(a.get("node_id") == gone and a["state"] == "died" for a in info["actors"])
    finished = [a for a in info["actors"] if a["state"] == "finished"]
    assert sorted(a["group"] for a in finished) == [0, 1]
    assert all(a["node_id"] != gone for a in finished)
    assert log.count("takeover") >= 1
