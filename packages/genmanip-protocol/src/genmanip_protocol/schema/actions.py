"""Action dicts: the keys the server accepts and the validators that check them first.

The server itself validates nothing (a bad action is a 500 while the episode goes on), so every
action is checked here before it is sent: ``check_action`` lists the problems, ``validate_action``
and ``validate_chunk`` raise them all at once and return normalized copies.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ValidationError, Violation
from ..robots import RobotSpec, get_robot
from ._checks import _Ctx, _describe, _is_bool, _is_number, _short

__all__ = ["ACTION_KEYS", "CONTROL_TYPES", "check_action", "validate_action", "validate_chunk"]


#: Keys an action dict may carry.
ACTION_KEYS = ("action", "control_type", "is_rel", "base_motion", "base_is_rel")
#: Values of ``control_type`` the server accepts.
CONTROL_TYPES = ("joint_position", "ee_pose")
#: At most this many per-element violations are listed for one vector (then a summary).
_MAX_ELEMENT_VIOLATIONS = 8


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


def _close_key(key: Any, candidates: Sequence[Any]) -> Any:
    """The one of ``candidates`` that ``key`` most likely misspells (difflib), or None."""
    if not isinstance(key, str):
        return None
    names = [c for c in candidates if isinstance(c, str)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _check_action(spec: RobotSpec, action: Any, ctx: _Ctx) -> dict[str, Any] | None:
    if not isinstance(action, Mapping):
        ctx.add("action_dict", "a dict with keys 'action' and 'control_type'", _describe(action))
        return None
    out: dict[str, Any] = {}
    unknown = [key for key in action if key not in ACTION_KEYS]
    # A missing required key comes first: it is the problem, not "(and 1 more)" behind a typo.
    for key in ("action", "control_type"):
        if key not in action:
            typo = _close_key(key, unknown)
            ctx.add(key, "a required key", "missing" + (f" (is {_short(typo)} a typo of it?)" if typo else ""))
    for key in unknown:
        close = _close_key(key, [k for k in ACTION_KEYS if k not in action])
        ctx.add(
            str(key),
            "only the keys " + ", ".join(ACTION_KEYS),
            f"unknown key {_short(key)}" + (f" (did you mean {close!r}?)" if close else ""),
        )

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
