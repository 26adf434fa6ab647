"""Writers of small synthetic results trees that follow the documented layouts exactly.

Public test support: the one set of fixture writers used by the tests and benchmarks of every
gmp package (and usable by tools that read gmp results). Both layouts of
``docs/architecture.md`` ("On-disk layouts"), every name taken from :mod:`genmanip_results.layout`:

* client layout (``gmp eval``'s recording): :func:`write_client_run` / :func:`write_client_episode`
  write ``run.json``, ``<task>/episode_result.json``, ``steps.jsonl`` rows of the documented
  schema, ``<camera>.mp4`` through :class:`genmanip_results.video.VideoWriter`, ``result.json``
  (or ``INCOMPLETE``);
* server layout: :func:`write_server_run` / :func:`write_server_episode` write ``result.json`` or
  ``progress.json``, ``<camera>.mp4`` (the reset frame, then one per step), ``meta_record.pkl``,
  ``result_info.json`` and a ``<seed>.lock`` for a running episode;
* the live view: :func:`write_live_worker` publishes frames and state through
  :func:`genmanip_results.live.write_live_view`, exactly as ``gmp eval --live-every`` does;
* :func:`writer_process`: a live process of this host that stands in for a ``gmp eval`` writer
  (its pid is what a run's segment names; kill it to make the run interrupted);
* light trees for tests of whole runs (bundling, submission, discovery): :func:`make_server_run`
  and :func:`make_client_run` write the result files and placeholder bytes for the videos and
  recordings (no ffmpeg, fast), seeds named ``000, 001, ...``.

Frames (:func:`synthetic_frame`) are numpy-rendered: a gradient, a moving square and the frame
index encoded in a flat grey block of :data:`MARKER_SIZE` pixels at the top-left corner (value
:func:`frame_marker`), so a reader can tell which source frame ended up where after H.264.
Series are smooth, deterministic curves with the robot's real dimensions (known robots), so the
episode loaders find nothing to complain about.

Dependencies: videos need the ``video`` extra (ffmpeg); :func:`write_live_worker` encodes JPEGs
with ``genmanip_protocol.codec.jpeg`` (simplejpeg or pillow, the ``jpeg`` extra of
genmanip-protocol), imported only when called.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from genmanip_protocol.robots import ROBOTS, RobotSpec, get_robot

from .layout import (
    EPISODE_RESULT,
    EPISODE_RRD,
    EVAL_RESULTS_DIR,
    INCOMPLETE,
    LOCK_SUFFIX,
    META_RECORD,
    PROGRESS_JSON,
    RESULT_INFO,
    RESULT_JSON,
    RUN_JSON,
    SAVED_DIR,
    STEPS_JSONL,
    VIDEO_SUFFIX,
)

__all__ = [
    "MARKER_SIZE",
    "Cameras",
    "frame_marker",
    "make_client_run",
    "make_server_run",
    "marker_size",
    "robot_cameras",
    "server_run_dir",
    "synthetic_frame",
    "write_client_episode",
    "write_client_run",
    "write_live_worker",
    "write_server_episode",
    "write_server_run",
    "writer_process",
]

#: Side (pixels) of the frame-index block at the top-left corner of a synthetic frame, at most:
#: :func:`marker_size` shrinks it on small frames so that it never hides the moving square.
MARKER_SIZE = 48
#: Camera names (each video ``size``), or camera name -> its own ``(width, height)`` in pixels.
Cameras = Sequence[str] | Mapping[str, tuple[int, int]]

_DEFAULT_CAMERAS = ("left_camera", "top_camera")
#: Stand-in for an unknown robot's trajectory shape (curves only; its dims are written below).
_FALLBACK_ROBOT = "manip/franka/panda_hand"


def marker_size(width: int, height: int) -> int:
    """Side (pixels) of the frame-index block of a ``width`` x ``height`` frame: :data:`MARKER_SIZE`,
    or a quarter of the shorter side when that is smaller (a 64x48 test video keeps a 12 px block
    and shows its yellow square, which a viewer test looks for)."""
    return max(1, min(MARKER_SIZE, width // 4, height // 4))


def frame_marker(i: int) -> int:
    """Grey level of the frame-index block of frame ``i`` (coarse steps survive compression)."""
    return int(16 + (i * 24) % 224)


@functools.lru_cache(maxsize=8)
def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    return y, x


def synthetic_frame(i: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """Frame ``i`` of a synthetic video: ``(height, width, 3)`` uint8 RGB."""
    y, x = _grid(height, width)
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[..., 0] = ((x + 3 * i + seed * 40) % 256).astype(np.uint8)
    img[..., 1] = (y * 0.6).astype(np.uint8)
    img[..., 2] = ((x + y) * 0.3).astype(np.uint8)
    s = max(8, height // 8)
    cy = int((height - s) * (0.5 + 0.4 * np.sin(i / 9.0)))
    cx = int((width - s) * (0.5 + 0.4 * np.cos(i / 7.0)))
    img[cy : cy + s, cx : cx + s] = (250, 250, 40)
    m = marker_size(width, height)
    img[:m, :m] = frame_marker(i)
    return img


def robot_cameras(robot_id: str, *, scale: float = 0.5) -> dict[str, tuple[int, int]]:
    """The robot's cameras (names without ``_view``) -> ``(width, height)`` scaled by ``scale``
    and rounded down to even pixels (H.264 yuv420p needs even sizes)."""
    robot = get_robot(robot_id)
    return {
        name.removesuffix("_view"): (int(shape[1] * scale) // 2 * 2, int(shape[0] * scale) // 2 * 2)
        for name, shape in robot.cameras.items()
    }


def _camera_sizes(cameras: Cameras | None, size: tuple[int, int]) -> dict[str, tuple[int, int]]:
    if not cameras:
        return {}
    if isinstance(cameras, Mapping):
        return {str(k): (int(v[0]), int(v[1])) for k, v in cameras.items()}
    return {str(c): size for c in cameras}


def _write_videos(
    ep: Path,
    cameras: Mapping[str, tuple[int, int]],
    n_frames: int,
    *,
    fps: float = 30.0,
    overrides: Mapping[str, int] | None = None,
) -> None:
    """One ``<camera>.mp4`` per camera; ``overrides`` forces a camera's frame count."""
    from .video import VideoWriter

    for k, (name, (w, h)) in enumerate(cameras.items()):
        n = (overrides or {}).get(name, n_frames)
        with VideoWriter(ep / f"{name}{VIDEO_SUFFIX}", w, h, fps=fps) as vw:
            for j in range(n):
                vw.write(synthetic_frame(j, w, h, seed=k))


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


def _is_success(score: float) -> bool:
    return abs(score - 1.0) <= 1e-6


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def write_client_episode(
    run_dir: Path,
    task: str,
    seed: str,
    *,
    score: float = 1.0,
    steps: int = 20,
    chunk: int = 1,
    cameras: Cameras | None = _DEFAULT_CAMERAS,
    size: tuple[int, int] = (64, 48),
    fps: float = 30.0,
    instruction: str = "pick up the cube",
    robot_id: str = "manip/lift2/R5a",
    worker_id: str = "0",
    complete: bool = True,
    videos: bool = True,
    extra_frames: int = 0,
    frames_override: Mapping[str, int] | None = None,
) -> Path:
    """Write one client-layout episode under ``run_dir/task/seed``; return its directory.

    Args:
        run_dir: ``<results_root>/<benchmark>/<run_id>`` (a minimal ``run.json`` is written when
            there is none).
        task, seed: the episode's task name (may contain ``/``) and seed.
        score: the result's score in [0, 1] (``sr`` is 1 when it is 1).
        steps: executed actions (rows of ``steps.jsonl``).
        chunk: actions per policy chunk: one observation (state, video frame) per chunk, frame
            ``j`` being observation ``j`` at timestep ``j * chunk``.
        cameras: camera names (each ``size`` = ``(width, height)`` px) or name -> own size; see
            :func:`robot_cameras` for a robot's real ones.
        extra_frames: frames appended that no row refers to (like a terminal observation).
        frames_override: camera -> forced frame count (to build mismatches).
        complete: write ``result.json`` (and merge ``episode_result.json``), else ``INCOMPLETE``.
        videos: write the camera videos (rows then carry ``frame``; without, ``frame`` is null).
    """
    bench, run_id = run_dir.parent.name, run_dir.name
    ep = run_dir / task / seed
    ep.mkdir(parents=True, exist_ok=True)
    if not (run_dir / RUN_JSON).exists():
        _write_json(run_dir / RUN_JSON, {"run_id": run_id, "benchmark": bench})
    eid = f"{bench}/{run_id}/{task}/{seed}"
    robot = ROBOTS.get(robot_id)
    cams = _camera_sizes(cameras, size) if videos else {}
    spec = robot or get_robot(_FALLBACK_ROBOT)
    act, base = _trajectory(spec, steps, seed=len(task))
    if robot is None:  # unknown robot: 5 action values, state parts of its own
        act = np.sin(np.arange(steps)[:, None] / 10.0 + np.arange(5)[None, :])
    rows = []
    n_obs = 0
    for s in range(steps):
        c = s % chunk
        obs_t = s - c
        frame = obs_t // chunk
        n_obs = max(n_obs, frame + 1)
        state: dict[str, list[float]] | None = None
        if c == 0:
            # The observed state lags the commanded one by a step.
            prev = [float(v) for v in act[max(s - 1, 0)]]
            if robot is not None:
                arms, grips = robot.split_joint_action(prev)
                state = {
                    "joints": arms,
                    "gripper": grips,
                    "base": [float(v) for v in base[s]] if robot.has_base else [0.0] * 3,
                }
            else:
                state = {"joints": prev[:3], "gripper": prev[3:], "extra": [float(s)]}
        rows.append(
            {
                "episode_id": eid,
                "worker_id": worker_id,
                "robot_id": robot_id,
                "step": s,
                "obs_timestep": obs_t,
                "frame": frame if cams else None,
                "state": state,
                "action": {
                    "control_type": "joint_position",
                    "action": [float(v) for v in act[s]],
                    "is_rel": False,
                    "base_motion": [0.001, 0.0005, 0.1 * math.sin(s / 20.0)],
                    "base_is_rel": True,
                },
                "chunk": {"index": c, "size": chunk} if chunk > 1 else None,
                "latency_ms": {"network": 1.0, "server": 2.0, "policy": 0.5} if c == 0 else None,
            }
        )
    (ep / STEPS_JSONL).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if cams:
        _write_videos(ep, cams, n_obs + extra_frames, fps=fps, overrides=frames_override)
    if complete:
        now = time.time()
        sr = 1.0 if _is_success(score) else 0.0
        result = {
            "episode_id": eid,
            "task_name": task,
            "seed": seed,
            "score": score,
            "sr": sr,
            "steps": steps,
            "robot_id": robot_id,
            "worker_id": worker_id,
            "instruction": instruction,
            "started": now - 10,
            "finished": now,
        }
        _write_json(ep / RESULT_JSON, result)
        merged_path = run_dir / task / EPISODE_RESULT
        merged = (
            json.loads(merged_path.read_text(encoding="utf-8")) if merged_path.is_file() else {}
        )
        merged[seed] = {"score": score, "sr": sr}
        _write_json(merged_path, merged)
    else:
        _write_json(
            ep / INCOMPLETE,
            {"episode_id": eid, "worker_id": worker_id, "started": time.time(), "reason": None},
        )
    return ep


def write_client_run(
    results_root: Path,
    benchmark: str,
    run_id: str,
    *,
    tasks: Mapping[str, Sequence[float]],
    steps: int = 20,
    cameras: Cameras | None = _DEFAULT_CAMERAS,
    size: tuple[int, int] = (64, 48),
    instruction: str = "pick up the cube",
    videos: bool = True,
    start: float | None = None,
) -> Path:
    """A client-layout run under ``results_root``; return its directory.

    ``tasks`` maps task name -> scores of seeds ``0, 1, ...`` (NaN: an incomplete episode).
    ``start`` (epoch s) is the run's start time in ``run.json`` (default: now).
    """
    run_dir = results_root / benchmark / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "run_id": run_id,
        "benchmark": benchmark,
        "server_url": "http://127.0.0.1:8087",
        "workers": ["0"],
        "codec": "msgpack",
        "start": start if start is not None else time.time(),
        "end": None,
        "total_episodes": sum(len(v) for v in tasks.values()),
    }
    _write_json(run_dir / RUN_JSON, manifest)
    for task, scores in tasks.items():
        for i, score in enumerate(scores):
            write_client_episode(
                run_dir, task, str(i), score=0.0 if math.isnan(score) else score, steps=steps,
                cameras=cameras, size=size, instruction=instruction, complete=not math.isnan(score),
                videos=videos,
            )  # fmt: skip
    return run_dir


def server_run_dir(project_root: Path, benchmark: str, run_id: str) -> Path:
    """``<project_root>/saved/eval_results/<benchmark>/<run_id>`` (not created)."""
    return project_root / SAVED_DIR / EVAL_RESULTS_DIR / benchmark / run_id


def write_server_episode(
    run_dir: Path,
    task: str,
    seed: str,
    *,
    score: float = 1.0,
    steps: int = 20,
    cameras: Cameras | None = _DEFAULT_CAMERAS,
    size: tuple[int, int] = (64, 48),
    instruction: str = "open the drawer",
    robot_id: str = "manip/lift2/R5a",
    complete: bool = True,
    lock_age: float | None = None,
) -> Path:
    """Write one server-layout episode under ``run_dir/task/seed``; return its directory.

    ``run_dir`` is a server run directory (:func:`server_run_dir`). Written: one video per camera
    with ``steps + 1`` frames (the reset observation's, then one per step, as the server records
    them), ``meta_record.pkl`` (record ``i``: the action of step ``i`` and the state after it),
    ``result_info.json`` when ``complete``, and a ``<seed>.lock`` touched ``lock_age`` seconds ago
    when given. ``robot_id`` must be a known robot.
    """
    robot = get_robot(robot_id)
    ep = run_dir / task / seed
    ep.mkdir(parents=True, exist_ok=True)
    act, base = _trajectory(robot, steps, seed=1)
    joints, grips, bases = [], [], []
    for s in range(steps):
        arms, g = robot.split_joint_action([float(v) for v in act[s]])
        joints.append(np.asarray(arms, dtype=np.float32))
        grips.append(np.asarray(g, dtype=np.float32))
        bases.append(base[s] if robot.has_base else np.zeros(3))
    meta = {
        "joint_positions": joints,
        "gripper_positions": grips,
        "base_positions": bases,
        "instruction": instruction,
        "model_output": [
            {"arm_action": act[s].astype(np.float32), "base_motion": [0.0, 0.0, 0.0]}
            for s in range(steps)
        ],
        "robot_id": robot_id,
    }
    (ep / META_RECORD).write_bytes(pickle.dumps(meta, protocol=4))
    cams = _camera_sizes(cameras, size)
    if cams:
        _write_videos(ep, cams, steps + 1)
    if complete:
        info = {
            "score": score,
            "success_rate": int(_is_success(score)),
            "log_info": {
                "episode_start_time": "2026-01-02_03_04_05_000000",
                "episode_end_time": "2026-01-02_03_05_05_000000",
                "metric_score": [[[score]]],
            },
        }
        _write_json(ep / RESULT_INFO, info)
    if lock_age is not None:
        lock = run_dir / task / f"{seed}{LOCK_SUFFIX}"
        t = time.time() - lock_age
        _write_json(
            lock, {"pid": os.getpid(), "host": "testhost", "worker_id": "1", "timestamp": t}
        )
        os.utime(lock, (t, t))
    return ep


def write_server_run(
    project_root: Path,
    benchmark: str,
    run_id: str,
    *,
    tasks: Mapping[str, Sequence[float]],
    steps: int = 20,
    cameras: Cameras | None = _DEFAULT_CAMERAS,
    size: tuple[int, int] = (64, 48),
    instruction: str = "open the drawer",
) -> Path:
    """A server-layout run under ``project_root/saved/eval_results``; return its directory.

    ``tasks`` maps task name -> scores of seeds ``0, 1, ...``; NaN is a running episode (fresh
    lock, no ``result_info.json``). The metric file is ``result.json`` when every episode is
    done, else ``progress.json`` with the server's ``(done/total)`` key prefixes.
    """
    run_dir = server_run_dir(project_root, benchmark, run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    total = sum(len(v) for v in tasks.values())
    done = sum(1 for v in tasks.values() for s in v if not math.isnan(s))
    metric = {
        (f"({sum(1 for s in v if not math.isnan(s))}/{len(v)})" if done < total else "") + t: float(
            np.nanmean(v) if any(not math.isnan(s) for s in v) else 0.0
        )
        for t, v in tasks.items()
    }
    _write_json(run_dir / (RESULT_JSON if done == total else PROGRESS_JSON), metric)
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
    cameras: Sequence[str] = _DEFAULT_CAMERAS,
    step: int = 7,
    instruction: str = "pick up the cube",
    episode_id: str = "",
    success_rate: float = 0.5,
    size: tuple[int, int] = (64, 48),
) -> Path:
    """Publish a live view for ``worker_id`` in ``run_dir`` (one JPEG per camera of ``size`` px
    and ``live.json`` with a running success rate over 4 episodes) through
    :func:`genmanip_results.live.write_live_view`; return the worker's live directory."""
    from genmanip_protocol.codec.jpeg import encode_jpeg

    from .live import write_live_view
    from .stats import wilson_interval

    w, h = size
    frames = {
        cam: encode_jpeg(synthetic_frame(step, w, h, seed=i), quality=85)
        for i, cam in enumerate(cameras)
    }
    successes = round(4 * success_rate)
    task_name = episode_id.split("/", 2)[-1].rsplit("/", 1)[0] if episode_id.count("/") >= 3 else ""
    state = {
        "worker_id": worker_id,
        "step": step,
        "episode_id": episode_id,
        "instruction": instruction,
        "task_name": task_name,
        "updated": time.time(),
        # the running success rate as gmp eval's recorder writes it
        "episodes": 4,
        "successes": successes,
        "sr": success_rate,
        "sr_ci95": list(wilson_interval(successes, 4)),
    }
    return write_live_view(run_dir, worker_id, frames, state)


# ------------------------------------------------------------------ light trees (no ffmpeg)


def _write_json_mkdir(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, obj)


def make_server_run(
    project: Path,
    *,
    benchmark: str = "testbed",
    run_id: str = "run1",
    tasks: dict[str, int] | None = None,
    done: dict[str, Iterable[int]] | None = None,
    scores: dict[tuple[str, int], float] | None = None,
    videos: bool = True,
) -> Path:
    """A light server-layout run under ``project``; return its directory.

    ``tasks`` maps task name -> num_test; ``done`` the finished seeds per task (default: all);
    ``scores`` overrides a ``(task, seed)``'s score (default 1.0 for even seeds, 0.25 for odd).
    ``meta_record.pkl`` is a pickled None; with ``videos``, ``left_camera.mp4`` and
    ``episode.rrd`` are random bytes of plausible size (not decodable).
    """
    tasks = tasks or {f"{benchmark}/reach/red_easy": 2, f"{benchmark}/reach/blue_easy": 2}
    done = done if done is not None else {t: range(n) for t, n in tasks.items()}
    scores = scores or {}
    run = server_run_dir(project, benchmark, run_id)
    metric = {}
    all_done = True
    for task, n in tasks.items():
        seeds = list(done.get(task, []))
        all_done &= len(seeds) == n
        vals = []
        for s in seeds:
            score = scores.get((task, s), 1.0 if s % 2 == 0 else 0.25)
            vals.append(score)
            ep = run / task / f"{s:03d}"
            _write_json_mkdir(
                ep / RESULT_INFO,
                {"score": score, "success_rate": int(score == 1.0),
                 "log_info": {"episode_start_time": "2026_01_01_00_00_00_000000",
                              "episode_end_time": "2026_01_01_00_01_00_000000",
                              "metric_score": [[[score]]]}},
            )  # fmt: skip
            (ep / META_RECORD).write_bytes(b"\x80\x05N.")
            if videos:
                (ep / f"left_camera{VIDEO_SUFFIX}").write_bytes(os.urandom(2048))
                (ep / EPISODE_RRD).write_bytes(os.urandom(512))
        prefix = "" if len(seeds) == n else "*"
        key = f"{prefix}({len(seeds)}/{n}){task}" if seeds else f"*{task}"
        mean = sum(vals) / len(vals) if vals else 0.0
        metric[key] = {"score": mean, "sr": sum(v == 1.0 for v in vals) / max(1, len(vals))}
    _write_json_mkdir(run / (RESULT_JSON if all_done else PROGRESS_JSON), metric)
    return run


def make_client_run(
    root: Path,
    *,
    benchmark: str = "testbed",
    run_id: str = "crun",
    tasks: dict[str, int] | None = None,
    incomplete: Iterable[tuple[str, int]] = (),
) -> Path:
    """A light client-layout run under results root ``root`` (``<root>/<benchmark>/<run_id>``);
    return its directory.

    ``tasks`` maps task name -> episodes; ``incomplete`` the ``(task, seed)`` left ``INCOMPLETE``.
    Every episode has a two-row ``steps.jsonl`` (``step`` only) and a ``left_camera.mp4`` of random
    bytes; score 1.0 for even seeds, 0.0 for odd.
    """
    tasks = tasks or {f"{benchmark}/reach/red_easy": 2}
    run = root / benchmark / run_id
    total = sum(tasks.values())
    _write_json_mkdir(run / RUN_JSON, {"run_id": run_id, "benchmark": benchmark,
                                       "total_episodes": total,
                                       "server_url": "http://127.0.0.1:8087",
                                       "started": "2026-01-01T00:00:00+00:00"})  # fmt: skip
    inc = set(incomplete)
    for task, n in tasks.items():
        er = {}
        for s in range(n):
            ep = run / task / f"{s:03d}"
            ep.mkdir(parents=True, exist_ok=True)
            (ep / STEPS_JSONL).write_text('{"step": 0}\n{"step": 1}\n', encoding="utf-8")
            (ep / f"left_camera{VIDEO_SUFFIX}").write_bytes(os.urandom(1024))
            if (task, s) in inc:
                (ep / INCOMPLETE).write_text("", encoding="utf-8")
                continue
            score = 1.0 if s % 2 == 0 else 0.0
            _write_json(ep / RESULT_JSON, {
                "episode_id": f"{benchmark}/{run_id}/{task}/{s:03d}", "task_name": task,
                "seed": f"{s:03d}", "score": score, "sr": score, "steps": 2,
                "robot_id": "manip/lift2/R5a", "worker_id": "0", "instruction": "reach",
                "started": 1.0, "finished": 2.0})  # fmt: skip
            er[f"{s:03d}"] = {"score": score, "sr": score}
        _write_json(run / task / EPISODE_RESULT, er)
    return run


@contextlib.contextmanager
def writer_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this host that sleeps until the block ends (then killed and reaped): it stands
    in for a ``gmp eval`` writer, whose pid a run's ``run.json`` segment names."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)
