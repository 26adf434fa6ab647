"""Writers of small results trees that follow the documented layouts exactly (tests and benchmarks).

Both layouts of ``docs/architecture.md``: the client layout (``gmp eval`` recording: ``run.json``,
``steps.jsonl``, ``<camera>.mp4`` through :class:`genmanip_results.video.VideoWriter`,
``result.json``) and the server layout (``result_info.json``, ``meta_record.pkl``, ``<seed>.lock``),
plus a ``.live/<worker>/`` directory as ``gmp eval --live-every`` writes it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pickle
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "synthetic_frame",
    "write_client_episode",
    "write_client_run",
    "write_live_worker",
    "write_server_episode",
    "write_server_run",
]

LIFT2_CAMERAS = ("head_camera", "left_camera", "right_camera", "top_camera")


@functools.lru_cache(maxsize=8)
def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:height, 0:width]
    return y, x


def synthetic_frame(i: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """A moving test pattern: frame ``i`` of a ``(height, width, 3)`` uint8 video."""
    y, x = _grid(height, width)
    img = np.empty((height, width, 3), np.uint8)
    img[..., 0] = ((x + 3 * i + seed * 17) % 256).astype(np.uint8)
    img[..., 1] = ((y + 2 * i) % 256).astype(np.uint8)
    img[..., 2] = 255 - img[..., 0] // 2
    cx = int((i * 4) % max(1, width - 20))
    img[height // 2 - 10 : height // 2 + 10, cx : cx + 20] = (250, 250, 40)
    return img


def _write_videos(
    ep: Path,
    cameras: Sequence[str] | Mapping[str, tuple[int, int]],
    n_frames: int,
    size: tuple[int, int],
    seed: int,
) -> None:
    """One mp4 per camera; ``cameras`` may map a camera to its own ``(width, height)``."""
    from genmanip_results.video import VideoWriter

    for ci, cam in enumerate(cameras):
        w, h = cameras[cam] if isinstance(cameras, Mapping) else size
        with VideoWriter(ep / f"{cam}.mp4", w, h, fps=30) as vw:
            for i in range(n_frames):
                vw.write(synthetic_frame(i, w, h, seed + ci))


def write_client_episode(
    run_dir: Path,
    task: str,
    seed: str,
    *,
    score: float,
    steps: int = 20,
    cameras: Sequence[str] | Mapping[str, tuple[int, int]] = ("left_camera", "top_camera"),
    size: tuple[int, int] = (64, 48),
    chunk: int = 1,
    instruction: str = "pick up the cube",
    robot_id: str = "manip/lift2/R5a",
    worker_id: str = "0",
    complete: bool = True,
    videos: bool = True,
) -> Path:
    """One client-layout episode under ``run_dir/task/seed``; returns the episode directory.

    With ``chunk > 1`` actions come in chunks: one observation (video frame, state) per chunk.
    """
    bench, run_id = run_dir.parent.name, run_dir.name
    ep = run_dir / task / seed
    ep.mkdir(parents=True, exist_ok=True)
    eid = f"{bench}/{run_id}/{task}/{seed}"
    n_obs = (steps + chunk - 1) // chunk
    if videos and cameras:
        _write_videos(ep, cameras, n_obs, size, int(seed) if seed.isdigit() else 0)
    rng = np.random.default_rng(abs(hash(eid)) % (1 << 32))
    rows = []
    for s in range(steps):
        obs = s // chunk
        first = s % chunk == 0
        t = obs * chunk
        rows.append(
            {
                "episode_id": eid,
                "worker_id": worker_id,
                "robot_id": robot_id,
                "step": s,
                "obs_timestep": t,
                "frame": obs if videos and cameras else None,
                "state": {
                    "joints": [float(np.sin(t / 10 + j)) for j in range(12)],
                    "gripper": [0.04 * (t % 20 < 10), 0.04 * (t % 20 < 10)],
                    "base": [0.0, 0.0, t / 100.0],
                }
                if first
                else None,
                "action": {
                    "control_type": "joint_position",
                    "action": [
                        float(np.sin((s + 1) / 10 + j) + 0.01 * rng.standard_normal())
                        for j in range(16)
                    ],
                    "is_rel": False,
                    "base_motion": [0.0, 0.0, 0.0],
                    "base_is_rel": True,
                },
                "chunk": {"index": s % chunk, "size": chunk} if chunk > 1 else None,
                "latency_ms": {"network": 1.0, "server": 3.0, "policy": 0.5} if first else None,
            }
        )
    (ep / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if complete:
        result = {
            "episode_id": eid,
            "task_name": task,
            "seed": seed,
            "score": score,
            "sr": 1.0 if abs(score - 1.0) <= 1e-6 else 0.0,
            "steps": steps,
            "robot_id": robot_id,
            "worker_id": worker_id,
            "instruction": instruction,
            "started": time.time() - 10,
            "finished": time.time(),
        }
        (ep / "result.json").write_text(json.dumps(result), encoding="utf-8")
        merged_path = run_dir / task / "episode_result.json"
        merged = json.loads(merged_path.read_text()) if merged_path.is_file() else {}
        merged[seed] = {"score": score, "sr": result["sr"]}
        merged_path.write_text(json.dumps(merged), encoding="utf-8")
    else:
        (ep / "INCOMPLETE").write_text("", encoding="utf-8")
    return ep


def write_client_run(
    results_root: Path,
    benchmark: str,
    run_id: str,
    *,
    tasks: dict[str, list[float]],
    steps: int = 20,
    cameras: Sequence[str] = ("left_camera", "top_camera"),
    size: tuple[int, int] = (64, 48),
    instruction: str = "pick up the cube",
    videos: bool = True,
    start: float | None = None,
) -> Path:
    """A client-layout run: ``tasks`` maps task name -> scores of seeds 0, 1, ... (NaN = incomplete)."""
    run_dir = results_root / benchmark / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    total = sum(len(v) for v in tasks.values())
    manifest = {
        "run_id": run_id,
        "benchmark": benchmark,
        "server_url": "http://127.0.0.1:8087",
        "workers": ["0"],
        "codec": "msgpack",
        "start": start if start is not None else time.time(),
        "end": None,
        "total_episodes": total,
    }
    (run_dir / "run.json").write_text(json.dumps(manifest), encoding="utf-8")
    for task, scores in tasks.items():
        for i, score in enumerate(scores):
            write_client_episode(
                run_dir, task, str(i), score=0.0 if math.isnan(score) else score, steps=steps,
                cameras=cameras, size=size, instruction=instruction, complete=not math.isnan(score),
                videos=videos,
            )  # fmt: skip
    return run_dir


def write_server_episode(
    run_dir: Path,
    task: str,
    seed: str,
    *,
    score: float,
    steps: int = 20,
    cameras: Sequence[str] = ("left_camera", "top_camera"),
    size: tuple[int, int] = (64, 48),
    instruction: str = "open the drawer",
    robot_id: str = "manip/lift2/R5a",
    complete: bool = True,
    lock_age: float | None = None,
) -> Path:
    """One server-layout episode (videos, ``meta_record.pkl``, ``result_info.json`` when complete,
    a ``<seed>.lock`` touched ``lock_age`` seconds ago when given)."""
    ep = run_dir / task / seed
    ep.mkdir(parents=True, exist_ok=True)
    _write_videos(ep, cameras, steps, size, int(seed) if seed.isdigit() else 0)
    meta = {
        "joint_positions": [
            np.sin(np.arange(12) / 3 + t / 10).astype(np.float32) for t in range(steps)
        ],
        "gripper_positions": [
            np.array([0.04, 0.04], np.float32) * (t % 20 < 10) for t in range(steps)
        ],
        "base_positions": [np.array([0.0, 0.0, t / 100.0]) for t in range(steps)],
        "instruction": instruction,
        "model_output": [
            {"arm_action": np.cos(np.arange(16) / 3 + t / 10), "base_motion": [0.0, 0.0, 0.0]}
            for t in range(steps)
        ],
        "robot_id": robot_id,
    }
    (ep / "meta_record.pkl").write_bytes(pickle.dumps(meta, protocol=4))
    if complete:
        info = {
            "score": score,
            "success_rate": int(abs(score - 1.0) <= 1e-6),
            "log_info": {
                "episode_start_time": "2026-01-02_03_04_05_000000",
                "episode_end_time": "2026-01-02_03_05_05_000000",
                "metric_score": [[[score]]],
            },
        }
        (ep / "result_info.json").write_text(json.dumps(info), encoding="utf-8")
    if lock_age is not None:
        lock = run_dir / task / f"{seed}.lock"
        lock.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": "testhost",
                    "worker_id": "1",
                    "timestamp": time.time() - lock_age,
                }
            ),
            encoding="utf-8",
        )
        t = time.time() - lock_age
        os.utime(lock, (t, t))
    return ep


def write_server_run(
    project_root: Path,
    benchmark: str,
    run_id: str,
    *,
    tasks: dict[str, list[float]],
    steps: int = 20,
    cameras: Sequence[str] = ("left_camera", "top_camera"),
    size: tuple[int, int] = (64, 48),
    instruction: str = "open the drawer",
) -> Path:
    """A server-layout run under ``project_root/saved/eval_results``; NaN score = running episode
    (fresh lock, no ``result_info.json``)."""
    run_dir = project_root / "saved" / "eval_results" / benchmark / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    total = sum(len(v) for v in tasks.values())
    done = sum(1 for v in tasks.values() for s in v if not math.isnan(s))
    metric = {
        (f"({sum(1 for s in v if not math.isnan(s))}/{len(v)})" if done < total else "") + t: float(
            np.nanmean(v) if any(not math.isnan(s) for s in v) else 0.0
        )
        for t, v in tasks.items()
    }
    (run_dir / ("result.json" if done == total else "progress.json")).write_text(
        json.dumps(metric), encoding="utf-8"
    )
    for task, scores in tasks.items():
        for i, score in enumerate(scores):
            running = math.isnan(score)
            write_server_episode(
                run_dir, task, str(i), score=0.0 if running else score, steps=steps, cameras=cameras,
                size=size, instruction=instruction, complete=not running,
                lock_age=5.0 if running else None,
            )  # fmt: skip
    return run_dir


def write_live_worker(
    run_dir: Path,
    worker_id: str,
    *,
    cameras: Sequence[str] = ("left_camera", "top_camera"),
    step: int = 7,
    instruction: str = "pick up the cube",
    episode_id: str = "",
    success_rate: float = 0.5,
    size: tuple[int, int] = (64, 48),
) -> Path:
    """``<run_dir>/.live/<worker_id>/`` with one JPEG per camera and ``live.json``."""
    from genmanip_protocol.codec.jpeg import encode_jpeg
    from genmanip_results.stats import wilson_interval
    from genmanip_runtime.atomic import atomic_write_bytes, atomic_write_json

    d = run_dir / ".live" / worker_id
    d.mkdir(parents=True, exist_ok=True)
    w, h = size
    for i, cam in enumerate(cameras):
        atomic_write_bytes(
            d / f"{cam}.jpg", encode_jpeg(synthetic_frame(step, w, h, i), quality=85)
        )
    atomic_write_json(
        d / "live.json",
        {
            "worker_id": worker_id,
            "step": step,
            "instruction": instruction,
            "episode_id": episode_id,
            "task_name": episode_id.split("/", 2)[-1].rsplit("/", 1)[0]
            if episode_id.count("/") >= 3
            else "",
            "updated": time.time(),
            # the running success rate as gmp eval's recorder writes it
            "episodes": 4,
            "successes": round(4 * success_rate),
            "sr": success_rate,
            "sr_ci95": list(wilson_interval(round(4 * success_rate), 4)),
            "cameras": list(cameras),
        },
    )
    return d
