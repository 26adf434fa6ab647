"""A tiny, exactly invertible arm model shared by the world and the scripted expert.

Each arm has ``arm_dof`` joints. All but the last move the end effector linearly
(``pos = P0 + J @ q[:-1]``, metres, in the arm-base frame); the last is a wrist yaw that only turns
the gripper about the vertical axis. The gripper points down, so the end-effector orientation is
``Rz(q[-1]) @ Rx(pi)``. Linear FK keeps ``ee_pose`` control exact (least-norm IK) and cheap.

Frames: world x forward, y left, z up (table surface z = 0). The robot base is at ``(bx, by)`` with
heading ``yaw`` (rad); arm bases are mounted at :func:`arm_mounts` in the robot-base frame.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "HOME_POS",
    "IK_JOINT_LIMIT",
    "arm_jacobian",
    "arm_mounts",
    "fk",
    "ik",
    "local_to_world",
    "mat_to_quat",
    "quat_to_mat",
    "world_to_local",
]

#: End-effector position (arm-base frame, m) with every joint at 0.
HOME_POS = np.array([0.35, 0.0, 0.25])
#: IK solutions beyond this joint magnitude (rad) count as failures: the arm holds.
IK_JOINT_LIMIT = 3.0

_COLUMNS = [
    (0.0, 0.30, 0.0),
    (0.30, 0.0, 0.04),
    (0.08, 0.0, -0.25),
    (0.0, 0.08, 0.05),
    (0.05, 0.0, 0.08),
    (0.04, 0.04, 0.0),
    (0.0, 0.03, 0.03),
]
_R_DOWN = np.diag([1.0, -1.0, -1.0])


def arm_jacobian(arm_dof: int) -> np.ndarray:
    """The constant (3, arm_dof-1) position Jacobian (m/rad)."""
    n = arm_dof - 1
    cols = [_COLUMNS[i % len(_COLUMNS)] for i in range(n)]
    out: np.ndarray = np.array(cols, dtype=np.float64).T
    return out


def arm_mounts(n_arms: int) -> np.ndarray:
    """Arm-base origins in the robot-base frame, shape (n_arms, 3): left first."""
    if n_arms == 1:
        return np.zeros((1, 3))
    return np.array([[0.0, 0.25, 0.0], [0.0, -0.25, 0.0]])


def _rz(theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    """Quaternion ``[w, x, y, z]`` (normalised here) -> 3x3 rotation matrix."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / (np.linalg.norm(q) or 1.0)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def mat_to_quat(m: np.ndarray) -> np.ndarray:
    """3x3 rotation matrix -> quaternion ``[w, x, y, z]`` with w >= 0."""
    t = m[0, 0] + m[1, 1] + m[2, 2]
    if t > 0:
        s = math.sqrt(t + 1.0) * 2
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    out = np.array(q)
    return out if out[0] >= 0 else -out


def fk(q_arm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward kinematics of one arm: joints (arm_dof,) rad -> (position (3,) m, rotation 3x3)."""
    q = np.asarray(q_arm, dtype=np.float64)
    pos = HOME_POS + arm_jacobian(q.shape[0]) @ q[:-1]
    return pos, _rz(float(q[-1])) @ _R_DOWN


def ik(pos: np.ndarray, rot: np.ndarray, q_current: np.ndarray) -> np.ndarray | None:
    """Least-norm-change inverse kinematics; None when the solution leaves the joint limits."""
    q_current = np.asarray(q_current, dtype=np.float64)
    jac = arm_jacobian(q_current.shape[0])
    cur_pos, _ = fk(q_current)
    dq = np.linalg.pinv(jac) @ (np.asarray(pos, dtype=np.float64) - cur_pos)
    q = q_current.copy()
    q[:-1] += dq
    yaw_m = rot @ _R_DOWN.T
    q[-1] = math.atan2(yaw_m[1, 0], yaw_m[0, 0])
    if not np.all(np.isfinite(q)) or np.max(np.abs(q)) > IK_JOINT_LIMIT:
        return None
    return np.asarray(q, dtype=np.float64)


def local_to_world(p_local: np.ndarray, mount: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Arm-base point -> world point, given the mount (3,) and base ``[x, y, yaw_rad]``."""
    rz = _rz(float(base[2]))
    out: np.ndarray = rz @ (np.asarray(mount) + np.asarray(p_local)) + np.array(
        [base[0], base[1], 0.0]
    )
    return out


def world_to_local(p_world: np.ndarray, mount: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Inverse of :func:`local_to_world`."""
    rz = _rz(float(base[2]))
    out: np.ndarray = rz.T @ (np.asarray(p_world) - np.array([base[0], base[1], 0.0])) - np.asarray(
        mount
    )
    return out
