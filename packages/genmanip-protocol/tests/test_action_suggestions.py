"""An action dict with a misspelt key: the missing required key is said first, with the key that
looks like its typo, and the message names every other field instead of "(and 1 more)"."""

from __future__ import annotations

import pytest
from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_protocol.schema import check_action, validate_action

PANDA = "manip/franka/panda_hand"


def test_a_typo_of_action_says_action_is_missing() -> None:
    with pytest.raises(ValidationError) as ei:
        validate_action(PANDA, {"actoin": [0.0] * 9, "control_type": "joint_position"}, worker="0", step=0)
    assert str(ei.value) == (
        "worker 0, step 0: action: expected a required key, got missing (is 'actoin' a typo of it?) "
        "(and 1 more: actoin)"
    )
    assert ei.value.exit_code == ExitCode.INVALID_INPUT
    second = ei.value.violations[1]
    assert (second.field, second.actual) == ("actoin", "unknown key 'actoin' (did you mean 'action'?)")


def test_unknown_keys_get_a_did_you_mean_among_the_unused_keys() -> None:
    vs = check_action(PANDA, {"action": [0.0] * 9, "control_type": "joint_position", "is_relative": True})
    assert [(v.field, v.actual) for v in vs] == [("is_relative", "unknown key 'is_relative' (did you mean 'is_rel'?)")]
    vs = check_action(PANDA, {"action": [0.0] * 9, "control_type": "joint_position", "speed": 3})
    assert [v.actual for v in vs] == ["unknown key 'speed'"]  # nothing close: no guess


def test_more_than_four_other_fields_are_cut() -> None:
    bad = {"action": [float("nan")] * 9, "control_type": "joint_position"}
    with pytest.raises(ValidationError) as ei:
        validate_action(PANDA, bad)
    assert str(ei.value).endswith("(and 8 more: action[1], action[2], action[3], action[4], ...)")
