"""The testbed world: one deterministic kinematic episode per (task, seed).

An episode is "bring the <left|right> gripper to the <colour> block and close it" (suite ``reach``:
stages reach + grasp) or "pick up the <colour> block and lift it" (suite ``lift``: reach + grasp +
lift). The score is the mean over stages (stages stay achieved once reached); the episode ends on
success (score 1), at ``num_steps``, or on an invalid state (score 0 and a ``termination_reason``,
with the real server's bounds).

Actions follow the real server: ``joint_position`` vectors of exactly ``action_dim`` values
(relative arm entries add to the last *commanded* target; gripper entries are absolute), ``ee_pose``
per arm ``(position[3], quat_wxyz[4], gripper[dof])`` (relative: ``T_new = T_delta @ T_last``), base
motion ``[x, y, yaw_deg]`` for dual-arm robots (relative deltas clipped to ±0.015 m and ±1°).
The measured arm state sags slightly below the command (a constant "gravity" offset on one joint),
so a client that adds relative actions to the measured state drifts, as on the real robot.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from genmanip_protocol.robots import RobotSpec

from .kinematics import arm_mounts, fk, ik, local_to_world, mat_to_quat, quat_to_mat
from .render import COLOURS, FrameCache, Renderer, SceneView
from .tasks import TaskSpec

__all__ = ["LIFT_HEIGHT", "REACH_TOL", "Episode", "StepError"]

#: Distance (m) between the gripper and the block centre that counts as "at the block".
REACH_TOL = 0.03
#: Block centre height (m) that counts as lifted.
LIFT_HEIGHT = 0.10
_BLOCK_Z = 0.02
_SAG = 0.004  # rad, measured = commanded - sag on joint 1 of every arm
_BASE_STEP = 0.015
_BASE_YAW_STEP = math.radians(1.0)


class StepError(Exception):
    """An action the world refused; ``cause`` is the exception the real worker would raise."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _rng_for(task: TaskSpec, seed: str, world_seed: int = 0) -> np.random.Generator:
    key = f"{task.name}/{seed}" if not world_seed else f"{world_seed}/{task.name}/{seed}"
    return np.random.default_rng(zlib.crc32(key.encode()))


class Episode:
    """One episode's state. Not thread-safe by itself: the server serialises calls per worker.

    Args:
        robot: the robot spec (dims, cameras, gripper values).
        task, seed: what to build (deterministic per pair).
        episode_id: ``<benchmark>/<run>/<task>/<seed>``.
        num_steps: step limit override (None: the task's).
        is_rel_default: the server's ``-ira`` flag (default for a missing ``is_rel``).
        cache: the frame cache shared by the server (None: a private one).
        render: False skips cameras entirely (the real ``--without_render``).
        world_seed: varies every scene (0 = the default scenes).
    """

    def __init__(
        self,
        robot: RobotSpec,
        task: TaskSpec,
        seed: str,
        episode_id: str,
        *,
        num_steps: int | None = None,
        is_rel_default: bool = False,
        cache: FrameCache | None = None,
        render: bool = True,
        world_seed: int = 0,
    ) -> None:
        self.robot = robot
        self.task = task
        self.seed = seed
        self.episode_id = episode_id
        self.num_steps = int(num_steps) if num_steps else task.num_steps
        self.is_rel_default = is_rel_default
        self.with_render = render
        n = robot.n_arms
        self.mounts = arm_mounts(n)
        self.q_cmd = np.zeros((n, robot.arm_dof))
        self.g_open = np.array(robot.gripper_open, dtype=np.float64)
        self.g_closed = np.array(robot.gripper_closed, dtype=np.float64)
        self.g = np.tile(self.g_open, (n, 1))
        self.base = np.zeros(3)
        self.q = self._measured(self.q_cmd)
        self.ee_cmd = [fk(self.q_cmd[i]) for i in range(n)]
        self.timestep = 0
        self.done = False
        self.termination_reason: str | None = None
        self.grasped = False
        self.stages = [False] * task.n_stages
        self._build_scene(_rng_for(task, seed, world_seed))
        self._prev_closed = self._closedness()
        lo = np.minimum(self.g_open, self.g_closed) - 0.01
        hi = np.maximum(self.g_open, self.g_closed) + 0.01
        self._g_bounds = (lo, hi)
        self._g_jump = max(0.05, float(np.max(np.abs(self.g_open - self.g_closed)))) + 1e-6
        self.renderer = Renderer(
            dict(robot.cameras) if render else {},
            self.distractors,
            cache if cache is not None else FrameCache(),
            salt=zlib.crc32(episode_id.encode()).to_bytes(4, "little"),
        )
        self.lock = threading.Lock()
        # meta_record.pkl content (facts §12.1), filled as the episode runs.
        self.record_joints: list[np.ndarray] = []
        self.record_gripper: list[np.ndarray] = []
        self.record_base: list[np.ndarray] = []
        self.record_outputs: list[dict[str, Any]] = []

    # --- scene ----------------------------------------------------------------------------------------
    def _build_scene(self, rng: np.random.Generator) -> None:
        task = self.task
        n = self.robot.n_arms
        self.arm = int(rng.integers(0, 2)) if n == 2 else 0
        side = 1.0 if self.arm == 0 else -1.0
        hard = task.split == "hard"
        x = rng.uniform(0.45, 0.68) if hard else rng.uniform(0.28, 0.52)
        if n == 2:
            y = side * rng.uniform(0.12, 0.42)
        else:
            y = rng.uniform(-0.3, 0.3)
        self.target = np.array([x, y, _BLOCK_Z])
        self.target_rgb = COLOURS[task.colour]
        self.distractors: list[tuple[np.ndarray, tuple[int, int, int]]] = []
        if hard:
            ang = rng.uniform(0, 2 * math.pi)
            d = rng.uniform(0.04, 0.14)
            p = self.target + np.array([d * math.cos(ang), d * math.sin(ang), 0.0])
            self.distractors.append((p, COLOURS[task.colour + "_alt"]))
        others = [c for c in ("red", "blue", "green", "yellow") if c != task.colour]
        for colour in rng.permutation(others)[:2]:
            for _ in range(20):
                p = np.array([rng.uniform(0.25, 0.75), rng.uniform(-0.5, 0.5), _BLOCK_Z])
                if all(
                    np.linalg.norm(p[:2] - q[:2]) > 0.15
                    for q, _ in [(self.target, None), *self.distractors]
                ):
                    self.distractors.append((p, COLOURS[str(colour)]))
                    break
        arm_name = ("left" if self.arm == 0 else "right") if n == 2 else "robot's"
        grip = f"the {arm_name} gripper" if n == 2 else "the gripper"
        if task.suite == "reach":
            self.instruction = f"Move {grip} to the {task.colour} block and close it on the block."
        else:
            self.instruction = f"Pick up the {task.colour} block with {grip} and lift it."

    # --- state helpers ----------------------------------------------------------------------------------
    def _measured(self, q_cmd: np.ndarray) -> np.ndarray:
        q = q_cmd.copy()
        q[:, 1] -= _SAG
        return np.asarray(q)

    def _closedness(self) -> float:
        span = self.g_closed - self.g_open
        mask = np.abs(span) > 1e-9
        vals = (self.g[self.arm][mask] - self.g_open[mask]) / span[mask]
        return float(np.clip(np.mean(vals), 0.0, 1.0)) if vals.size else 0.0

    def _openness(self) -> np.ndarray:
        span = self.g_closed - self.g_open
        mask = np.abs(span) > 1e-9
        out = []
        for i in range(self.robot.n_arms):
            vals = (self.g[i][mask] - self.g_open[mask]) / span[mask]
            out.append(1.0 - float(np.clip(np.mean(vals), 0.0, 1.0)) if vals.size else 1.0)
        return np.array(out)

    def ee_world(self, arm: int) -> np.ndarray:
        pos, _ = fk(self.q[arm])
        return local_to_world(pos, self.mounts[arm], self.base)

    def view(self) -> SceneView:
        n = self.robot.n_arms
        return SceneView(
            base=self.base.copy(),
            mounts_world=np.array(
                [local_to_world(np.zeros(3), self.mounts[i], self.base) for i in range(n)]
            ),
            ee_world=np.array([self.ee_world(i) for i in range(n)]),
            openness=self._openness(),
            target=self.target.copy(),
            target_rgb=self.target_rgb,
        )

    @property
    def score(self) -> float:
        if self.termination_reason is not None:
            return 0.0
        return float(sum(self.stages)) / len(self.stages)

    @property
    def success(self) -> bool:
        return abs(self.score - 1.0) < 1e-6

    @property
    def metric_score(self) -> list[list[list[float]]]:
        """Per stage the max over alternatives (one alternative each), like the real result_info."""
        if self.termination_reason is not None:
            return [[[0.0] for _ in self.stages]]
        return [[[1.0 if s else 0.0] for s in self.stages]]

    # --- observation --------------------------------------------------------------------------------
    def state_arrays(self) -> dict[str, Any]:
        r = self.robot
        joints = np.concatenate([self.q[i] for i in range(r.n_arms)]).astype(np.float32)
        gripper = np.concatenate([self.g[i] for i in range(r.n_arms)]).astype(np.float32)
        poses = []
        for i in range(r.n_arms):
            pos, rot = fk(self.q[i])
            poses.append([[float(v) for v in pos], [float(v) for v in mat_to_quat(rot)]])
        base: Any = self.base.astype(np.float32) if r.has_base else [0.0, 0.0, 0.0]
        return {
            "state.joints": joints,
            "state.gripper": gripper,
            "state.base": base,
            "state.ee_pose": poses if r.n_arms == 2 else poses[0],
        }

    def observation(
        self, *, render: bool = True, cameras: list[str] | None = None
    ) -> dict[str, Any]:
        """The observation dict with the real keys (frames as read-only (H, W, 3) uint8 arrays).

        ``cameras`` limits rendering to these camera keys (without ``video.``); default all.
        """
        obs: dict[str, Any] = {
            "instruction": self.instruction,
            "timestep": int(self.timestep),
            "reset": self.timestep == 0,
            "episode_id": self.episode_id,
            "robot_id": self.robot.robot_id,
        }
        obs.update(self.state_arrays())
        if render and self.with_render:
            for cam, arr in self.renderer.render(self.view(), cameras).items():
                obs[f"video.{cam}"] = arr
        return obs

    # --- stepping -----------------------------------------------------------------------------------
    def apply(self, action: Any) -> None:
        """Apply one action dict. Raises :class:`StepError` (the episode continues) for a bad action."""
        try:
            q_cmd, g_new, ee_cmd = self._parse(action)
            base_new = self._base_after(action)
        except Exception as e:
            raise StepError(e) from e
        q_prev, g_prev, base_prev = self.q, self.g, self.base
        self.q_cmd, self.g, self.base, self.ee_cmd = q_cmd, g_new, base_new, ee_cmd
        self.q = self._measured(q_cmd)
        self.timestep += 1
        self.record_joints.append(np.concatenate(list(self.q)).astype(np.float32))
        self.record_gripper.append(np.concatenate(list(self.g)).astype(np.float32))
        self.record_base.append(self.base.astype(np.float32))
        arm_action = np.concatenate(
            [np.concatenate([q_cmd[i], g_new[i]]) for i in range(self.robot.n_arms)]
        )
        bm = (
            action.get("base_motion", [0.0, 0.0, 0.0])
            if isinstance(action, Mapping)
            else [0.0, 0.0, 0.0]
        )
        self.record_outputs.append(
            {"arm_action": arm_action, "base_motion": [float(v) for v in list(bm)[:3]]}
        )
        reason = self._invalid(q_prev, g_prev, base_prev)
        if reason is not None:
            self.termination_reason = reason
            self.done = True
            return
        self._update_task()
        if self.success or self.timestep >= self.num_steps:
            self.done = True

    def _parse(
        self, action: Any
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        if not isinstance(action, Mapping):
            raise TypeError(f"action must be a dict, got {type(action).__name__}")
        r = self.robot
        control_type = action["control_type"]
        raw = action["action"]
        is_rel = bool(action.get("is_rel", self.is_rel_default))
        q_cmd = self.q_cmd.copy()
        g = self.g.copy()
        ee_cmd = list(self.ee_cmd)
        if control_type == "joint_position":
            arr = np.array(raw, dtype=np.float64)
            if arr.shape != (r.action_dim,):
                raise ValueError(
                    f"shape mismatch: value array of shape {arr.shape} could not be broadcast "
                    f"to indexing result of shape ({r.action_dim},)"
                )
            for i, (a, gs) in enumerate(zip(r.arm_slices, r.gripper_slices, strict=True)):
                q_cmd[i] = q_cmd[i] + arr[a] if is_rel else arr[a]
                g[i] = arr[gs]
                ee_cmd[i] = fk(q_cmd[i])
            return q_cmd, g, ee_cmd
        if control_type != "ee_pose":
            raise ValueError(f"Unsupported control_type: {control_type}")
        items = list(raw)
        if len(items) == 3 and len(items[0]) == 3 and len(items[1]) == 4:
            items = [items]
        if len(items) != r.n_arms:
            raise ValueError("Invalid ee_pose action")
        for i, item in enumerate(items):
            position, orientation, width = item
            if is_rel:
                rd = quat_to_mat(np.asarray(orientation, dtype=np.float64))
                p_last, r_last = ee_cmd[i]
                pos = rd @ p_last + np.asarray(position, dtype=np.float64)
                rot = rd @ r_last
            else:
                # The real server concatenates ``position + orientation``: numpy arrays add
                # element-wise and fail, only Python lists work. Clients must send lists.
                if isinstance(position, np.ndarray) or isinstance(orientation, np.ndarray):
                    raise ValueError(
                        f"operands could not be broadcast together with shapes "
                        f"{np.shape(position)} {np.shape(orientation)} "
                    )
                pos = np.asarray(position, dtype=np.float64)
                rot = quat_to_mat(np.asarray(orientation, dtype=np.float64))
            if pos.shape != (3,):
                raise ValueError(f"ee_pose position must have 3 values, got {pos.shape}")
            sol = ik(pos, rot, q_cmd[i])
            if sol is not None:  # IK failure silently holds the arm, as on the real server
                q_cmd[i] = sol
            ee_cmd[i] = (pos, rot)
            w = np.array(width, dtype=np.float64).reshape(-1)
            if w.shape != (r.gripper_dof,):
                raise ValueError(
                    f"shape mismatch: value array of shape {w.shape} could not be broadcast "
                    f"to indexing result of shape ({r.gripper_dof},)"
                )
            g[i] = w
        return q_cmd, g, ee_cmd

    def _base_after(self, action: Any) -> np.ndarray:
        if not self.robot.has_base or not isinstance(action, Mapping):
            return self.base
        bm = action.get("base_motion")
        if bm is None:
            return self.base
        m = np.array(bm, dtype=np.float64).reshape(-1)
        if m.shape != (3,):
            raise ValueError(f"base_motion must have 3 values [x, y, yaw_deg], got {m.shape[0]}")
        if bool(action.get("base_is_rel", True)):
            dx = float(np.clip(m[0], -_BASE_STEP, _BASE_STEP))
            dy = float(np.clip(m[1], -_BASE_STEP, _BASE_STEP))
            dyaw = float(np.clip(math.radians(m[2]), -_BASE_YAW_STEP, _BASE_YAW_STEP))
            return np.asarray(self.base + np.array([dx, dy, dyaw]))
        return np.array([m[0], m[1], math.radians(m[2])])

    def _invalid(self, q_prev: np.ndarray, g_prev: np.ndarray, base_prev: np.ndarray) -> str | None:
        q, g, b = self.q, self.g, self.base
        if not (np.all(np.isfinite(q)) and np.all(np.isfinite(g)) and np.all(np.isfinite(b))):
            return "non_finite_arm_state"
        if np.max(np.abs(q)) > 10.0:
            return "arm_state_out_of_range"
        if np.max(np.abs(q - q_prev)) > 1.0:
            return "arm_state_jump_too_large"
        lo, hi = self._g_bounds
        if np.any(g < lo) or np.any(g > hi):
            return "gripper_state_out_of_range"
        if np.max(np.abs(g - g_prev)) > self._g_jump:
            return "gripper_state_jump_too_large"
        if self.robot.has_base:
            if math.hypot(b[0], b[1]) > 5.0:
                return "base_xy_out_of_range"
            if abs(b[2]) > 4 * math.pi:
                return "base_yaw_out_of_range"
            if math.hypot(b[0] - base_prev[0], b[1] - base_prev[1]) > 0.2:
                return "base_xy_jump_too_large"
            if abs(b[2] - base_prev[2]) > math.radians(20.0):
                return "base_yaw_jump_too_large"
        return None

    def _update_task(self) -> None:
        ee = self.ee_world(self.arm)
        closed = self._closedness()
        if self.grasped:
            if closed < 0.5:
                self.grasped = False
                self.target = np.array([ee[0], ee[1], _BLOCK_Z])
            else:
                self.target = ee.copy()
        dist = float(np.linalg.norm(ee - self.target))
        if dist < REACH_TOL:
            self.stages[0] = True
        if not self.grasped and closed >= 0.8 and self._prev_closed < 0.8 and dist < REACH_TOL:
            self.grasped = True
            self.target = ee.copy()
        self._prev_closed = closed
        if self.grasped:
            self.stages[1] = True
        if len(self.stages) > 2 and self.grasped and self.target[2] >= LIFT_HEIGHT:
            self.stages[2] = True
