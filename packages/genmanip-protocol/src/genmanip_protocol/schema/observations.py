"""Observations: the real server's keys, state shapes and camera frames, checked per robot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ValidationError, Violation
from ..robots import RobotSpec, get_robot
from ._checks import _Ctx, _describe, _is_bool, _is_count, _is_number, _short
from .ids import split_episode_id

__all__ = ["check_observation", "validate_observation"]


_OBS_SCALARS = ("instruction", "timestep", "reset", "episode_id", "robot_id")
_OBS_STATE = ("state.joints", "state.gripper", "state.base", "state.ee_pose")


def _obs_vector(ctx: _Ctx, name: str, value: Any, n: int, what: str) -> None:
    """A state vector: float32 array or a list of numbers; non-finite values are allowed (the
    server reports invalid states with them)."""
    expected = f"{n} floats ({what})"
    if isinstance(value, np.ndarray):
        if value.shape != (n,):
            ctx.add(name, expected, f"numpy array of shape {tuple(value.shape)}")
        elif value.dtype != np.float32:
            ctx.add(name, f"{expected} as float32", f"dtype {value.dtype}")
        return
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            ctx.add(name, expected, f"{len(value)} values")
        else:
            for i, x in enumerate(value):
                if not _is_number(x):
                    ctx.add(f"{name}[{i}]", "a float", _describe(x))
                    break
        return
    ctx.add(name, expected, _describe(value))


def _obs_ee_pose(ctx: _Ctx, value: Any, spec: RobotSpec) -> None:
    def pose(name: str, v: Any) -> None:
        if isinstance(v, np.ndarray) and v.shape == (7,):
            return  # some builds send the pose concatenated; still [pos, quat]
        if not isinstance(v, (list, tuple, np.ndarray)) or len(v) != 2:
            ctx.add(name, "[position(3), quaternion_wxyz(4)]", _describe(v))
            return
        for j, n in ((0, 3), (1, 4)):
            part = v[j]
            size = getattr(part, "shape", None)
            ok = (
                (size == (n,))
                if size is not None
                else (isinstance(part, (list, tuple)) and len(part) == n)
            )
            if not ok:
                ctx.add(f"{name}[{j}]", f"{n} floats", _describe(part))

    if spec.dual_arm:
        if not isinstance(value, (list, tuple, np.ndarray)) or len(value) != 2:
            ctx.add("state.ee_pose", "2 arms [[pos_l, quat_l], [pos_r, quat_r]]", _describe(value))
            return
        pose("state.ee_pose[0]", value[0])
        pose("state.ee_pose[1]", value[1])
    else:
        pose("state.ee_pose", value)


def _check_observation(spec: RobotSpec | None, obs: Any, ctx: _Ctx, strict: bool) -> None:
    if not isinstance(obs, Mapping):
        ctx.add("obs", "a mapping of observation keys", _describe(obs))
        return
    # An Observation decodes JPEG frames on item access; raw_items() leaves them encoded, so
    # checking never pays for a decode (a JpegFrame declares its shape).
    raw_items = getattr(obs, "raw_items", None)
    if callable(raw_items):
        obs = dict(raw_items())
    keys = set(obs.keys())
    rid = obs.get("robot_id")
    if spec is None:
        if isinstance(rid, str):
            try:
                spec = get_robot(rid)
            except ValidationError:
                ctx.add("robot_id", "a known robot id", _short(rid))
                return
        else:
            ctx.add("robot_id", "a str naming the robot", _describe(rid))
            return
    for key in (*_OBS_SCALARS, *_OBS_STATE):
        if key not in keys:
            ctx.add(key, "a required observation key", "missing")
    if "instruction" in keys and not isinstance(obs["instruction"], str):
        ctx.add("instruction", "a str", _describe(obs["instruction"]))
    if "timestep" in keys:
        ts = obs["timestep"]
        if not isinstance(ts, (int, np.integer)) or _is_bool(ts):
            ctx.add("timestep", "an int", _describe(ts))
        elif not _is_count(ts):
            ctx.add("timestep", "an int in 0..2**63-1", _describe(ts))
    if "reset" in keys and not _is_bool(obs["reset"]):
        ctx.add("reset", "a bool", _describe(obs["reset"]))
    if "episode_id" in keys:
        eid = obs["episode_id"]
        if not isinstance(eid, str):
            ctx.add("episode_id", "a str <benchmark>/<run_id>/<task_name>/<seed>", _describe(eid))
        else:
            try:
                split_episode_id(eid)
            except ValidationError as exc:
                for v in exc.violations:
                    ctx.add(v.field, v.expected, v.actual)
    if "robot_id" in keys:
        if not isinstance(rid, str):
            ctx.add("robot_id", "a str", _describe(rid))
        else:
            try:
                other = get_robot(rid)
            except ValidationError:
                other = None
            if other is not spec:
                ctx.add("robot_id", f"{spec.robot_id} (or one of its aliases)", _short(rid))
    if "state.joints" in keys:
        _obs_vector(
            ctx,
            "state.joints",
            obs["state.joints"],
            spec.joints_dim,
            f"arm joints of {spec.robot_id}, rad",
        )
    if "state.gripper" in keys:
        _obs_vector(
            ctx,
            "state.gripper",
            obs["state.gripper"],
            spec.gripper_dim,
            f"gripper joints of {spec.robot_id}",
        )
    if "state.base" in keys:
        what = "x m, y m, yaw rad" if spec.has_base else "zeros: this robot has no base"
        _obs_vector(ctx, "state.base", obs["state.base"], 3, what)
    if "state.ee_pose" in keys:
        _obs_ee_pose(ctx, obs["state.ee_pose"], spec)

    for key in sorted(k for k in keys if isinstance(k, str) and k.startswith("video.")):
        cam = key[len("video.") :]
        value = obs[key]
        want = spec.cameras.get(cam)
        if want is None:
            if strict:
                ctx.add(
                    key,
                    "a camera of " + spec.robot_id + " (" + ", ".join(spec.cameras) + ")",
                    "an unknown camera",
                )
            continue
        # JpegFrame (and any lazy frame) declares its shape without decoding: duck-type on it.
        shape = getattr(value, "shape", None)
        if shape is None:
            ctx.add(key, f"uint8 image of shape {want}", _describe(value))
            continue
        if tuple(shape) != tuple(want):
            ctx.add(key, f"uint8 image of shape {want}", f"shape {tuple(shape)}")
        dtype = getattr(value, "dtype", None)
        if dtype is not None and np.dtype(dtype) != np.uint8:
            ctx.add(key, "dtype uint8", f"dtype {dtype}")
    if strict:
        known = {*_OBS_SCALARS, *_OBS_STATE}
        for key in sorted(str(k) for k in keys):
            if key not in known and not key.startswith("video."):
                ctx.add(key, "no such observation key", "an unknown key")


def check_observation(
    robot: str | RobotSpec | None,
    obs: Any,
    *,
    strict: bool = False,
    worker: Any = None,
    step: int | None = None,
) -> list[Violation]:
    """Every problem of one observation (the real server's keys, see ``docs/protocol.md``).

    ``robot=None`` takes the robot from ``obs["robot_id"]``. Checked: ``instruction`` str,
    ``timestep`` int >= 0, ``reset`` bool, ``episode_id`` a safe ``bench/run/task/seed`` path,
    ``robot_id`` matches the robot, ``state.joints`` (joints_dim,), ``state.gripper``
    (gripper_dim,), ``state.base`` (3,) (float32 arrays, or lists of numbers: single-arm robots send
    ``[0.0, 0.0, 0.0]``), ``state.ee_pose`` per arm ``[pos(3), quat(4)]``, and every
    ``video.<camera>`` present has the spec's ``(H, W, 3)`` uint8 shape (an object with a
    ``.shape``, e.g. a still-encoded ``JpegFrame``, counts by its declared shape). Cameras may be
    absent (``--without_render``). ``strict`` also reports unknown cameras and unknown keys.
    The reset-pending placeholder ``{"reset": True, "reset_pending": True}`` is not an observation.
    """
    spec = None if robot is None else get_robot(robot)
    ctx = _Ctx(worker, step, None)
    _check_observation(spec, obs, ctx, strict)
    return ctx.out


def validate_observation(
    robot: str | RobotSpec | None,
    obs: Any,
    *,
    strict: bool = False,
    worker: Any = None,
    step: int | None = None,
) -> Any:
    """Raise ``ValidationError`` listing every problem of ``obs``; return ``obs`` unchanged."""
    problems = check_observation(robot, obs, strict=strict, worker=worker, step=step)
    if problems:
        raise ValidationError(problems)
    return obs
