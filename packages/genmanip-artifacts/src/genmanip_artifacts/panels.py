"""Which curves go into which panel, per robot spec (no drawing here).

Dual-arm robots: arm joints (left solid, right dashed), grippers, base position, base yaw.
Single-arm robots: joints, gripper. Unknown robots: every recorded dimension (never an empty plot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from genmanip_protocol.robots import RobotSpec

from .episode import EpisodeSeries

__all__ = ["Line", "Panel", "action_panels", "state_panels"]

#: Line styles that tell the arms apart; colours tell the joints apart.
LEFT_STYLE = "-"
RIGHT_STYLE = "--"
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip

# Grippers whose joints are revolute (rad); the others are prismatic fingers (m).
_REVOLUTE_GRIPPERS = frozenset({"manip/franka/robotiq"})


def color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


@dataclass(frozen=True)
class Line:
    """One curve: ``y`` over simulator timesteps ``x`` (both (N,))."""

    label: str
    x: np.ndarray
    y: np.ndarray
    color: str
    style: str = LEFT_STYLE
    steps: bool = False  # draw as a staircase (an action holds for its whole step)


@dataclass(frozen=True)
class Panel:
    """One axes: a title, a y label with the unit, its curves and legend entries.

    ``legend`` holds (label, colour, line style) proxies so that a 12-joint dual-arm panel gets
    a 6-colour + 2-style legend instead of 12 entries.
    """

    title: str
    ylabel: str
    lines: list[Line]
    legend: list[tuple[str, str, str]] = field(default_factory=list)


def _gripper_unit(robot: RobotSpec) -> str:
    return "rad" if robot.robot_id in _REVOLUTE_GRIPPERS else "m"


def _side_legend(names: list[str], dual: bool) -> list[tuple[str, str, str]]:
    entries = [(name, color(i), LEFT_STYLE) for i, name in enumerate(names)]
    if dual:
        entries += [("left", "black", LEFT_STYLE), ("right", "black", RIGHT_STYLE)]
    return entries


def _per_arm_panel(
    title: str,
    ylabel: str,
    x: np.ndarray,
    blocks: list[np.ndarray],
    prefix: str,
    *,
    steps: bool,
    names: str | None = None,
) -> Panel:
    """``blocks[arm]`` is (N, d): arm 0 solid, arm 1 dashed, colour by dimension.

    Dimension ``i`` is called ``names[i]`` when given, else ``f"{prefix}{i}"``.
    """
    dual = len(blocks) > 1
    d = max((b.shape[1] for b in blocks), default=0)
    dim_names = [names[i] if names and i < len(names) else f"{prefix}{i}" for i in range(d)]
    lines: list[Line] = []
    for arm, block in enumerate(blocks):
        side = ("left " if arm == 0 else "right ") if dual else ""
        style = LEFT_STYLE if arm == 0 else RIGHT_STYLE
        for i in range(block.shape[1]):
            lines.append(Line(f"{side}{dim_names[i]}", x, block[:, i], color(i), style, steps))
    return Panel(title, ylabel, lines, _side_legend(dim_names, dual))


def _xy_yaw_panels(
    x: np.ndarray, base: np.ndarray, what: str, yaw_unit: str, *, steps: bool
) -> list[Panel]:
    xy = Panel(
        f"{what} x, y",
        "position (m)",
        [
            Line("x", x, base[:, 0], color(0), LEFT_STYLE, steps),
            Line("y", x, base[:, 1], color(1), LEFT_STYLE, steps),
        ],
        [("x", color(0), LEFT_STYLE), ("y", color(1), LEFT_STYLE)],
    )
    yaw = Panel(
        f"{what} yaw",
        f"yaw ({yaw_unit})",
        [Line("yaw", x, base[:, 2], color(2), LEFT_STYLE, steps)],
        [("yaw", color(2), LEFT_STYLE)],
    )
    return [xy, yaw]


def _generic_panels(
    x: np.ndarray, parts: dict[str, np.ndarray], what: str, *, steps: bool
) -> list[Panel]:
    panels: list[Panel] = []
    for key, arr in parts.items():
        if arr.ndim != 2 or arr.shape[1] == 0:
            continue
        unit = {"joints": "rad", "base": "m / rad"}.get(key, "recorded units")
        lines = [
            Line(f"{key}[{i}]", x, arr[:, i], color(i), LEFT_STYLE, steps)
            for i in range(arr.shape[1])
        ]
        panels.append(
            Panel(
                f"{what} {key} (all {arr.shape[1]} dims)",
                f"{key} ({unit})",
                lines,
                [(ln.label, ln.color, ln.style) for ln in lines],
            )
        )
    return panels


def state_panels(s: EpisodeSeries) -> list[Panel]:
    """Panels of the observed state, x = observation timestep."""
    robot = s.robot
    x = s.state_t
    if robot is None:
        return _generic_panels(x, s.state, "state", steps=False)
    joints, grip = s.state["joints"], s.state["gripper"]
    a, g = robot.arm_dof, robot.gripper_dof
    jb = [joints[:, i * a : (i + 1) * a] for i in range(robot.n_arms)]
    gb = [grip[:, i * g : (i + 1) * g] for i in range(robot.n_arms)]
    panels = [
        _per_arm_panel("state: arm joints", "joint position (rad)", x, jb, "joint", steps=False),
        _per_arm_panel(
            "state: gripper" + ("s" if robot.dual_arm else ""),
            f"gripper ({_gripper_unit(robot)})",
            x,
            gb,
            "gripper",
            steps=False,
        ),
    ]
    if robot.has_base:
        panels += _xy_yaw_panels(x, s.state["base"], "state: base", "rad", steps=False)
    return panels


def _rel(flag: bool | None) -> str:
    return {True: " (relative)", False: " (absolute)"}.get(flag, "") if flag is not None else ""


def action_panels(s: EpisodeSeries) -> list[Panel]:
    """Panels of the executed actions, x = step (the timestep each action was applied at)."""
    robot = s.robot
    x = s.action_t
    act = s.action
    if robot is None:
        parts = {"action": act}
        if s.base_motion is not None:
            parts["base_motion"] = s.base_motion
        return _generic_panels(x, parts, "action:", steps=True)
    n = robot.n_arms
    g = robot.gripper_dof
    rel = _rel(s.is_rel)
    if s.control_type == "ee_pose":
        block = 7 + g
        arms = [act[:, i * block : (i + 1) * block] for i in range(n)]
        panels = [
            _per_arm_panel(
                f"action: end-effector position{rel}",
                "position (m)",
                x,
                [b[:, 0:3] for b in arms],
                "p",
                steps=True,
                names="xyz",
            ),
            _per_arm_panel(
                f"action: end-effector orientation{rel}",
                "quaternion w,x,y,z",
                x,
                [b[:, 3:7] for b in arms],
                "q",
                steps=True,
                names="wxyz",
            ),
            _per_arm_panel(
                "action: gripper" + ("s" if n > 1 else ""),
                f"gripper ({_gripper_unit(robot)})",
                x,
                [b[:, 7:] for b in arms],
                "gripper",
                steps=True,
            ),
        ]
    else:
        jb = [act[:, sl] for sl in robot.arm_slices]
        gb = [act[:, sl] for sl in robot.gripper_slices]
        panels = [
            _per_arm_panel(
                f"action: arm joints{rel}", "joint target (rad)", x, jb, "joint", steps=True
            ),
            _per_arm_panel(
                "action: gripper" + ("s" if n > 1 else "") + " (absolute)",
                f"gripper target ({_gripper_unit(robot)})",
                x,
                gb,
                "gripper",
                steps=True,
            ),
        ]
    if robot.has_base:
        base = s.base_motion if s.base_motion is not None else np.zeros((act.shape[0], 3))
        panels += _xy_yaw_panels(
            x, base, f"action: base_motion{_rel(s.base_is_rel)}", "deg", steps=True
        )
    return panels
