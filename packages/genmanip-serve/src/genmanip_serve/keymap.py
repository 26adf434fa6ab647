"""Key maps: how a GenManip observation becomes an openpi server's input, and its reply an action.

An openpi-compatible server that does not speak GenManip keys (a stock openpi policy server)
wants its own observation keys and answers ``actions`` of shape ``(horizon, dim)``. A key map is
a small TOML file (``--policy-arg keymap=PATH``)::

    [observation]                       # GenManip key -> the server's key
    "video.top_camera_view" = "observation/image"
    "video.left_camera_view" = "observation/wrist_image"
    "state.joints" = "observation/state"
    "state.gripper" = "observation/state"   # same target: concatenated, in file order
    instruction = "prompt"

    [action]                            # how one row of `actions` becomes a GenManip action
    robot = "manip/franka/panda_hand"   # optional: default each observation's robot_id
    control_type = "joint_position"     # or "ee_pose" (per arm x, y, z, qw, qx, qy, qz)
    arm = [0, 7]                        # [start, stop) of the row: arm values of every arm
    gripper = [7, 9]                    # gripper joints of every arm
    base = [9, 12]                      # optional, mobile robots: base_motion [x, y, yaw]
    is_rel = false                      # default false
    base_is_rel = true                  # default true

Only mapped observation keys are sent. The slice lengths are checked against the robot's
:class:`genmanip_protocol.robots.RobotSpec` (at load when ``robot`` is given, else at the first
observation); a slice beyond the server's ``dim`` is refused at the first reply. Every problem is
a :class:`~genmanip_serve.errors.KeyMapError` whose ``key`` names the entry.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from genmanip_protocol.errors import ValidationError
from genmanip_protocol.robots import RobotSpec, get_robot
from genmanip_protocol.schema import CONTROL_TYPES

from .errors import KeyMapError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["KeyMap", "load_keymap"]

_TOP = ("observation", "action")
_ACTION_KEYS = ("robot", "control_type", "arm", "gripper", "base", "is_rel", "base_is_rel")
_POSE = 7  # x, y, z, qw, qx, qy, qz


@dataclass(frozen=True)
class KeyMap:
    """A parsed key map (see the module docstring).

    Attributes:
        observation: ``(genmanip_key, server_key)`` pairs, in file order.
        robot: the robot id the action split is checked against (None: the observation's).
        control_type: ``"joint_position"`` or ``"ee_pose"``.
        arm, gripper, base: half-open ``(start, stop)`` column ranges of an ``actions`` row
            (``base`` None for fixed robots).
        is_rel, base_is_rel: the flags of every produced action.
        source: where it was read from (for messages).
    """

    observation: tuple[tuple[str, str], ...]
    robot: str | None
    control_type: str
    arm: tuple[int, int]
    gripper: tuple[int, int]
    base: tuple[int, int] | None
    is_rel: bool
    base_is_rel: bool
    source: str = "<keymap>"

    # ---------------------------------------------------------------- observation

    def map_observation(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """The server's input for ``obs``: only the mapped keys, concatenated where several
        GenManip keys share a target (1-D float64 then)."""
        groups: dict[str, list[tuple[str, Any]]] = {}
        for src, dst in self.observation:
            if src not in obs:
                have = ", ".join(sorted(str(k) for k in obs.keys()))[:400]
                raise KeyMapError(
                    f"{self.source}: [observation] {src!r}: the observation has no such key "
                    f"(it has: {have})",
                    key=f"observation.{src}",
                )
            groups.setdefault(dst, []).append((src, obs[src]))
        out: dict[str, Any] = {}
        for dst, parts in groups.items():
            if len(parts) == 1:
                value = parts[0][1]
                decode = getattr(value, "decode", None)
                out[dst] = np.asarray(decode()) if callable(decode) and not isinstance(value, (bytes, str)) else value
                continue
            vecs = []
            for src, value in parts:
                try:
                    vecs.append(np.asarray(value, dtype=np.float64).reshape(-1))
                except (TypeError, ValueError):
                    raise KeyMapError(
                        f"{self.source}: [observation] {src!r} -> {dst!r}: keys sharing a target are "
                        f"concatenated, but {src!r} is not numeric",
                        key=f"observation.{src}",
                    ) from None
            out[dst] = np.concatenate(vecs)
        return out

    # ---------------------------------------------------------------- actions

    def check_robot(self, robot: RobotSpec) -> None:
        """Refuse slices whose lengths do not fit ``robot``."""
        arms = robot.n_arms * (robot.arm_dof if self.control_type == "joint_position" else _POSE)
        what = "arm joints" if self.control_type == "joint_position" else "pose values (x,y,z,qw,qx,qy,qz)"
        self._len("arm", self.arm, arms, f"{arms} {what} of {robot.robot_id}")
        self._len("gripper", self.gripper, robot.gripper_dim,
                  f"{robot.gripper_dim} gripper joints of {robot.robot_id}")
        if self.base is not None and not robot.has_base:
            raise KeyMapError(f"{self.source}: [action] base: {robot.robot_id} has no mobile base",
                              key="action.base")
        if self.base is not None:
            self._len("base", self.base, 3, "3 base values [x, y, yaw]")

    def _len(self, name: str, sl: tuple[int, int], n: int, what: str) -> None:
        if sl[1] - sl[0] != n:
            raise KeyMapError(
                f"{self.source}: [action] {name} = [{sl[0]}, {sl[1]}] has {sl[1] - sl[0]} columns; "
                f"expected {what}",
                key=f"action.{name}",
            )

    def split(self, actions: Any, robot_id: Any) -> list[dict[str, Any]]:
        """GenManip action dicts, one per row of ``actions`` (shape ``(horizon, dim)``)."""
        rid = self.robot or (str(robot_id) if robot_id else None)
        if rid is None:
            raise KeyMapError(
                f"{self.source}: [action] robot: the observation has no robot_id; set robot = ...",
                key="action.robot",
            )
        try:
            robot = get_robot(rid)
        except ValidationError as exc:
            raise KeyMapError(f"{self.source}: [action] robot: {exc}", key="action.robot") from None
        self.check_robot(robot)
        arr = np.asarray(actions, dtype=np.float64)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[0] < 1:
            raise KeyMapError(
                f"{self.source}: the server's 'actions' has shape {tuple(arr.shape)}; expected "
                "(horizon, dim)",
                key="action",
            )
        dim = arr.shape[1]
        for name, sl in (("arm", self.arm), ("gripper", self.gripper), ("base", self.base)):
            if sl is not None and sl[1] > dim:
                raise KeyMapError(
                    f"{self.source}: [action] {name} = [{sl[0]}, {sl[1]}] is beyond the server's "
                    f"action dim {dim}",
                    key=f"action.{name}",
                )
        return [self._row(robot, row) for row in arr]

    def _row(self, robot: RobotSpec, row: np.ndarray) -> dict[str, Any]:
        arm = [float(x) for x in row[self.arm[0]:self.arm[1]]]
        grip = [float(x) for x in row[self.gripper[0]:self.gripper[1]]]
        action: dict[str, Any] = {"control_type": self.control_type, "is_rel": self.is_rel}
        if self.control_type == "joint_position":
            action["action"] = robot.merge_joint_state(arm, grip)
        else:
            g = robot.gripper_dof
            per_arm = [
                [arm[i * _POSE:i * _POSE + 3], arm[i * _POSE + 3:(i + 1) * _POSE], grip[i * g:(i + 1) * g]]
                for i in range(robot.n_arms)
            ]
            action["action"] = per_arm if robot.dual_arm else per_arm[0]
        if self.base is not None:
            action["base_motion"] = [float(x) for x in row[self.base[0]:self.base[1]]]
            action["base_is_rel"] = self.base_is_rel
        return action


def _slice(source: str, table: Mapping[str, Any], name: str, required: bool) -> tuple[int, int] | None:
    value = table.get(name)
    if value is None:
        if required:
            raise KeyMapError(f"{source}: [action] {name} is missing: give [start, stop]",
                              key=f"action.{name}")
        return None
    if (
        not isinstance(value, list) or len(value) != 2
        or not all(type(v) is int for v in value) or not 0 <= value[0] < value[1]
    ):
        raise KeyMapError(
            f"{source}: [action] {name} = {value!r}: expected [start, stop] with 0 <= start < stop",
            key=f"action.{name}",
        )
    return (value[0], value[1])


def load_keymap(path: str | Path) -> KeyMap:
    """Read and check a key map file (see the module docstring).

    Raises:
        KeyMapError: the file is unreadable, not TOML, or an entry is wrong (``key`` names it).
    """
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeyMapError(f"keymap {source}: cannot read it: {exc.strerror or exc}", key="<file>") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise KeyMapError(f"keymap {source}: not valid TOML: {exc}", key="<file>") from None
    for k in data:
        if k not in _TOP:
            raise KeyMapError(f"{source}: unknown table [{k}] (known: [observation], [action])", key=k)
    obs = data.get("observation")
    if not isinstance(obs, dict) or not obs:
        raise KeyMapError(f"{source}: [observation] is missing or empty: map GenManip keys to the "
                          "server's keys", key="observation")
    pairs: list[tuple[str, str]] = []
    for src, dst in obs.items():
        if not isinstance(dst, str) or not dst:
            raise KeyMapError(f"{source}: [observation] {src!r} = {dst!r}: expected the server's key "
                              "(a non-empty string)", key=f"observation.{src}")
        pairs.append((src, dst))
    act = data.get("action")
    if not isinstance(act, dict):
        raise KeyMapError(f"{source}: [action] is missing: say how a row of 'actions' splits",
                          key="action")
    for k in act:
        if k not in _ACTION_KEYS:
            raise KeyMapError(f"{source}: [action] unknown key {k!r} (known: {', '.join(_ACTION_KEYS)})",
                              key=f"action.{k}")
    control = act.get("control_type", "joint_position")
    if control not in CONTROL_TYPES:
        raise KeyMapError(f"{source}: [action] control_type = {control!r}: expected one of "
                          f"{', '.join(CONTROL_TYPES)}", key="action.control_type")
    for flag in ("is_rel", "base_is_rel"):
        if flag in act and type(act[flag]) is not bool:
            raise KeyMapError(f"{source}: [action] {flag} = {act[flag]!r}: expected true or false",
                              key=f"action.{flag}")
    robot = act.get("robot")
    if robot is not None and not isinstance(robot, str):
        raise KeyMapError(f"{source}: [action] robot = {robot!r}: expected a robot id", key="action.robot")
    arm = _slice(source, act, "arm", True)
    gripper = _slice(source, act, "gripper", True)
    assert arm is not None and gripper is not None
    km = KeyMap(
        observation=tuple(pairs),
        robot=robot,
        control_type=control,
        arm=arm,
        gripper=gripper,
        base=_slice(source, act, "base", False),
        is_rel=bool(act.get("is_rel", False)),
        base_is_rel=bool(act.get("base_is_rel", True)),
        source=source,
    )
    if robot is not None:
        try:
            spec = get_robot(robot)
        except ValidationError as exc:
            raise KeyMapError(f"{source}: [action] robot: {exc}", key="action.robot") from None
        km.check_robot(spec)
    return km
