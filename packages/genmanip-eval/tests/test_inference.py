"""Inference: one interface over per-worker and batched policies."""

from __future__ import annotations

from typing import Any

import pytest
from genmanip_eval.errors import PolicyError
from genmanip_eval.inference import BatchItem, Inference

OBS = {"robot_id": "manip/lift2/R5a", "timestep": 0, "reset": True}


def _items(*wids: str, new: bool = False) -> list[BatchItem]:
    return [BatchItem(w, f"b/r/t/{w}", dict(OBS), new_episode=new) for w in wids]


def test_a_per_worker_policy_gets_one_instance_per_worker_and_its_resets() -> None:
    inf = Inference.create("helper_policies:chunky", {"size": "2"})
    assert not inf.batched and inf.has_chunk and not inf.has_action
    chunks = inf.chunks(_items("0", "1", new=True))
    assert [len(c) for c in chunks] == [2, 2]
    inf.chunks(_items("1"))
    insts = inf._per_worker  # (one instance per worker id, the first made at load)
    assert set(insts) == {"0", "1"} and insts["0"] is not insts["1"]
    assert (insts["0"].resets, insts["0"].calls) == (1, 1)
    assert (insts["1"].resets, insts["1"].calls) == (1, 2)


def test_a_batched_policy_is_called_once_per_batch_with_resets_first() -> None:
    inf = Inference.create("helper_policies:batched")
    assert inf.batched and inf.has_action and inf.has_chunk
    pol = inf._batched
    acts = inf.actions(_items("0", "1", "2", new=True))
    assert len(acts) == 3 and all(a["control_type"] == "joint_position" for a in acts)
    assert pol.resets == ["0", "1", "2"]
    assert pol.batches == [[("0", "b/r/t/0", True), ("1", "b/r/t/1", True), ("2", "b/r/t/2", True)]]
    inf.actions(_items("2"))
    assert pol.resets == ["0", "1", "2"] and len(pol.batches) == 2


def test_a_batched_policy_that_returns_the_wrong_count_is_named() -> None:
    inf = Inference.create("helper_policies:wrong_batch")
    with pytest.raises(PolicyError, match=r"returned 1 item\(s\) for a batch of 2"):
        inf.actions(_items("0", "1"))


def test_a_policy_without_any_call_is_refused() -> None:
    with pytest.raises(PolicyError, match="get_actions"):
        Inference.wrap(object(), name="nothing")


def test_wrap_keeps_a_given_object() -> None:
    class Fixed:
        def get_action(self, obs: Any) -> dict[str, Any]:
            return {"control_type": "joint_position", "action": [0.0] * 16, "is_rel": True}

    inf = Inference.wrap(Fixed(), name="fixed")
    assert not inf.batched and inf.actions(_items("0", "1"))[1]["is_rel"] is True


def test_an_unknown_url_scheme_says_what_is_accepted() -> None:
    with pytest.raises(PolicyError, match="foo://"):
        Inference.create("foo://127.0.0.1:1")
