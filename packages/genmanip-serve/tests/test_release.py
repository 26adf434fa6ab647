"""A long-lived policy server releases the workers of closed connections (Inference.drop)."""

from __future__ import annotations

import time
from collections.abc import Callable

import serve_helpers
from genmanip_eval.inference import BatchItem, Inference
from genmanip_serve import PolicyServer, serve_policy
from serve_helpers import make_obs


def _until(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    # a wait for a state, with a generous deadline (not a timing assertion)
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _step(url: str, workers: list[str], *, close: bool = True) -> Inference:
    remote = Inference.create(url)
    remote.actions([BatchItem(w, f"e{w}", make_obs(0, cameras=False, episode=f"e{w}")) for w in workers])
    if close:
        remote.close()
    return remote


def _idle(server: PolicyServer, n: int = 0) -> None:
    _until(lambda: server.stats()["connections"] == n, f"{n} open connection(s)")


def test_per_worker_instances_do_not_accumulate_across_reconnects() -> None:
    serve_helpers.LIVE.clear()
    serve_helpers.COUNTS.update(made=0, closed=0)
    with serve_policy("serve_helpers:counted") as server:
        for _ in range(6):
            _step(server.url, ["0", "1"])
        _idle(server)
        # the next batch releases every closed connection's worker first
        remote = _step(server.url, ["0"], close=False)
        assert len(serve_helpers.LIVE) == 1
        assert serve_helpers.COUNTS == {"made": 13, "closed": 12}
        remote.close()
    assert not serve_helpers.LIVE  # closing the server closes the rest


def test_batched_policy_is_told_which_workers_left() -> None:
    with serve_policy("serve_helpers:dropping") as server:
        remote = _step(server.url, ["0", "1"], close=False)  # connections 1 (worker 0) and 2
        remote.drop("1")  # the ws:// policy closes that worker's connection
        _idle(server, 1)
        remote.actions([BatchItem("0", "e0", make_obs(1, cameras=False, episode="e0"))])
        assert serve_helpers.DROPPED == ["1@2"]
        remote.close()
        _idle(server)
        _step(server.url, ["0"])
        assert sorted(serve_helpers.DROPPED) == ["0@1", "1@2"]


def test_drop_of_a_wrapped_object_never_closes_it() -> None:
    serve_helpers.LIVE.clear()
    serve_helpers.COUNTS.update(made=0, closed=0)
    inference = Inference.wrap(serve_helpers.Counted())
    items = [BatchItem(w, None, make_obs(0, cameras=False)) for w in ("a", "b")]
    inference.actions(items)
    inference.drop("a")
    inference.drop("b")
    inference.drop("never-seen")
    assert serve_helpers.COUNTS == {"made": 1, "closed": 0} and len(serve_helpers.LIVE) == 1
    own = Inference.create("serve_helpers:counted")
    own.actions(items)
    own.drop("a")
    assert serve_helpers.COUNTS == {"made": 3, "closed": 1}
