"""RobotSpec.neutral_action: the wire's no-op per robot (the facts' open gripper values)."""

from __future__ import annotations

import pytest
from genmanip_protocol.errors import ValidationError
from genmanip_protocol.robots import ROBOTS, get_robot
from genmanip_protocol.schema import validate_action

# Gripper open values per robot (GenManip server facts, robot table): what the no-op holds.
_OPEN = {
    "manip/franka/panda_hand": (0.04, 0.04),
    "manip/franka/robotiq": (0.0,) * 6,
    "manip/mobile_aloha/piper": (0.05, -0.05),
    "manip/lift2/R5a": (0.044, 0.044),
}


def test_every_robot_has_a_known_open_value() -> None:
    assert sorted(_OPEN) == sorted(ROBOTS)
    assert {rid: spec.gripper_open for rid, spec in ROBOTS.items()} == _OPEN


@pytest.mark.parametrize("rid", sorted(ROBOTS))
def test_joint_position_neutral_action(rid: str) -> None:
    spec = get_robot(rid)
    action = spec.neutral_action()
    assert validate_action(spec, action)["action"] == action["action"]
    assert action["control_type"] == "joint_position" and action["is_rel"] is True
    assert len(action["action"]) == spec.action_dim
    arms, grips = spec.split_joint_action(action["action"])
    assert arms == [0.0] * spec.joints_dim
    assert grips == list(_OPEN[rid]) * spec.n_arms
    if spec.has_base:
        assert action["base_motion"] == [0.0, 0.0, 0.0] and action["base_is_rel"] is True
    else:
        assert "base_motion" not in action and "base_is_rel" not in action


@pytest.mark.parametrize("rid", sorted(ROBOTS))
def test_ee_pose_neutral_action(rid: str) -> None:
    spec = get_robot(rid)
    action = spec.neutral_action("ee_pose")
    validate_action(spec, action)
    arms = action["action"] if spec.dual_arm else [action["action"]]
    assert arms == [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], list(_OPEN[rid])]] * spec.n_arms


def test_neutral_action_is_a_fresh_dict_and_checks_control_type() -> None:
    spec = get_robot("lift2")
    a, b = spec.neutral_action(), spec.neutral_action()
    a["action"][0] = 1.0
    assert b["action"][0] == 0.0 and spec.neutral_action()["action"][0] == 0.0
    with pytest.raises(ValidationError, match="control_type"):
        spec.neutral_action("torque")
