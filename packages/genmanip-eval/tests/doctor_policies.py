"""Policies built to be wrong, for the ``gmp doctor`` tests (each breaks one rule of the contract)."""

from __future__ import annotations

import math
from typing import Any

from genmanip_protocol.robots import get_robot
from genmanip_testbed.policies import ExpertPolicy


class _Expert:
    """The testbed's expert, with one thing changed by :meth:`spoil`."""

    def __init__(self, control_type: str = "joint_position") -> None:
        self.expert = ExpertPolicy(control_type=control_type)

    def reset(self) -> None:
        self.expert.reset()

    def spoil(self, obs: Any, action: dict[str, Any]) -> dict[str, Any]:
        return action

    def get_action(self, obs: Any) -> dict[str, Any]:
        return self.spoil(obs, self.expert.get_action(obs))


class WrongShape(_Expert):
    """A Franka-sized vector (9 values) for the 16-dim lift2."""

    def spoil(self, obs: Any, action: dict[str, Any]) -> dict[str, Any]:
        return {**action, "action": list(action["action"])[:9]}


class NaNs(_Expert):
    """One NaN in the arm command."""

    def spoil(self, obs: Any, action: dict[str, Any]) -> dict[str, Any]:
        vec = list(action["action"])
        vec[0] = math.nan
        return {**action, "action": vec}


class ClosedGripper(_Expert):
    """Every gripper commanded closed, from the first observation on (open/closed swapped)."""

    def spoil(self, obs: Any, action: dict[str, Any]) -> dict[str, Any]:
        robot = get_robot(str(obs["robot_id"]))
        vec = list(action["action"])
        for s in robot.gripper_slices:
            vec[s] = list(robot.gripper_closed)
        return {**action, "action": vec}


class BadQuaternion(_Expert):
    """ee_pose actions whose quaternion is twice unit length."""

    def __init__(self) -> None:
        super().__init__(control_type="ee_pose")

    def spoil(self, obs: Any, action: dict[str, Any]) -> dict[str, Any]:
        arms = action["action"]
        arms = [[pos, [2.0 * q for q in quat], grip] for pos, quat, grip in arms]
        return {**action, "action": arms}


class Constant:
    """The same absolute action whatever it sees (a little away from the first observed joints)."""

    def __init__(self) -> None:
        self.action: dict[str, Any] | None = None

    def get_action(self, obs: Any) -> dict[str, Any]:
        if self.action is None:
            robot = get_robot(str(obs["robot_id"]))
            joints = [float(v) + 0.05 for v in obs["state.joints"]]
            grip = list(robot.gripper_open)
            self.action = {
                "control_type": "joint_position",
                "action": robot.merge_joint_state(joints, grip * robot.n_arms),
                "is_rel": False,
            }
        return dict(self.action)


class MissingCamera(_Expert):
    """Reads a camera this server does not have."""

    def spoil(self, obs: Any, action: dict[str, Any]) -> dict[str, Any]:
        _ = obs["video.front_view"]
        return action


class ShortChunks:
    """Chunks of 2 actions of the expert (for --chunk-size 4)."""

    def __init__(self) -> None:
        self.expert = ExpertPolicy()

    def get_action_chunk(self, obs: Any) -> list[dict[str, Any]]:
        return [self.expert.get_action(obs) for _ in range(2)]


def wrong_shape(**kw: str) -> WrongShape:
    return WrongShape()


def nans(**kw: str) -> NaNs:
    return NaNs()


def closed_gripper(**kw: str) -> ClosedGripper:
    return ClosedGripper()


def bad_quaternion(**kw: str) -> BadQuaternion:
    return BadQuaternion()


def constant(**kw: str) -> Constant:
    return Constant()


def missing_camera(**kw: str) -> MissingCamera:
    return MissingCamera()


def short_chunks(**kw: str) -> ShortChunks:
    return ShortChunks()
