"""Schemas of the GenManip wire: actions, observations, server replies, metric keys, episode ids.

Validators come in pairs: ``check_*`` returns every :class:`~genmanip_protocol.errors.Violation`
found (empty list = valid), ``validate_*`` raises :class:`~genmanip_protocol.errors.ValidationError`
carrying all of them. Server replies are parsed by ``parse_*`` functions into small frozen
dataclasses; a reply of the wrong shape raises :class:`~genmanip_protocol.errors.ResponseError`
whose field names the exact place, e.g. ``response["1"].metric``.

The rules are the real server's (``docs/protocol.md``): the server itself validates nothing and
answers a bad action with a 500 while the episode goes on, so the client checks first.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from .errors import ResponseError, ValidationError, Violation
from .robots import RobotSpec, get_robot

__all__ = [
    "ACTION_KEYS",
    "CONTROL_TYPES",
    "STATUS_VALUES",
    "SUCCESS_TOL",
    "ChunkResponse",
    "EpisodeResult",
    "MetricKey",
    "ServerStatus",
    "TaskMetric",
    "WorkerEntry",
    "check_action",
    "check_observation",
    "is_success",
    "merge_metrics",
    "normalize_metric",
    "parse_chunk_response",
    "parse_episode_result",
    "parse_metric",
    "parse_metric_key",
    "parse_status",
    "parse_step_response",
    "parse_success_response",
    "parse_worker_entry",
    "safe_relative_path",
    "split_episode_id",
    "validate_action",
    "validate_chunk",
    "validate_observation",
]

log = logging.getLogger(__name__)

#: Keys an action dict may carry.
ACTION_KEYS = ("action", "control_type", "is_rel", "base_motion", "base_is_rel")
#: Values of ``control_type`` the server accepts.
CONTROL_TYPES = ("joint_position", "ee_pose")
#: Tolerance of the server's success rule ``score == 1``.
SUCCESS_TOL = 1e-6
#: At most this many per-element violations are listed for one vector (then a summary).
_MAX_ELEMENT_VIOLATIONS = 8

_Number = (int, float, np.integer, np.floating)


def is_success(score: float | None) -> bool:
    """The server's success rule: ``score == 1`` within 1e-6 (``None`` is not a success)."""
    return score is not None and abs(float(score) - 1.0) <= SUCCESS_TOL


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> str:
    """Say what a value *is*, for the 'got ...' part of a message."""
    if isinstance(value, np.ndarray):
        return f"numpy array of shape {tuple(value.shape)} dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} values"
    if isinstance(value, (bool, np.bool_)):
        return f"bool {bool(value)}"
    if isinstance(value, _Number):
        return f"{type(value).__name__} {value!r}"
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"str {_short(value)}"
    return type(value).__name__


def _is_number(x: Any) -> bool:
    return isinstance(x, _Number) and not isinstance(x, (bool, np.bool_))


def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


class _Ctx:
    """Where violations are attached: worker, step, location."""

    __slots__ = ("location", "out", "step", "worker")

    def __init__(self, worker: Any, step: int | None, location: str | None) -> None:
        self.worker = None if worker is None else str(worker)
        self.step = step
        self.location = location
        self.out: list[Violation] = []

    def add(self, field_: str, expected: str, actual: str) -> None:
        self.out.append(
            Violation(
                field_,
                expected,
                actual,
                worker=self.worker,
                step=self.step,
                location=self.location,
            )
        )


def _vector(
    ctx: _Ctx,
    name: str,
    value: Any,
    n: int,
    what: str,
    *,
    allow_array: bool = True,
    array_note: str = "",
) -> list[float] | None:
    """Check a flat vector of ``n`` finite numbers; return it as floats (``None`` if invalid)."""
    expected = f"{n} finite floats ({what})"
    if isinstance(value, np.ndarray):
        if not allow_array:
            ctx.add(name, f"a Python list {array_note}".rstrip(), _describe(value))
            return None
        if value.ndim != 1:
            ctx.add(name, expected, f"numpy array of shape {tuple(value.shape)}")
            return None
        if value.dtype.kind not in "iuf":
            ctx.add(name, expected, f"numpy array of dtype {value.dtype}")
            return None
        if value.shape[0] == n and bool(np.isfinite(value).all()):
            return [float(x) for x in value.tolist()]  # fast path: one vectorized check
        items: Sequence[Any] = value.tolist()
    elif isinstance(value, (list, tuple)):
        items = value
        if len(items) == n and all(type(x) is float for x in items):
            if all(map(math.isfinite, items)):
                return list(items)  # fast path: plain finite floats
    else:
        ctx.add(name, expected, _describe(value))
        return None
    if len(items) != n:
        if any(isinstance(x, (list, tuple, np.ndarray)) for x in items):
            ctx.add(name, expected, f"a nested sequence of {len(items)} items")
        else:
            ctx.add(name, expected, f"{len(items)} values")
        return None
    out: list[float] = []
    bad = 0
    for i, x in enumerate(items):
        if not _is_number(x):
            bad += 1
            if bad <= _MAX_ELEMENT_VIOLATIONS:
                ctx.add(f"{name}[{i}]", "a finite float", _describe(x))
            continue
        f = float(x)
        if not math.isfinite(f):
            bad += 1
            if bad <= _MAX_ELEMENT_VIOLATIONS:
                ctx.add(f"{name}[{i}]", "a finite float", repr(f))
            continue
        out.append(f)
    if bad > _MAX_ELEMENT_VIOLATIONS:
        ctx.add(name, expected, f"{bad} bad values in total")
    return out if bad == 0 else None


def _ee_arm(
    ctx: _Ctx, name: str, value: Any, spec: RobotSpec, absolute: bool
) -> list[list[float]] | None:
    """One arm's ee_pose: ``[pos(3), quat_wxyz(4), gripper(dof)]``."""
    what_arm = f"[position(3), quaternion_wxyz(4), gripper({spec.gripper_dof})]"
    if isinstance(value, np.ndarray) and absolute:
        ctx.add(name, f"a Python list {what_arm} (absolute ee_pose)", _describe(value))
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        ctx.add(name, f"3 parts {what_arm}", _describe(value))
        return None
    note = "(absolute ee_pose parts must be lists; the server fails on numpy arrays)"
    parts = [
        _vector(
            ctx,
            f"{name}[0]",
            value[0],
            3,
            "position xyz in m",
            allow_array=not absolute,
            array_note=note,
        ),
        _vector(
            ctx,
            f"{name}[1]",
            value[1],
            4,
            "quaternion w,x,y,z",
            allow_array=not absolute,
            array_note=note,
        ),
        _vector(
            ctx,
            f"{name}[2]",
            value[2],
            spec.gripper_dof,
            "gripper joints",
            allow_array=not absolute,
            array_note=note,
        ),
    ]
    quat = parts[1]
    if quat is not None and math.sqrt(sum(q * q for q in quat)) < 1e-9:
        ctx.add(f"{name}[1]", "a quaternion with non-zero norm", _short(quat))
        return None
    if any(p is None for p in parts):
        return None
    return [p for p in parts if p is not None]


def _check_action(spec: RobotSpec, action: Any, ctx: _Ctx) -> dict[str, Any] | None:
    if not isinstance(action, Mapping):
        ctx.add("action_dict", "a dict with keys 'action' and 'control_type'", _describe(action))
        return None
    out: dict[str, Any] = {}
    for key in action:
        if key not in ACTION_KEYS:
            ctx.add(
                str(key), "only the keys " + ", ".join(ACTION_KEYS), f"unknown key {_short(key)}"
            )
    for key in ("action", "control_type"):
        if key not in action:
            ctx.add(key, "a required key", "missing")

    is_rel = action.get("is_rel")
    if "is_rel" in action:
        if _is_bool(is_rel):
            out["is_rel"] = bool(is_rel)
        else:
            ctx.add("is_rel", "a bool", _describe(is_rel))

    ctype = action.get("control_type")
    if "control_type" in action:
        if ctype not in CONTROL_TYPES:
            ctx.add("control_type", "one of " + ", ".join(CONTROL_TYPES), _describe(ctype))
        else:
            out["control_type"] = ctype

    if "action" in action and ctype in CONTROL_TYPES:
        value = action["action"]
        if ctype == "joint_position":
            vec = _vector(
                ctx, "action", value, spec.action_dim, f"joint_position for {spec.robot_id}"
            )
            if vec is not None:
                out["action"] = vec
        else:
            # The server's default (-ira off) is absolute, so an absent is_rel counts as absolute.
            absolute = not bool(is_rel) if _is_bool(is_rel) else True
            if spec.dual_arm:
                if isinstance(value, np.ndarray) and absolute:
                    ctx.add(
                        "action", "a Python list [left, right] (absolute ee_pose)", _describe(value)
                    )
                elif not isinstance(value, (list, tuple)) or len(value) != 2:
                    ctx.add(
                        "action",
                        f"2 arms [left, right] (ee_pose for {spec.robot_id})",
                        _describe(value),
                    )
                else:
                    arms = [
                        _ee_arm(ctx, f"action[{i}]", value[i], spec, absolute) for i in range(2)
                    ]
                    if all(a is not None for a in arms):
                        out["action"] = arms
            else:
                arm = _ee_arm(ctx, "action", value, spec, absolute)
                if arm is not None:
                    out["action"] = arm

    if "base_motion" in action:
        bm = _vector(ctx, "base_motion", action["base_motion"], 3, "x m, y m, yaw degrees")
        if bm is not None:
            if not spec.dual_arm and any(v != 0.0 for v in bm):
                ctx.add(
                    "base_motion",
                    f"[0, 0, 0] ({spec.robot_id} has no mobile base; a "
                    "non-zero base_motion is ignored by the server)",
                    _short(bm),
                )
            else:
                out["base_motion"] = bm
    elif spec.dual_arm:
        out["base_motion"] = [0.0, 0.0, 0.0]

    if "base_is_rel" in action:
        bir = action["base_is_rel"]
        if _is_bool(bir):
            out["base_is_rel"] = bool(bir)
        else:
            ctx.add("base_is_rel", "a bool", _describe(bir))
    elif spec.dual_arm:
        out["base_is_rel"] = True
    return out


def check_action(
    robot: str | RobotSpec,
    action: Any,
    *,
    worker: Any = None,
    step: int | None = None,
    location: str | None = None,
) -> list[Violation]:
    """Every problem of one action dict for ``robot`` (empty list = the server accepts it).

    Rules: ``action`` and ``control_type`` are required; ``joint_position`` is a flat vector of
    ``robot.action_dim`` finite numbers (list, tuple or 1-D numeric array); ``ee_pose`` is
    ``[pos(3), quat_wxyz(4), gripper(gripper_dof)]`` per arm (``[left, right]`` for dual-arm
    robots), quaternion of non-zero norm, parts as Python lists when absolute; ``is_rel`` and
    ``base_is_rel`` are bools; ``base_motion`` is 3 finite numbers ``[x m, y m, yaw deg]`` and must
    be zero on single-arm robots (the server ignores it there); no other key.
    """
    spec = get_robot(robot)
    ctx = _Ctx(worker, step, location)
    _check_action(spec, action, ctx)
    return ctx.out


def validate_action(
    robot: str | RobotSpec,
    action: Any,
    *,
    worker: Any = None,
    step: int | None = None,
    location: str | None = None,
) -> dict[str, Any]:
    """Validate one action dict; return a normalized copy, or raise ``ValidationError`` (all problems).

    The copy has ``action`` as a list of Python floats (``joint_position``) or nested lists
    (``ee_pose``), ``control_type``, ``is_rel`` only when given (absent = the server's
    ``-ira`` flag decides), and for dual-arm robots ``base_motion`` (default ``[0.0, 0.0, 0.0]``)
    and ``base_is_rel`` (default ``True``). Single-arm robots get no base keys unless given.
    The copy pickles to plain builtins, which is what the server expects.
    """
    spec = get_robot(robot)
    ctx = _Ctx(worker, step, location)
    out = _check_action(spec, action, ctx)
    if ctx.out or out is None:
        raise ValidationError(ctx.out)
    # Stable key order: the order the server documents.
    return {k: out[k] for k in ACTION_KEYS if k in out}


def validate_chunk(
    robot: str | RobotSpec,
    chunk: Any,
    *,
    worker: Any = None,
    step: int | None = None,
) -> list[dict[str, Any]]:
    """Validate a chunk (a non-empty list of action dicts); return the normalized copies.

    Violations carry ``location="chunk[i]"``; ``step`` (if given) is the step of the chunk's first
    action and is advanced per element.
    """
    if isinstance(chunk, Mapping) or not isinstance(chunk, (list, tuple)) or not chunk:
        actual = "an empty list" if isinstance(chunk, (list, tuple)) else _describe(chunk)
        raise ValidationError(
            Violation(
                "chunk",
                "a non-empty list of action dicts",
                actual,
                worker=None if worker is None else str(worker),
                step=step,
            )
        )
    spec = get_robot(robot)
    violations: list[Violation] = []
    out: list[dict[str, Any]] = []
    for i, action in enumerate(chunk):
        ctx = _Ctx(worker, None if step is None else step + i, f"chunk[{i}]")
        norm = _check_action(spec, action, ctx)
        violations.extend(ctx.out)
        if norm is not None and not ctx.out:
            out.append({k: norm[k] for k in ACTION_KEYS if k in norm})
    if violations:
        raise ValidationError(violations)
    return out


# --------------------------------------------------------------------------------------------
# Observations

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
        elif ts < 0:
            ctx.add("timestep", "an int >= 0", repr(int(ts)))
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


# --------------------------------------------------------------------------------------------
# Episode ids and safe paths

_DRIVE = re.compile(r"^[A-Za-z]:")
_MAX_SEGMENT_BYTES = 255
_MAX_PATH_BYTES = 4096


def safe_relative_path(value: Any, *, field: str = "episode_id") -> PurePosixPath:
    """Return ``value`` as a relative POSIX path that cannot leave the directory it is joined to.

    Rejected (``ValidationError`` naming ``field``): non-strings, empty strings, absolute paths,
    ``..``, ``.`` and empty segments (``a//b``, a trailing ``/``), NUL and other control
    characters, backslashes, drive letters (``C:``), segments over 255 bytes and paths over 4096
    bytes (UTF-8). Used before writing anything under the results root because a server said so.
    """

    def bad(expected: str, actual: str) -> ValidationError:
        return ValidationError(Violation(field, expected, actual))

    if not isinstance(value, str):
        raise bad("a relative path string", _describe(value))
    if not value:
        raise bad("a non-empty relative path", "an empty string")
    for ch in value:
        if ord(ch) < 32 or ord(ch) == 127:
            raise bad("a path without control characters", f"{_short(value)} (contains {ch!r})")
    if "\\" in value:
        raise bad("a path without backslashes", _short(value))
    if value.startswith("/"):
        raise bad("a relative path", f"absolute path {_short(value)}")
    if _DRIVE.match(value):
        raise bad("a relative path", f"drive-letter path {_short(value)}")
    if len(value.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        raise bad(
            f"at most {_MAX_PATH_BYTES} bytes",
            f"{len(value.encode('utf-8', 'surrogatepass'))} bytes",
        )
    segments = value.split("/")
    for seg in segments:
        if seg in ("", ".", ".."):
            shown = "an empty segment" if seg == "" else f"a {seg!r} segment"
            raise bad("a path without empty, '.' or '..' segments", f"{_short(value)} ({shown})")
        if _DRIVE.match(seg):
            raise bad("a path without drive letters", f"{_short(value)} (segment {_short(seg)})")
        if len(seg.encode("utf-8", "surrogatepass")) > _MAX_SEGMENT_BYTES:
            raise bad(
                f"segments of at most {_MAX_SEGMENT_BYTES} bytes",
                f"a segment of {len(seg.encode('utf-8', 'surrogatepass'))} bytes",
            )
    return PurePosixPath(*segments)


def split_episode_id(episode_id: Any, *, task_name: str | None = None) -> tuple[str, str, str, str]:
    """Split ``<benchmark>/<run_id>/<task_name>/<seed>`` into its four parts.

    Task names contain ``/`` and start with the benchmark id (``ebench/...``), which is how a
    run id containing ``/`` is told apart; pass ``task_name`` (e.g. from ``episode_result``) to
    split exactly. Raises ``ValidationError`` naming ``episode_id`` for unsafe or short ids.
    """
    parts = safe_relative_path(episode_id).parts
    if len(parts) < 4:
        raise ValidationError(
            Violation(
                "episode_id",
                "<benchmark>/<run_id>/<task_name>/<seed> (at least 4 segments)",
                f"{_short(episode_id)} ({len(parts)} segments)",
            )
        )
    bench, seed = parts[0], parts[-1]
    middle = parts[1:-1]
    if task_name is not None:
        tparts = tuple(task_name.split("/"))
        n = len(tparts)
        if n >= len(middle) or middle[-n:] != tparts:
            raise ValidationError(
                Violation(
                    "episode_id", f"<benchmark>/<run_id>/{task_name}/<seed>", _short(episode_id)
                )
            )
        return bench, "/".join(middle[:-n]), task_name, seed
    split = 1
    for i in range(1, len(middle)):
        if middle[i] == bench:
            split = i
            break
    return bench, "/".join(middle[:split]), "/".join(middle[split:]), seed


# --------------------------------------------------------------------------------------------
# Metric keys and metrics

_METRIC_KEY = re.compile(r"^(?P<star>\*)?(?:\((?P<done>\d+)/(?P<total>\d+)\))?(?P<task>.*)$", re.S)


@dataclass(frozen=True)
class MetricKey:
    """A parsed metric key: ``*`` = not complete, ``(done/total)`` = progress.

    ``done``/``total`` are ``None`` when the key carries no count (``*task``: nothing finished,
    so ``done`` is 0; a bare ``task`` from an old server: both ``None``).
    """

    task: str
    done: int | None
    total: int | None
    complete: bool


def parse_metric_key(key: str) -> MetricKey:
    """``"*(3/60)ebench/x/y"`` -> ``MetricKey("ebench/x/y", 3, 60, False)``; ``"*ebench/x"`` ->
    done 0, total None; ``"(60/60)ebench/x"`` -> complete.

    Raises ``ResponseError`` (field ``metric key``) for a non-string or an empty task.
    """
    if not isinstance(key, str):
        raise ResponseError(Violation("metric key", "a str", _describe(key)))
    m = _METRIC_KEY.match(key)
    if m is None or not m.group("task").strip():
        raise ResponseError(Violation("metric key", "[*][(done/total)]<task_name>", _short(key)))
    star = m.group("star") is not None
    task = m.group("task")
    if m.group("done") is not None:
        done, total = int(m.group("done")), int(m.group("total"))
        return MetricKey(task, done, total, complete=not star and done >= total)
    if star:
        return MetricKey(task, 0, None, complete=False)
    return MetricKey(task, None, None, complete=False)


@dataclass(frozen=True)
class TaskMetric:
    """One task's entry of a ``metric`` dict: progress plus mean score and mean success."""

    task: str
    done: int | None
    total: int | None
    complete: bool
    score: float
    sr: float
    key: str = ""


def _metric_value(value: Any, where: str) -> tuple[float, float]:
    if _is_number(value):
        # Old servers sent a bare mean score per task.
        x = float(value)
        return x, 1.0 if is_success(x) else 0.0
    if not isinstance(value, Mapping):
        raise ResponseError(
            Violation(where, '{"score": float, "sr": float} or a float', _describe(value))
        )
    if "score" not in value:
        raise ResponseError(Violation(f"{where}.score", "a number", "missing"))
    score = value["score"]
    if not _is_number(score):
        raise ResponseError(Violation(f"{where}.score", "a number", _describe(score)))
    sr_val = value.get("sr", value.get("success_rate"))
    if sr_val is None:
        sr = 1.0 if is_success(float(score)) else 0.0
    elif _is_number(sr_val) or _is_bool(sr_val):
        sr = float(sr_val)
    else:
        raise ResponseError(Violation(f"{where}.sr", "a number", _describe(sr_val)))
    return float(score), sr


def normalize_metric(metric: Any, *, where: str = "metric") -> dict[str, dict[str, float]] | None:
    """Return ``metric`` in the dict form ``{key: {"score", "sr"}}`` (bare floats converted)."""
    if metric is None:
        return None
    if not isinstance(metric, Mapping):
        raise ResponseError(
            Violation(where, "a dict {task_key: {score, sr}} or None", _describe(metric))
        )
    out: dict[str, dict[str, float]] = {}
    for k, v in metric.items():
        if not isinstance(k, str):
            raise ResponseError(Violation(f"{where} key", "a str", _describe(k)))
        score, sr = _metric_value(v, f"{where}[{k!r}]")
        out[k] = {"score": score, "sr": sr}
    return out


def parse_metric(metric: Any, *, where: str = "metric") -> dict[str, TaskMetric]:
    """Parse a ``metric`` dict into ``{task_name: TaskMetric}``; nothing is dropped.

    Accepts the dict form and old float values. If two keys name the same task (progress of two
    moments), the one with more finished episodes wins and a warning is logged.
    """
    norm = normalize_metric(metric, where=where) or {}
    out: dict[str, TaskMetric] = {}
    for k, v in norm.items():
        mk = parse_metric_key(k)
        tm = TaskMetric(mk.task, mk.done, mk.total, mk.complete, v["score"], v["sr"], key=k)
        prev = out.get(mk.task)
        if prev is not None:
            log.warning("metric has two keys for task %s: %r and %r", mk.task, prev.key, k)
            if (prev.done or 0) >= (tm.done or 0) and not tm.complete:
                continue
        out[mk.task] = tm
    return out


def merge_metrics(*metrics: Any) -> dict[str, TaskMetric]:
    """Merge the ``metric`` dicts of several workers (each holds the whole run's view).

    Per task the most advanced entry wins (complete first, then more finished episodes).
    """
    out: dict[str, TaskMetric] = {}
    for metric in metrics:
        for task, tm in parse_metric(metric).items():
            prev = out.get(task)
            if prev is None or (tm.complete, tm.done or 0) > (prev.complete, prev.done or 0):
                out[task] = tm
    return out


# --------------------------------------------------------------------------------------------
# Episode results and per-worker reply entries


@dataclass(frozen=True)
class EpisodeResult:
    """A finished episode as the server reports it (``episode_result``, ``result_info.json``).

    ``score`` is in [0, 1] (partial credit possible); ``sr`` is 1.0 exactly when the score is 1.
    """

    episode_id: str
    task_name: str
    seed: str
    score: float
    sr: float

    @property
    def success(self) -> bool:
        """``score == 1`` within 1e-6 (the server's rule)."""
        return is_success(self.score)

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "task_name": self.task_name,
            "seed": self.seed,
            "score": self.score,
            "sr": self.sr,
        }


def parse_episode_result(data: Any, *, where: str = "episode_result") -> EpisodeResult | None:
    """Parse an ``episode_result`` dict (``sr`` or ``success_rate`` accepted); ``None`` stays None.

    ``task_name``/``seed`` missing are taken from ``episode_id``.
    """
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ResponseError(Violation(where, "a dict or None", _describe(data)))
    eid = data.get("episode_id")
    if not isinstance(eid, str):
        raise ResponseError(
            Violation(f"{where}.episode_id", "a str", "missing" if eid is None else _describe(eid))
        )
    score = data.get("score")
    if not _is_number(score):
        raise ResponseError(
            Violation(
                f"{where}.score", "a number", "missing" if score is None else _describe(score)
            )
        )
    task = data.get("task_name")
    seed = data.get("seed")
    if task is not None and not isinstance(task, str):
        raise ResponseError(Violation(f"{where}.task_name", "a str", _describe(task)))
    if (seed is not None and not isinstance(seed, (str, int))) or _is_bool(seed):
        raise ResponseError(Violation(f"{where}.seed", "a str", _describe(seed)))
    if task is None or seed is None:
        try:
            _, _, t, s = split_episode_id(eid, task_name=task)
        except ValidationError as exc:
            raise ResponseError(
                [Violation(f"{where}.{v.field}", v.expected, v.actual) for v in exc.violations]
            ) from None
        task = task if task is not None else t
        seed = seed if seed is not None else s
    score_f = float(score)  # type: ignore[arg-type]  # _is_number checked it above
    sr_val = data.get("sr", data.get("success_rate"))
    if sr_val is None:
        sr = 1.0 if is_success(score_f) else 0.0
    elif _is_number(sr_val) or _is_bool(sr_val):
        sr = float(sr_val)
    else:
        raise ResponseError(Violation(f"{where}.sr", "a number", _describe(sr_val)))
    return EpisodeResult(eid, str(task), str(seed), score_f, sr)


@dataclass(frozen=True)
class WorkerEntry:
    """One worker's entry of a ``/reset``, ``/reset_result``, ``/step`` or ``/step_chunk`` reply.

    Attributes:
        worker_id: the id as a string.
        obs: the observation mapping, or ``None`` (worker finished, or a reset is pending: the
            placeholder ``{"reset": True, "reset_pending": True}`` is not passed on).
        metric: the run's metric dict in dict form (old float values converted), or ``None``.
        episode_result: the episode that just finished (results arrive one hop late), or ``None``.
        reset_pending: a background reset is running; poll ``/reset_result``.
        lock_lost: the server lost this worker's episode lock and moved it to the next task.
    """

    worker_id: str
    obs: Mapping[str, Any] | None
    metric: dict[str, dict[str, float]] | None
    episode_result: EpisodeResult | None
    reset_pending: bool = False
    lock_lost: bool = False

    @property
    def finished(self) -> bool:
        """The worker has nothing left to do: no observation and no reset pending."""
        return self.obs is None and not self.reset_pending

    @property
    def is_first(self) -> bool:
        """The observation is the first of an episode (``obs["reset"]`` is true)."""
        return self.obs is not None and bool(self.obs.get("reset", False))


def parse_worker_entry(worker_id: Any, entry: Any, *, where: str | None = None) -> WorkerEntry:
    """Parse one worker's reply entry (every documented form: normal, pending, reset finished,
    lock lost, worker finished). Raises ``ResponseError`` naming e.g. ``response["1"].metric``."""
    wid = str(worker_id)
    w = where or f"response[{wid!r}]".replace("'", '"')
    if not isinstance(entry, Mapping):
        raise ResponseError(Violation(w, "a dict {obs, metric, episode_result}", _describe(entry)))
    if "obs" not in entry:
        raise ResponseError(Violation(f"{w}.obs", "a key (observation or None)", "missing"))
    obs = entry["obs"]
    if obs is not None and not isinstance(obs, Mapping):
        raise ResponseError(Violation(f"{w}.obs", "an observation mapping or None", _describe(obs)))
    pending = entry.get("reset_pending", False)
    if not _is_bool(pending):
        raise ResponseError(Violation(f"{w}.reset_pending", "a bool", _describe(pending)))
    pending = bool(pending) or bool(obs is not None and obs.get("reset_pending") is True)
    lock_lost = entry.get("lock_lost", False)
    if not _is_bool(lock_lost):
        raise ResponseError(Violation(f"{w}.lock_lost", "a bool", _describe(lock_lost)))
    metric = normalize_metric(entry.get("metric"), where=f"{w}.metric")
    result = parse_episode_result(entry.get("episode_result"), where=f"{w}.episode_result")
    return WorkerEntry(
        worker_id=wid,
        obs=None if pending else obs,
        metric=metric,
        episode_result=result,
        reset_pending=pending,
        lock_lost=bool(lock_lost),
    )


def _parse_entries(
    data: Any, expected_workers: Iterable[Any] | None, where: str
) -> dict[str, WorkerEntry]:
    if not isinstance(data, Mapping):
        raise ResponseError(Violation(where, "a dict {worker_id: entry}", _describe(data)))
    entries: dict[str, WorkerEntry] = {}
    for k, v in data.items():
        wid = str(k)
        entries[wid] = parse_worker_entry(wid, v, where=f'{where}["{wid}"]')
    if expected_workers is not None:
        missing = [str(w) for w in expected_workers if str(w) not in entries]
        if missing:
            got = ", ".join(sorted(entries)) or "none"
            raise ResponseError(
                [
                    Violation(
                        f'{where}["{m}"]',
                        f"an entry for worker {m}",
                        f"missing (workers in reply: {got})",
                        worker=m,
                    )
                    for m in missing
                ]
            )
    return entries


def parse_step_response(
    data: Any, expected_workers: Iterable[Any] | None = None
) -> dict[str, WorkerEntry]:
    """Parse a ``/reset``, ``/reset_result`` or ``/step`` reply ``{worker_id: entry}``.

    Keys are returned as strings. A worker of ``expected_workers`` missing from the reply, a
    non-dict entry or a field of the wrong type raises ``ResponseError`` naming the field.
    """
    return _parse_entries(data, expected_workers, "response")


@dataclass(frozen=True)
class ChunkResponse:
    """A ``/step_chunk`` reply: the entries of the last executed step and how far it got."""

    entries: dict[str, WorkerEntry]
    executed_steps: int
    stopped_early: bool


def parse_chunk_response(data: Any, expected_workers: Iterable[Any] | None = None) -> ChunkResponse:
    """Parse ``{"obs": {wid: entry}, "executed_steps": int, "stopped_early": bool}``."""
    if not isinstance(data, Mapping):
        raise ResponseError(
            Violation("response", "a dict {obs, executed_steps, stopped_early}", _describe(data))
        )
    if "obs" not in data:
        raise ResponseError(Violation("response.obs", "a dict {worker_id: entry}", "missing"))
    entries = _parse_entries(data["obs"], expected_workers, "response.obs")
    ex = data.get("executed_steps")
    if not isinstance(ex, (int, np.integer)) or _is_bool(ex) or ex < 0:
        raise ResponseError(
            Violation(
                "response.executed_steps", "an int >= 0", "missing" if ex is None else _describe(ex)
            )
        )
    se = data.get("stopped_early")
    if not _is_bool(se):
        raise ResponseError(
            Violation(
                "response.stopped_early", "a bool", "missing" if se is None else _describe(se)
            )
        )
    return ChunkResponse(entries, int(ex), bool(se))


def parse_success_response(payload: Any, *, route: str = "") -> None:
    """Check a JSON control reply ``{"data": {"success": true}}`` (``/start_new_job``,
    ``/create_workers``, ``/kill``); raise ``ResponseError`` otherwise."""
    where = f"{route} response" if route else "response"
    data = payload.get("data") if isinstance(payload, Mapping) else None
    if not isinstance(data, Mapping):
        raise ResponseError(Violation(f"{where}.data", '{"success": true}', _describe(payload)))
    if data.get("success") is not True:
        raise ResponseError(Violation(f"{where}.data.success", "true", _short(data.get("success"))))


# --------------------------------------------------------------------------------------------
# /status

STATUS_VALUES = ("idle", "running", "complete", "incomplete")


@dataclass(frozen=True)
class ServerStatus:
    """``GET /status``.

    ``mean_scores`` is the server's ``results``: per task the MEAN SCORE (not a success rate,
    whatever the reference client printed). ``status`` is one of ``idle``, ``running``,
    ``complete``, ``incomplete`` (an unknown value of a newer server is kept as is).
    """

    status: str
    benchmark_id: str | None
    run_id: str | None
    total_episodes: int
    completed_episodes: int
    in_progress_episodes: int
    active_workers: tuple[str, ...]
    mean_scores: dict[str, float]
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def progress(self) -> float | None:
        """Completed fraction in [0, 1], or ``None`` when no episodes are configured."""
        if self.total_episodes <= 0:
            return None
        return min(1.0, self.completed_episodes / self.total_episodes)


def parse_status(payload: Any) -> ServerStatus:
    """Parse a ``/status`` reply ``{"data": {...}}`` (a bare ``{...}`` is accepted too).

    Fields missing in older servers default to 0 / empty; wrong types raise ``ResponseError``
    naming ``status.data.<field>``.
    """
    if isinstance(payload, Mapping) and isinstance(payload.get("data"), Mapping):
        data = payload["data"]
    elif isinstance(payload, Mapping) and "status" in payload:
        data = payload
    else:
        raise ResponseError(
            Violation("status.data", "a dict with a 'status' field", _describe(payload))
        )
    w = "status.data"
    st = data.get("status")
    if not isinstance(st, str):
        raise ResponseError(
            Violation(
                f"{w}.status",
                "one of " + ", ".join(STATUS_VALUES),
                "missing" if st is None else _describe(st),
            )
        )

    def opt_str(name: str) -> str | None:
        v = data.get(name)
        if v is not None and not isinstance(v, str):
            raise ResponseError(Violation(f"{w}.{name}", "a str or null", _describe(v)))
        return v

    def count(name: str) -> int:
        v = data.get(name, 0)
        if v is None:
            return 0
        if not isinstance(v, (int, np.integer)) or _is_bool(v) or v < 0:
            raise ResponseError(Violation(f"{w}.{name}", "an int >= 0", _describe(v)))
        return int(v)

    workers = data.get("active_workers", [])
    if workers is None:
        workers = []
    if not isinstance(workers, (list, tuple)):
        raise ResponseError(
            Violation(f"{w}.active_workers", "a list of worker ids", _describe(workers))
        )
    results = data.get("results", {})
    if results is None:
        results = {}
    if not isinstance(results, Mapping):
        raise ResponseError(
            Violation(f"{w}.results", "a dict {task: mean score}", _describe(results))
        )
    scores: dict[str, float] = {}
    for k, v in results.items():
        if not _is_number(v):
            raise ResponseError(Violation(f"{w}.results[{k!r}]", "a number", _describe(v)))
        scores[str(k)] = float(v)
    return ServerStatus(
        status=st,
        benchmark_id=opt_str("benchmark_id"),
        run_id=opt_str("run_id"),
        total_episodes=count("total_episodes"),
        completed_episodes=count("completed_episodes"),
        in_progress_episodes=count("in_progress_episodes"),
        active_workers=tuple(str(x) for x in workers),
        mean_scores=scores,
        raw=dict(data),
    )
