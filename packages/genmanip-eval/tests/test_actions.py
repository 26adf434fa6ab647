from __future__ import annotations

import numpy as np
import pytest
from genmanip_eval.actions import is_action_dict, normalize_step_input
from genmanip_protocol.errors import ValidationError

A = {"control_type": "joint_position", "action": np.zeros(16), "is_rel": True}
B = {"control_type": "joint_position", "action": [0.1] * 16}


def test_bare_action_one_worker() -> None:
    n = normalize_step_input(A, ["0"])
    assert not n.chunk and n.per_worker == {"0": [A]}


def test_bare_action_needs_single_worker() -> None:
    with pytest.raises(ValidationError, match="this client drives 2 workers"):
        normalize_step_input(A, ["0", "1"])


def test_worker_mapping_single_step() -> None:
    n = normalize_step_input({"0": A, 1: B}, ["0", "1"])
    assert not n.chunk and n.per_worker == {"0": [A], "1": [B]}


def test_list_is_chunk_even_of_length_one() -> None:
    n = normalize_step_input([A], ["0"])
    assert n.chunk and n.per_worker == {"0": [A]}


def test_worker_major_ragged_chunks() -> None:
    n = normalize_step_input({"0": [A, B, A], "1": [B]}, ["0", "1"])
    assert n.chunk and n.per_worker == {"0": [A, B, A], "1": [B]}


def test_time_major_chunk_is_transposed() -> None:
    n = normalize_step_input([{"0": A, "1": B}, {"0": B}], ["0", "1"])
    assert n.chunk and n.per_worker == {"0": [A, B], "1": [B]}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"7": A}, "actions['7']"),
        ([], "actions"),
        ({}, "actions"),
        ({"0": A, "1": [B]}, "actions"),
        ({"0": []}, "actions['0']"),
        ([{"0": A}, 3], "actions[1]"),
        ("go", "actions"),
        ({"0": [A, {"x": 1}]}, "actions['0'][1]"),
    ],
)
def test_rejects_with_field(value: object, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_step_input(value, ["0", "1"] if field != "actions" or value != "go" else ["0"])
    assert info.value.field == field


def test_input_errors_are_value_errors_too() -> None:
    # The reference client raised ValueError for bad step() input; callers catching it still work.
    with pytest.raises(ValueError):
        normalize_step_input([], ["0"])


def test_is_action_dict() -> None:
    assert is_action_dict(A) and is_action_dict({"control_type": "ee_pose"})
    assert not is_action_dict({"0": A}) and not is_action_dict([A])
