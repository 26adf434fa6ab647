"""The scripted policy of the testbed world (the genmanip-eval policy interface).

A policy has ``reset()``, ``get_action(obs) -> action_dict`` and ``get_action_chunk(obs) ->
list[action_dict]``. Factories take keyword arguments whose values may be strings (from
``--policy-arg k=v``) and parse them. :func:`expert` is registered as ``expert`` in the
``genmanip.policies`` entry-point group, so ``gmp eval --policy expert`` finds it by name.

* :func:`expert` decides from the observation only: it reads the target colour and arm from the
  instruction, finds the block in the top camera image by colour thresholding (numpy), computes its
  gripper position from ``state.joints`` with the robot's published kinematic model, and moves there,
  closes, and lifts when asked. Its colour threshold is crude on purpose: in the hard split a
  similar-coloured distractor pulls its estimate off the block, so it fails some hard episodes.

The no-op policy is genmanip-eval's ``zero`` (one owner); its action is
:meth:`genmanip_protocol.robots.RobotSpec.neutral_action`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from genmanip_protocol.robots import RobotSpec, get_robot

from .kinematics import arm_jacobian, arm_mounts, fk, local_to_world, mat_to_quat, world_to_local
from .render import COLOURS, top_pixel_to_world

__all__ = ["ExpertPolicy", "episode_seed", "expert", "expert_policy"]

_COLOUR_NAMES = ("red", "blue", "green", "yellow")
_TOP_CAMERAS = ("video.top_camera_view", "video.obs_camera_view")


def episode_seed(seed: int, episode_id: str) -> list[int]:
    """The noise seed of one episode: ``seed`` and a stable hash of its ``(task, seed)``.

    ``episode_id`` is ``<benchmark>/<run_id>/<task_name>/<seed>``; the run id is left out (a
    resumed or repeated run gets the same noise). Any other id is hashed whole.
    """
    parts = episode_id.split("/")
    key = "/".join(parts[2:]) if len(parts) >= 4 else episode_id
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return [int(seed) & 0xFFFFFFFF, int.from_bytes(digest[:8], "big")]


def _as_array(v: Any) -> np.ndarray:
    return np.asarray(v, dtype=np.float64).reshape(-1)


class ExpertPolicy:
    """The scripted expert. See the module docstring.

    Args:
        seed: seeds the motion noise, together with each episode's task and seed
            (:func:`episode_seed`): the same episode gets the same noise in every run.
        noise: std-dev (m) of the noise added to every motion step.
        speed: max gripper travel per step (m).
        control_type: ``"joint_position"`` (default) or ``"ee_pose"``.
        chunk: actions per :meth:`get_action_chunk` call.
        threshold: RGB distance that counts as the target colour.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        noise: float = 0.002,
        speed: float = 0.03,
        control_type: str = "joint_position",
        chunk: int = 4,
        threshold: float = 70.0,
    ) -> None:
        if control_type not in ("joint_position", "ee_pose"):
            raise ValueError(
                f"control_type: expected joint_position or ee_pose, got {control_type!r}"
            )
        self.seed = int(seed)
        self.noise = float(noise)
        self.speed = float(speed)
        self.control_type = control_type
        self.chunk = max(1, int(chunk))
        self.threshold = float(threshold)
        self._rng = np.random.default_rng(self.seed)
        self.reset()

    def reset(self) -> None:
        """Forget the current episode (target estimate, phase, commanded joints)."""
        self._episode: str | None = None
        self._target: np.ndarray | None = None
        self._closed_steps = 0
        self._q_cmd: np.ndarray | None = None

    # --- perception -------------------------------------------------------------------------------
    def _locate(self, obs: Mapping[str, Any], colour: str) -> np.ndarray | None:
        key = next((k for k in _TOP_CAMERAS if k in obs), None)
        if key is None:
            return None
        img = np.asarray(obs[key])
        stride = 3
        small = img[::stride, ::stride].astype(np.int32)
        ref = np.array(COLOURS[colour], dtype=np.int32)
        d2 = np.sum((small - ref) ** 2, axis=-1)
        rows, cols = np.nonzero(d2 < self.threshold**2)
        if rows.size < 8:
            return None
        x, y = top_pixel_to_world(
            float(rows.mean()) * stride + 0.5 * (stride - 1),
            float(cols.mean()) * stride + 0.5 * (stride - 1),
            img.shape[:2],
        )
        return np.array([x, y, 0.02])

    # --- control ----------------------------------------------------------------------------------
    def _plan(self, obs: Mapping[str, Any]) -> tuple[RobotSpec, int, np.ndarray, np.ndarray, bool]:
        robot = get_robot(str(obs.get("robot_id", "manip/lift2/R5a")))
        episode = str(obs.get("episode_id", ""))
        if episode != self._episode or bool(obs.get("reset", False)):
            self.reset()
            self._episode = episode
            # The episode's noise depends on (task, seed) only: not on which worker, process or
            # earlier episodes of this instance came first, so a run's numbers repeat.
            self._rng = np.random.default_rng(episode_seed(self.seed, episode))
        instruction = str(obs.get("instruction", "")).lower()
        colour = next((c for c in _COLOUR_NAMES if re.search(rf"\b{c}\b", instruction)), "red")
        arm = 1 if (robot.n_arms == 2 and "right" in instruction) else 0
        lift = "lift" in instruction
        joints = _as_array(obs["state.joints"]).reshape(robot.n_arms, robot.arm_dof)
        if self._q_cmd is None:
            self._q_cmd = joints.copy()
        base = _as_array(obs["state.base"]) if robot.has_base else np.zeros(3)
        mount = arm_mounts(robot.n_arms)[arm]
        ee = local_to_world(fk(joints[arm])[0], mount, base)
        seen = self._locate(obs, colour)
        # Once the gripper is over the block it hides it: keep the last estimate.
        if seen is not None and (self._target is None or np.linalg.norm(seen[:2] - ee[:2]) > 0.04):
            self._target = seen
        target = self._target if self._target is not None else ee.copy()
        return robot, arm, ee, target, lift

    def _next(  # noqa: PLR0917 - private helper fed from _plan's tuple
        self,
        robot: RobotSpec,
        arm: int,
        ee: np.ndarray,
        target: np.ndarray,
        lift: bool,
        obs: Mapping[str, Any],
    ) -> tuple[dict[str, Any], np.ndarray]:
        assert self._q_cmd is not None
        close = self._closed_steps > 0
        goal = target.copy()
        if not close and np.linalg.norm(goal[:2] - ee[:2]) > 0.03:
            goal[2] = max(goal[2], 0.08)  # approach from above
        dist = float(np.linalg.norm(goal - ee))
        if not close and dist < 0.012 and goal[2] < 0.05:
            close = True
        if close:
            self._closed_steps += 1
            if lift and self._closed_steps > 2:
                goal = np.array([ee[0], ee[1], 0.16])
            elif not lift:
                goal = ee.copy()
        dp = goal - ee
        n = float(np.linalg.norm(dp))
        if n > self.speed:
            dp *= self.speed / n
        dp = dp + self._rng.normal(0.0, self.noise, 3)
        base = _as_array(obs["state.base"]) if robot.has_base else np.zeros(3)
        mount = arm_mounts(robot.n_arms)[arm]
        dp_local = world_to_local(ee + dp, mount, base) - world_to_local(ee, mount, base)
        jac = arm_jacobian(robot.arm_dof)
        dq = np.linalg.pinv(jac) @ dp_local
        self._q_cmd[arm, :-1] += dq
        grip_open = np.array(robot.gripper_open)
        grip_closed = np.array(robot.gripper_closed)
        grips = [grip_open.copy() for _ in range(robot.n_arms)]
        grips[arm] = grip_closed if close else grip_open
        if self.control_type == "joint_position":
            vec: list[float] = []
            for i in range(robot.n_arms):
                vec.extend(float(v) for v in self._q_cmd[i])
                vec.extend(float(v) for v in grips[i])
            action: dict[str, Any] = {
                "control_type": "joint_position",
                "action": vec,
                "is_rel": False,
            }
        else:
            poses = []
            for i in range(robot.n_arms):
                pos, rot = fk(self._q_cmd[i])
                poses.append(
                    [
                        [float(v) for v in pos],
                        [float(v) for v in mat_to_quat(rot)],
                        [float(v) for v in grips[i]],
                    ]
                )
            action = {
                "control_type": "ee_pose",
                "action": poses if robot.n_arms == 2 else poses[0],
                "is_rel": False,
            }
        if robot.has_base:
            action["base_motion"] = [0.0, 0.0, 0.0]
            action["base_is_rel"] = True
        return action, ee + dp

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """One action for ``obs`` (a dict or :class:`genmanip_protocol.codec.Observation`)."""
        robot, arm, ee, target, lift = self._plan(obs)
        action, _ = self._next(robot, arm, ee, target, lift, obs)
        return action

    def get_action_chunk(self, obs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``chunk`` actions planned open-loop from ``obs`` (the gripper is assumed to follow)."""
        robot, arm, ee, target, lift = self._plan(obs)
        out = []
        for _ in range(self.chunk):
            action, ee = self._next(robot, arm, ee, target, lift, obs)
            out.append(action)
        return out


def expert(**kwargs: Any) -> ExpertPolicy:
    """Factory of :class:`ExpertPolicy`; values may be strings (``seed=3``, ``noise=0.002``,
    ``speed=0.03``, ``control_type=ee_pose``, ``chunk=4``, ``threshold=70``)."""
    known = {
        "seed": int,
        "noise": float,
        "speed": float,
        "control_type": str,
        "chunk": int,
        "threshold": float,
    }
    parsed: dict[str, Any] = {}
    for k, v in kwargs.items():
        key = k.replace("-", "_")
        if key not in known:
            raise ValueError(f"expert policy: unknown argument {k!r} (known: {', '.join(known)})")
        try:
            parsed[key] = known[key](v)
        except (TypeError, ValueError):
            raise ValueError(
                f"expert policy: {k}={v!r} is not a valid {known[key].__name__}"
            ) from None
    return ExpertPolicy(**parsed)


expert_policy = expert
