"""Synthetic episodes in the documented on-disk layouts, for tests, benchmarks and demos.

Frames are rendered with numpy: a gradient background, a moving square, and the frame index
encoded in a flat grey block at the top-left corner (value ``frame_marker(j)``), so that a reader
can tell which source frame ended up where after H.264 compression.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from genmanip_protocol.robots import RobotSpec, get_robot

__all__ = ["frame_marker", "render_frame", "write_client_episode", "write_server_episode"]

MARKER = 48  # side of the frame-index block, pixels


def frame_marker(j: int) -> int:
    """Grey level of the frame-index block of frame ``j`` (coarse steps survive compression)."""
    return int(16 + (j * 24) % 224)


def render_frame(j: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8 test frame number ``j``."""
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[..., 0] = ((x + 3 * j + seed * 40) % 256).astype(np.uint8)
    img[..., 1] = (y * 0.6).astype(np.uint8)
    img[..., 2] = ((x + y) * 0.3).astype(np.uint8)
    s = max(8, height // 8)
    cy = int((height - s) * (0.5 + 0.4 * np.sin(j / 9.0)))
    cx = int((width - s) * (0.5 + 0.4 * np.cos(j / 7.0)))
    img[cy : cy + s, cx : cx + s] = (250, 250, 40)
    img[:MARKER, :MARKER] = frame_marker(j)
    return img


def _trajectory(robot: RobotSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, action_dim) joint targets and (n, 3) base poses: smooth, arm-distinct curves."""
    t = np.arange(n, dtype=np.float64)[:, None]
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, np.pi, size=(1, robot.action_dim))
    freq = np.linspace(0.01, 0.05, robot.action_dim)[None, :]
    act = 0.6 * np.sin(freq * t + phase)
    for sl in robot.gripper_slices:
        lo, hi = robot.gripper_closed, robot.gripper_open
        g = (np.sin(t / 40.0) > 0).astype(np.float64)
        act[:, sl] = np.asarray(lo)[None, :] + g * (np.asarray(hi) - np.asarray(lo))[None, :]
    base = np.concatenate([0.001 * t, 0.0005 * t, 0.002 * t], axis=1)
    return act, base


def write_client_episode(
    root: Path,
    *,
    robot_id: str = "manip/lift2/R5a",
    n_steps: int = 40,
    chunk: int = 1,
    cameras: dict[str, tuple[int, int]] | None = None,
    task: str = "bench/suite/task_a",
    seed: str = "000",
    run_id: str = "run1",
    benchmark: str = "bench",
    fps: float = 30.0,
    extra_frames: int = 0,
    frames_override: dict[str, int] | None = None,
    complete: bool = True,
) -> Path:
    """Write one client-layout episode (``docs/architecture.md``) and return its directory.

    One observation every ``chunk`` steps; frame ``j`` of every camera is observation ``j``;
    ``extra_frames`` appends frames no step refers to (like a terminal observation);
    ``frames_override`` forces a camera's frame count (to build mismatches).
    """
    from genmanip_results.video import VideoWriter

    robot = get_robot(robot_id) if robot_id in _known() else None
    if cameras is None:
        cameras = {
            name.removesuffix("_view"): (shape[1] // 4 * 2, shape[0] // 4 * 2)
            for name, shape in (robot.cameras.items() if robot else [])
        } or {"front_camera": (160, 120)}
    run_dir = root / benchmark / run_id
    ep = run_dir / task / seed
    ep.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "run.json").exists():
        (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "benchmark": benchmark}))
    dim = robot.action_dim if robot else 5
    spec = robot or get_robot("manip/franka/panda_hand")
    act, base = _trajectory(spec, n_steps, seed=len(task))
    act = (
        act[:, :dim]
        if robot
        else np.sin(np.arange(n_steps)[:, None] / 10.0 + np.arange(dim)[None, :])
    )
    rows = []
    n_obs = 0
    for s in range(n_steps):
        c = s % chunk
        obs_t = s - c
        frame = obs_t // chunk
        n_obs = max(n_obs, frame + 1)
        state = None
        if c == 0:
            # The observed state lags the commanded one by a step.
            prev = act[max(s - 1, 0)]
            if robot:
                arms, grips = robot.split_joint_action(list(prev))
                state = {
                    "joints": arms,
                    "gripper": grips,
                    "base": list(base[s]) if robot.has_base else [0.0] * 3,
                }
            else:
                state = {"joints": list(prev[:3]), "gripper": list(prev[3:]), "extra": [float(s)]}
        row = {
            "episode_id": f"{benchmark}/{run_id}/{task}/{seed}",
            "worker_id": "0",
            "robot_id": robot_id,
            "step": s,
            "obs_timestep": obs_t,
            "frame": frame,
            "state": state,
            "action": {
                "control_type": "joint_position",
                "action": [float(v) for v in act[s]],
                "is_rel": False,
                "base_motion": [0.001, 0.0005, 0.1 * np.sin(s / 20.0)],
                "base_is_rel": True,
            },
            "chunk": {"index": c, "size": chunk} if chunk > 1 else None,
            "latency_ms": {"network": 1.0, "server": 2.0, "policy": 0.5} if c == 0 else None,
        }
        rows.append(json.dumps(row))
    (ep / "steps.jsonl").write_text("\n".join(rows) + "\n")
    for k, (name, (w, h)) in enumerate(cameras.items()):
        n_frames = (frames_override or {}).get(name, n_obs + extra_frames)
        with VideoWriter(ep / f"{name}.mp4", w, h, fps=fps) as vw:
            for j in range(n_frames):
                vw.write(render_frame(j, h, w, seed=k))
    if complete:
        (ep / "result.json").write_text(
            json.dumps(
                {
                    "episode_id": f"{benchmark}/{run_id}/{task}/{seed}",
                    "task_name": task,
                    "seed": seed,
                    "score": 1.0,
                    "sr": 1.0,
                    "steps": n_steps,
                    "robot_id": robot_id,
                    "worker_id": "0",
                    "instruction": "pick up the red block and place it in the bowl",
                }
            )
        )
    else:
        (ep / "INCOMPLETE").write_text("")
    return ep


def _known() -> Sequence[str]:
    from genmanip_protocol.robots import ROBOTS

    return list(ROBOTS)


def write_server_episode(
    project_root: Path,
    *,
    robot_id: str = "manip/franka/panda_hand",
    n_steps: int = 30,
    cameras: dict[str, tuple[int, int]] | None = None,
    benchmark: str = "ebench",
    run_id: str = "srv1",
    task: str = "ebench/table_top/peg",
    seed: str = "000",
) -> Path:
    """Write one server-layout episode (facts §12.1) with ``meta_record.pkl`` and return its dir."""
    from genmanip_results.video import VideoWriter

    robot = get_robot(robot_id)
    cameras = cameras or {"obs_camera": (160, 120), "realsense": (160, 120)}
    ep = project_root / "saved" / "eval_results" / benchmark / run_id / task / seed
    ep.mkdir(parents=True, exist_ok=True)
    act, _ = _trajectory(robot, n_steps, seed=1)
    joints, grips = [], []
    for s in range(n_steps):
        arms, g = robot.split_joint_action(list(act[max(s - 1, 0)]))
        joints.append(np.asarray(arms, dtype=np.float32))
        grips.append(np.asarray(g, dtype=np.float32))
    meta = {
        "joint_positions": joints,
        "gripper_positions": grips,
        "base_positions": [[0.0, 0.0, 0.0] for _ in range(n_steps)],
        "instruction": "insert the peg",
        "model_output": [
            {"arm_action": act[s].astype(np.float32), "base_motion": [0.0, 0.0, 0.0]}
            for s in range(n_steps)
        ],
        "robot_id": robot_id,
    }
    (ep / "meta_record.pkl").write_bytes(pickle.dumps(meta, protocol=4))
    for k, (name, (w, h)) in enumerate(cameras.items()):
        # The reset observation's frame, then one per step (as the server records them).
        with VideoWriter(ep / f"{name}.mp4", w, h) as vw:
            for j in range(n_steps + 1):
                vw.write(render_frame(j, h, w, seed=k))
    (ep / "result_info.json").write_text(
        json.dumps(
            {
                "score": 0.5,
                "success_rate": 0,
                "log_info": {
                    "episode_start_time": "2026-01-01_00_00_00_000000",
                    "episode_end_time": "2026-01-01_00_01_00_000000",
                    "metric_score": [[[0.5]]],
                },
            }
        )
    )
    return ep
