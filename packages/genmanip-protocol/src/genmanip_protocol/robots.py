"""Robot specifications: action layout, state layout, cameras and gripper values.

Facts from the GenManip server (see ``docs/protocol.md``). All joint values are radians, positions
metres, camera shapes ``(H, W, 3)`` uint8 RGB.

Two vector layouts are used:

* the **action vector** sent as ``action`` with ``control_type="joint_position"``: ``action_dim``
  values (9, 13 or 16);
* the **flat vector** used for recording and plots: the action (or state) vector followed, for
  dual-arm robots, by the 3 base values ``[x, y, yaw]``; ``flat_dim`` values (9, 13 or 19).

The half-open slices below index the flat vector (and therefore the action vector too, since the
base comes last).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import ValidationError, Violation

__all__ = [
    "CAMERA_ORDER",
    "ROBOTS",
    "RobotSpec",
    "get_robot",
    "resolve_robot",
]

_WRIST = (480, 640, 3)
_WIDE = (720, 1280, 3)

#: Order in which cameras are laid out side by side (known cameras first, then any others sorted).
CAMERA_ORDER = (
    "left_camera_view",
    "top_camera_view",
    "overlook_camera_view",
    "right_camera_view",
    "obs_camera_view",
    "realsense_view",
    "obs_camera_2_view",
)


@dataclass(frozen=True)
class RobotSpec:
    """One robot as the GenManip server models it.

    Attributes:
        robot_id: canonical id as sent in ``obs["robot_id"]`` (e.g. ``"manip/lift2/R5a"``).
        dual_arm: two arms (and a mobile base) or one fixed arm.
        arm_dof: joints per arm.
        gripper_dof: gripper joints per arm.
        cameras: obs camera keys without the ``video.`` prefix -> image shape ``(H, W, 3)``.
        gripper_open, gripper_closed: per-arm gripper joint values (rad or m as the joint is).
        aliases: legacy names accepted by :func:`get_robot`.
    """

    robot_id: str
    dual_arm: bool
    arm_dof: int
    gripper_dof: int
    cameras: Mapping[str, tuple[int, int, int]]
    gripper_open: tuple[float, ...]
    gripper_closed: tuple[float, ...]
    aliases: tuple[str, ...] = field(default=())

    @property
    def n_arms(self) -> int:
        return 2 if self.dual_arm else 1

    @property
    def action_dim(self) -> int:
        """Length of a ``joint_position`` action vector (9, 13 or 16)."""
        return self.n_arms * (self.arm_dof + self.gripper_dof)

    @property
    def joints_dim(self) -> int:
        """Length of ``state.joints`` (all arms)."""
        return self.n_arms * self.arm_dof

    @property
    def gripper_dim(self) -> int:
        """Length of ``state.gripper`` (all arms)."""
        return self.n_arms * self.gripper_dof

    @property
    def has_base(self) -> bool:
        """Only dual-arm robots have a mobile base; single-arm ``state.base`` is a list of zeros."""
        return self.dual_arm

    @property
    def flat_dim(self) -> int:
        """Length of the flat record vector: the action vector plus ``[x, y, yaw]`` when mobile."""
        return self.action_dim + (3 if self.has_base else 0)

    def _arm_block(self, arm: int) -> int:
        return arm * (self.arm_dof + self.gripper_dof)

    @property
    def left_arm(self) -> slice:
        """Arm joints of the (left) arm in the action / flat vector."""
        return slice(0, self.arm_dof)

    @property
    def left_gripper(self) -> slice:
        return slice(self.arm_dof, self.arm_dof + self.gripper_dof)

    @property
    def right_arm(self) -> slice | None:
        if not self.dual_arm:
            return None
        s = self._arm_block(1)
        return slice(s, s + self.arm_dof)

    @property
    def right_gripper(self) -> slice | None:
        if not self.dual_arm:
            return None
        s = self._arm_block(1) + self.arm_dof
        return slice(s, s + self.gripper_dof)

    @property
    def base(self) -> slice | None:
        """``[x, y, yaw]`` in the flat vector (yaw in rad there, as in ``state.base``)."""
        return slice(self.action_dim, self.action_dim + 3) if self.has_base else None

    @property
    def arm_slices(self) -> tuple[slice, ...]:
        r = self.right_arm
        return (self.left_arm,) if r is None else (self.left_arm, r)

    @property
    def gripper_slices(self) -> tuple[slice, ...]:
        r = self.right_gripper
        return (self.left_gripper,) if r is None else (self.left_gripper, r)

    @property
    def camera_keys(self) -> tuple[str, ...]:
        """Observation keys of the cameras, e.g. ``("video.left_camera_view", ...)``."""
        return tuple(f"video.{c}" for c in self.cameras)

    def split_joint_action(self, vector: list[float]) -> tuple[list[float], list[float]]:
        """Split an action vector into (arm joints of every arm, gripper joints of every arm)."""
        arms: list[float] = []
        grips: list[float] = []
        for a, g in zip(self.arm_slices, self.gripper_slices, strict=True):
            arms.extend(vector[a])
            grips.extend(vector[g])
        return arms, grips

    def merge_joint_state(self, joints: list[float], gripper: list[float]) -> list[float]:
        """Interleave ``state.joints`` and ``state.gripper`` into action-vector order."""
        out: list[float] = []
        for arm in range(self.n_arms):
            out.extend(joints[arm * self.arm_dof : (arm + 1) * self.arm_dof])
            out.extend(gripper[arm * self.gripper_dof : (arm + 1) * self.gripper_dof])
        return out

    def neutral_action(self, control_type: str = "joint_position") -> dict[str, Any]:
        """The no-op action of this robot: hold every arm where it was commanded, grippers open.

        The reference ``gmp eval`` sends a per-robot "fake" no-op of this shape; this is that
        no-op made exact: ``is_rel=True`` with zero arm deltas (relative arm targets add to the
        previously commanded ones, so nothing moves), each gripper at :attr:`gripper_open`
        (gripper entries are always absolute on the wire, so an all-zero vector would *close* the
        panda, Piper and lift2 grippers), and for mobile robots a relative zero ``base_motion``.

        Args:
            control_type: ``"joint_position"``: ``action`` is a flat list of :attr:`action_dim`
                floats (per arm ``arm_dof`` zeros then the open gripper values); ``"ee_pose"``:
                per arm the identity pose delta ``[[0, 0, 0], [1, 0, 0, 0], gripper_open]``
                (position m, quaternion w,x,y,z), a ``[left, right]`` list for dual-arm robots.

        Returns:
            A new action dict (fresh lists: the caller may modify it).

        Raises:
            ValidationError: ``control_type`` is neither of the two.
        """
        grip = [float(v) for v in self.gripper_open]
        action: dict[str, Any] = {"control_type": control_type, "is_rel": True}
        if control_type == "joint_position":
            vec: list[float] = []
            for _ in range(self.n_arms):
                vec.extend([0.0] * self.arm_dof)
                vec.extend(grip)
            action["action"] = vec
        elif control_type == "ee_pose":
            arms = [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], list(grip)] for _ in range(self.n_arms)]
            action["action"] = arms if self.dual_arm else arms[0]
        else:
            raise ValidationError(
                Violation("control_type", "joint_position or ee_pose", repr(control_type))
            )
        if self.has_base:
            # The server's own defaults, spelled out: a recorded action then shows the base too.
            action["base_motion"] = [0.0, 0.0, 0.0]
            action["base_is_rel"] = True
        return action

    def flat_labels(self) -> list[str]:
        """Human-readable label of every entry of the flat vector (for plots and tables)."""
        labels: list[str] = []
        sides = ("left_", "right_") if self.dual_arm else ("",)
        for side in sides:
            labels += [f"{side}joint{i}" for i in range(self.arm_dof)]
            labels += [f"{side}gripper{i}" for i in range(self.gripper_dof)]
        if self.has_base:
            labels += ["base_x", "base_y", "base_yaw"]
        return labels


def _spec(
    robot_id: str,
    *,
    dual_arm: bool,
    arm_dof: int,
    gripper_dof: int,
    cameras: dict[str, tuple[int, int, int]],
    open_: tuple[float, ...],
    closed: tuple[float, ...],
    aliases: tuple[str, ...],
) -> RobotSpec:
    return RobotSpec(
        robot_id=robot_id,
        dual_arm=dual_arm,
        arm_dof=arm_dof,
        gripper_dof=gripper_dof,
        cameras=MappingProxyType(dict(cameras)),
        gripper_open=open_,
        gripper_closed=closed,
        aliases=aliases,
    )


_FRANKA_CAMERAS = {"obs_camera_view": _WRIST, "obs_camera_2_view": _WRIST, "realsense_view": _WRIST}

#: Every known robot by canonical id.
ROBOTS: Mapping[str, RobotSpec] = MappingProxyType(
    {
        s.robot_id: s
        for s in (
            _spec(
                "manip/lift2/R5a",
                dual_arm=True,
                arm_dof=6,
                gripper_dof=2,
                cameras={
                    "left_camera_view": _WRIST,
                    "right_camera_view": _WRIST,
                    "top_camera_view": _WIDE,
                    "overlook_camera_view": _WIDE,
                },
                open_=(0.044, 0.044),
                closed=(0.0, 0.0),
                aliases=("lift2", "r5a", "r5a/lift2"),
            ),
            _spec(
                "manip/mobile_aloha/piper",
                dual_arm=True,
                arm_dof=6,
                gripper_dof=2,
                cameras={
                    "left_camera_view": _WRIST,
                    "right_camera_view": _WRIST,
                    "top_camera_view": _WIDE,
                },
                open_=(0.05, -0.05),
                closed=(0.0, 0.0),
                aliases=("aloha_split", "piper", "aloha", "aloha/piper"),
            ),
            _spec(
                "manip/franka/panda_hand",
                dual_arm=False,
                arm_dof=7,
                gripper_dof=2,
                cameras=_FRANKA_CAMERAS,
                open_=(0.04, 0.04),
                closed=(0.0, 0.0),
                aliases=("franka", "franka/panda_hand", "panda_hand"),
            ),
            _spec(
                "manip/franka/robotiq",
                dual_arm=False,
                arm_dof=7,
                gripper_dof=6,
                cameras=_FRANKA_CAMERAS,
                open_=(0.0,) * 6,
                closed=(0.7853, 0.7853, -0.7853, -0.7853, -0.7853, -0.7853),
                aliases=("manip/franka/robotiq_simbox", "franka/robotiq", "robotiq"),
            ),
        )
    }
)

_BY_NAME: dict[str, RobotSpec] = {}
for _s in ROBOTS.values():
    _BY_NAME[_s.robot_id.lower()] = _s
    for _a in _s.aliases:
        _BY_NAME[_a.lower()] = _s


def get_robot(name: str | RobotSpec) -> RobotSpec:
    """Return the spec for a canonical robot id or a legacy alias (case-insensitive).

    Raises:
        ValidationError: unknown robot; the message lists the known ids.
    """
    if isinstance(name, RobotSpec):
        return name
    spec = _BY_NAME.get(str(name).strip().lower())
    if spec is None:
        raise ValidationError(
            Violation("robot_id", "one of " + ", ".join(ROBOTS), repr(name)),
        )
    return spec


# The reference CLI's -a/--arm_type and -g/--gripper_type pairs.
_ARM_GRIPPER = {
    ("franka", "panda_hand"): "manip/franka/panda_hand",
    ("franka", "robotiq"): "manip/franka/robotiq",
    ("aloha", "piper"): "manip/mobile_aloha/piper",
    ("r5a", "lift2"): "manip/lift2/R5a",
}
_DEFAULT_GRIPPER = {"franka": "panda_hand", "aloha": "piper", "r5a": "lift2"}


def resolve_robot(arm_type: str, gripper_type: str | None = None) -> RobotSpec:
    """Map the reference client's ``--arm_type``/``--gripper_type`` pair to a spec.

    ``gripper_type`` defaults to the arm's only (or usual) gripper.
    """
    arm = arm_type.strip().lower()
    grip = (gripper_type or _DEFAULT_GRIPPER.get(arm, "")).strip().lower()
    rid = _ARM_GRIPPER.get((arm, grip))
    if rid is None:
        pairs = ", ".join(f"{a}+{g}" for a, g in _ARM_GRIPPER)
        raise ValidationError(
            Violation("arm_type/gripper_type", f"one of {pairs}", f"{arm_type}+{gripper_type}")
        )
    return ROBOTS[rid]
