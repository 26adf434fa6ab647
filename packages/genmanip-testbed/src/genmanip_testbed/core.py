"""The evaluation server's job, worker and reset state machine (wire-independent).

Reproduces the protocol-visible behaviour of the real GenManip server (reference facts §2-§9): the
pending-form placeholder, background resets whose result is collected by ``/reset_result`` (a
destructive read) or by the next ``/step``, results one hop late, the chunk fast path that swallows
an unpolled finished reset, the slow path that stops after a pending/finished worker, ``/kill``
re-queueing the seed at the front, run-id resume, lock files, and the on-disk result layout.

Threading: one lock for the job state (``_job``), one re-entrant lock per worker; world steps run
in the caller's thread (the HTTP layer runs them in a thread pool), multi-worker ``/step`` fans out
to a step pool, resets and finalizes run in their own pools.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from genmanip_protocol.robots import RobotSpec, get_robot
from genmanip_results.layout import (
    EVAL_RESULTS_DIR,
    LOCK_SUFFIX,
    META_RECORD,
    PROGRESS_JSON,
    RESULT_INFO,
    RESULT_JSON,
    SAVED_DIR,
    VIDEO_SUFFIX,
)
from genmanip_results.paths import UnsafePathError, safe_relative

from .errors import GenmanipTestbedError
from .faults import FaultState
from .render import FrameCache
from .stats import Stats
from .tasks import TaskSpec, resolve_configs
from .world import Episode, StepError

__all__ = [
    "CoreConfig",
    "EvalCore",
    "InsufficientResourcesError",
    "RayActorError",
    "RemoteTaskError",
    "pending_form",
]

log = logging.getLogger("genmanip_testbed.core")

_SEED_KEY = tuple[str, str]  # (task_name, seed)


class InsufficientResourcesError(Exception):
    """More workers than slots (the real server's exception name)."""

    def __init__(self, requested: int, available: int) -> None:
        super().__init__(
            f"Insufficient resources: requested {requested} workers, but only {available} slots available"
        )


class RayActorError(Exception):
    """A worker died (killed, or a ``die_worker`` fault); mirrors Ray's error name."""


class RemoteTaskError(Exception):
    """A worker-side exception, shown like Ray's ``RayTaskError(<Cause>)``.

    ``str()`` is Ray's text (the remote call and the cause); :meth:`detail` is the HTTP detail of the
    routes that format ``"<ExceptionClass>: <message>"``.
    """

    def __init__(self, cause: BaseException, method: str, worker_id: str) -> None:
        self.cause = cause
        self.method = method
        text = (
            f"ray::GenManipWorker.{method}() (pid={os.getpid()}, ip=127.0.0.1, worker={worker_id})\n"
            f"{type(cause).__name__}: {cause}"
        )
        super().__init__(text)

    def detail(self) -> str:
        return f"RayTaskError({type(self.cause).__name__}): {self}"


def pending_form(metric: dict[str, Any]) -> dict[str, Any]:
    """The placeholder entry of a worker whose reset is still running (facts §2)."""
    return {
        "obs": {"reset": True, "reset_pending": True},
        "metric": metric,
        "episode_result": None,
        "reset_pending": True,
    }


def _now_str() -> str:
    return datetime.now().strftime("%Y-%m-%d_%H_%M_%S_%f")


class CoreConfig:
    """Tunables of :class:`EvalCore` (times in seconds)."""

    def __init__(
        self,
        *,
        robot: str | RobotSpec = "manip/lift2/R5a",
        results_root: Path,
        save_process: bool = False,
        capacity: int = 8,
        reset_delay: float = 0.03,
        num_steps: int | None = None,
        is_rel_default: bool = False,
        render: bool = True,
        rescan_interval: float = 0.05,
        next_task_timeout: float = 600.0,
        lock_stale_s: float = 300.0,
        frame_cache: bool = True,
        video_fps: int = 30,
        world_seed: int = 0,
    ) -> None:
        self.robot = get_robot(robot)
        self.results_root = Path(results_root)
        self.save_process = save_process
        self.capacity = int(capacity)
        self.reset_delay = float(reset_delay)
        self.num_steps = num_steps
        self.is_rel_default = is_rel_default
        self.render = render
        self.rescan_interval = rescan_interval
        self.next_task_timeout = next_task_timeout
        self.lock_stale_s = lock_stale_s
        self.frame_cache = frame_cache
        self.video_fps = video_fps
        self.world_seed = int(world_seed)


class _Worker:
    def __init__(self, wid: Any) -> None:
        self.wid = wid
        self.lock = threading.RLock()
        self.episode: Episode | None = None
        self.claim: _SEED_KEY | None = None
        self.pending: Future[dict[str, Any]] | None = None
        self.cancel = threading.Event()
        self.dead = False
        self.finished = False
        self.lock_failures = 0
        self.first_chunk = True
        self.frames: dict[str, list[Future[bytes]]] = {}
        self.started = ""


class EvalCore:
    """One evaluation server's state. All public methods are thread-safe.

    Methods raise plain exceptions whose class name and message the HTTP layer turns into the real
    server's ``detail`` strings.
    """

    def __init__(
        self, config: CoreConfig, *, stats: Stats | None = None, faults: FaultState | None = None
    ) -> None:
        self.cfg = config
        self.robot = config.robot
        self.stats = stats or Stats()
        self.faults = faults or FaultState()
        # 32 frames = 8 lift2 states (~60 MB): enough for holds, retries and chunk re-renders.
        self.cache = FrameCache(32, enabled=config.frame_cache)
        self._job = threading.RLock()
        self._finalize_cv = threading.Condition(self._job)
        self._finalizing = 0
        self.benchmark_id: str | None = None
        self.run_id: str | None = None
        self.tasks: list[TaskSpec] = []
        self._task_by_name: dict[str, TaskSpec] = {}
        self._order: list[_SEED_KEY] = []
        self.scores: dict[_SEED_KEY, tuple[float, float]] = {}
        self._claims: dict[_SEED_KEY, Any] = {}
        self._leaked: set[_SEED_KEY] = set()
        self._lock_idents: dict[_SEED_KEY, tuple[int, int]] = {}  # (st_dev, st_ino) of our locks
        self._requeued: deque[_SEED_KEY] = deque()
        self.workers: dict[Any, _Worker] = {}
        self._reset_pool = ThreadPoolExecutor(
            max(4, config.capacity + 2), thread_name_prefix="testbed-reset"
        )
        self._step_pool = ThreadPoolExecutor(32, thread_name_prefix="testbed-step")
        self._finalize_pool = ThreadPoolExecutor(1, thread_name_prefix="testbed-finalize")
        # Recording JPEG-encodes frames off the request path; finalize waits for them in order.
        self._record_pool = ThreadPoolExecutor(2, thread_name_prefix="testbed-record")
        self._closed = False
        self._cancels: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        self._host = socket.gethostname()

    # ==================================================================================== job ====
    @property
    def run_dir(self) -> Path:
        """``<results_root>/saved/eval_results/<benchmark>/<run_id>`` of the loaded job."""
        if self.benchmark_id is None or self.run_id is None:
            raise GenmanipTestbedError("no job is loaded: start one with /start_new_job first")
        return self.cfg.results_root / SAVED_DIR / EVAL_RESULTS_DIR / self.benchmark_id / self.run_id

    def _seed_dir(self, key: _SEED_KEY) -> Path:
        return self.run_dir / key[0] / key[1]

    def _lock_path(self, key: _SEED_KEY) -> Path:
        return self.run_dir / key[0] / f"{key[1]}{LOCK_SUFFIX}"

    @staticmethod
    def validate_run_id(run_id: str) -> str:
        # A request names the run directory: the one path rule (genmanip_results.paths, the wire
        # rule) decides, so no "..", absolute path, NUL or other control character, backslash,
        # drive letter or over-long segment makes it, in the real server's words.
        try:
            safe_relative(run_id, field="run_id")
        except UnsafePathError:
            raise ValueError("run_id contains invalid path segments") from None
        return run_id

    def wait_finalizes(self, timeout: float | None = None) -> bool:
        """Block until every episode finalize (result files) is written."""
        with self._finalize_cv:
            return self._finalize_cv.wait_for(lambda: self._finalizing == 0, timeout)

    def start_new_job(self, config_paths: list[str], run_id: str | None) -> None:
        """Load a job: kill every worker, resolve configs, pick the run id, resume finished seeds."""
        self.wait_finalizes()
        self.kill(list(self.workers))
        effective = run_id if run_id else (self.run_id or _now_str())
        self.validate_run_id(effective)
        benchmark, tasks = resolve_configs(list(config_paths))
        with self._job:
            self.benchmark_id, self.run_id = benchmark, effective
            self.tasks = tasks
            self._task_by_name = {t.name: t for t in tasks}
            self._order = [(t.name, s) for t in tasks for s in t.seeds()]
            self.scores = {}
            self._claims = {}
            self._leaked = set()
            self._requeued = deque()
            for key in self._order:
                info = self._read_result_info(key)
                if info is not None:
                    self.scores[key] = info
        log.info(
            "job loaded: %s run %s, %d episodes (%d already done)",
            benchmark,
            effective,
            len(self._order),
            len(self.scores),
        )

    def _read_result_info(self, key: _SEED_KEY) -> tuple[float, float] | None:
        path = self._seed_dir(key) / RESULT_INFO
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            score = float(data["score"])
            sr = float(
                data.get("success_rate", data.get("sr", 1.0 if abs(score - 1) < 1e-6 else 0.0))
            )
            return score, sr
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # ================================================================================= metric ====
    def metric(self) -> dict[str, dict[str, float]]:
        """The progress-prefixed metric dict (facts §6)."""
        with self._job:
            out: dict[str, dict[str, float]] = {}
            for t in self.tasks:
                done = [self.scores[(t.name, s)] for s in t.seeds() if (t.name, s) in self.scores]
                n, d = t.num_test, len(done)
                if d == 0:
                    out[f"*{t.name}"] = {"score": 0.0, "sr": 0.0}
                    continue
                key = f"({n}/{n}){t.name}" if d >= n else f"*({d}/{n}){t.name}"
                out[key] = {
                    "score": float(np.mean([x[0] for x in done])),
                    "sr": float(np.mean([x[1] for x in done])),
                }
            return out

    def status(self, refresh: bool = False) -> dict[str, Any]:
        """The ``/status`` data dict (facts §9.1)."""
        with self._job:
            total = sum(t.num_test for t in self.tasks)
            if refresh and self.benchmark_id is not None:
                completed = sum(
                    1 for k in self._order if (self._seed_dir(k) / RESULT_INFO).exists()
                )
                in_progress = sum(1 for k in self._order if self._lock_fresh(k))
            else:
                completed = len(self.scores)
                in_progress = len(self._claims) + len(self._leaked)
            active = [w for w, wk in self.workers.items() if not wk.dead]
            results: dict[str, float] = {}
            for t in self.tasks:
                vals = [
                    self.scores[(t.name, s)][0] for s in t.seeds() if (t.name, s) in self.scores
                ]
                if vals:
                    results[t.name] = float(np.mean(vals))
            if not self.tasks:
                status = "idle"
            elif completed >= total and self._finalizing == 0:
                status = "complete"
            elif active:
                status = "running"
            elif completed or in_progress:
                status = "incomplete"
            else:
                status = "idle"
            return {
                "status": status,
                "benchmark_id": self.benchmark_id,
                "run_id": self.run_id,
                "total_episodes": total,
                "completed_episodes": completed,
                "in_progress_episodes": in_progress,
                "active_workers": active,
                "results": results,
            }

    # ================================================================================== locks ====
    def _lock_fresh(self, key: _SEED_KEY) -> bool:
        p = self._lock_path(key)
        try:
            age = time.time() - p.stat().st_mtime
        except OSError:
            return False
        return (
            age <= self.cfg.lock_stale_s and not (self._seed_dir(key) / RESULT_INFO).exists()
        )

    def _create_lock(self, key: _SEED_KEY, wid: Any) -> bool:
        path = self._lock_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(
            {
                "worker_id": str(wid),
                "timestamp": time.time(),
                "pid": os.getpid(),
                "host": self._host,
                "task_name": key[0],
                "seed": key[1],
            }
        ).encode()
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self._lock_fresh(key):
                    return False
                try:  # stale (or its episode is done): anyone may remove it
                    path.unlink()
                except FileNotFoundError:
                    pass
                continue
            try:
                os.write(fd, payload)
                st = os.fstat(fd)
                self._lock_idents[key] = (st.st_dev, st.st_ino)
            finally:
                os.close(fd)
            return True
        return False

    def _refresh_lock(self, w: _Worker) -> bool:
        if w.claim is None or self.benchmark_id is None:
            return True
        path = self._lock_path(w.claim)
        try:
            # The file this process created is ours (a lock is taken over only by removing it and
            # creating a new one): its inode says so without reading it, twice a step. Another
            # file there (removed and re-made, or made by an earlier process) is judged by what
            # it says.
            st = os.stat(path)
            if self._lock_idents.get(w.claim) != (st.st_dev, st.st_ino):
                data = json.loads(path.read_text(encoding="utf-8"))
                if data.get("pid") != os.getpid() or data.get("worker_id") != str(w.wid):
                    raise ValueError("not ours")
                self._lock_idents[w.claim] = (st.st_dev, st.st_ino)
            os.utime(path)
        except (OSError, ValueError):
            w.lock_failures += 1
            return w.lock_failures < 3
        w.lock_failures = 0
        return True

    def _delete_lock(self, key: _SEED_KEY, wid: Any) -> None:
        path = self._lock_path(key)
        self._lock_idents.pop(key, None)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("pid") == os.getpid() and data.get("worker_id") == str(wid):
                path.unlink()
        except (OSError, ValueError):
            pass

    # ================================================================================ workers ====
    def create_workers(self, worker_ids: list[Any]) -> None:
        """Create missing workers (ids kept as given, like the real ``/create_workers``)."""
        with self._job:
            new = [w for w in dict.fromkeys(worker_ids) if w not in self.workers]
            total = len(self.workers) + len(new)
            if total > self.cfg.capacity:
                raise InsufficientResourcesError(total, self.cfg.capacity)
            for wid in new:
                self.workers[wid] = _Worker(wid)

    def kill(self, worker_ids: list[Any]) -> None:
        """Cancel pending resets, kill the workers, delete their locks, re-queue their seeds first."""
        with self._job:
            for wid in worker_ids:
                w = self.workers.pop(wid, None)
                if w is None:
                    continue
                w.dead = True
                w.cancel.set()
                if w.pending is not None:
                    w.pending.cancel()
                self._release_claim(w)
                self.stats.add("kills")

    def _release_claim(self, w: _Worker) -> None:
        # Caller holds self._job.
        key = w.claim
        if key is not None:
            self._claims.pop(key, None)
            if self.benchmark_id is not None:
                self._delete_lock(key, w.wid)
            if key not in self.scores:
                self._requeued.appendleft(key)
        w.claim = None
        w.episode = None

    def _claim_next(self, w: _Worker) -> _SEED_KEY | None:
        with self._job:
            if w.dead:
                return None
            candidates = list(self._requeued) + self._order
            for key in candidates:
                if key in self.scores or key in self._claims:
                    continue
                if key in self._leaked and self._lock_fresh(key):
                    continue
                if not self._create_lock(key, w.wid):
                    info = self._read_result_info(key)
                    if info is not None:  # finished by another server sharing the run dir
                        self.scores[key] = info
                    continue
                try:
                    self._requeued.remove(key)
                except ValueError:
                    pass
                self._leaked.discard(key)
                self._claims[key] = w.wid
                w.claim = key
                return key
            return None

    def _all_done(self) -> bool:
        with self._job:
            return all(k in self.scores for k in self._order)

    # ================================================================================= resets ====
    def _start_reset(
        self, w: _Worker, previous: dict[str, Any] | None, key: _SEED_KEY | None
    ) -> None:
        w.cancel = threading.Event()
        # Every reset's cancel event, not only the workers' current ones: close() must stop a
        # reset whose worker was killed or replaced meanwhile, or the pool shutdown waits for it.
        with self._job:
            self._cancels.add(w.cancel)
        w.finished = False
        self.stats.add("resets_started")
        w.pending = self._reset_pool.submit(self._do_reset, w, previous, key, w.cancel)

    def _do_reset(
        self,
        w: _Worker,
        previous: dict[str, Any] | None,
        key: _SEED_KEY | None,
        cancel: threading.Event,
    ) -> dict[str, Any]:
        if cancel.wait(self.faults.reset_delay(str(w.wid), self.cfg.reset_delay)):
            raise RuntimeError(f"Worker {w.wid} reset cancelled before start")
        if self.faults.take_stall():
            self.stats.add("faults", "stall_reset")
            cancel.wait()
            raise RuntimeError(f"Worker {w.wid} reset cancelled (stalled)")
        deadline = time.monotonic() + self.cfg.next_task_timeout
        while key is None:
            if cancel.is_set():
                raise RuntimeError(f"Worker {w.wid} reset cancelled before start")
            key = self._claim_next(w)
            if key is not None:
                break
            if self._all_done():
                return self._finish_worker(w, previous)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"No task became available for worker {w.wid} within {self.cfg.next_task_timeout}s"
                )
            cancel.wait(self.cfg.rescan_interval)
        task = self._task_by_name[key[0]]
        episode_id = f"{self.benchmark_id}/{self.run_id}/{key[0]}/{key[1]}"
        ep = Episode(
            self.robot,
            task,
            key[1],
            episode_id,
            num_steps=self.cfg.num_steps,
            is_rel_default=self.cfg.is_rel_default,
            cache=self.cache,
            render=self.cfg.render,
            world_seed=self.cfg.world_seed,
        )
        obs = ep.observation(render=True)
        with w.lock:
            if w.dead or cancel.is_set():
                raise RuntimeError(f"Worker {w.wid} reset cancelled")
            w.episode = ep
            self.stats.new_attempt(episode_id)
            w.first_chunk = True
            w.started = _now_str()
            w.frames = {}
            if self.cfg.save_process:
                self._record_frames(w, obs)
        self.stats.add("resets_finished")
        return {"obs": obs, "metric": self.metric(), "episode_result": previous}

    def _finish_worker(self, w: _Worker, previous: dict[str, Any] | None) -> dict[str, Any]:
        self.wait_finalizes()
        metric = self.metric()
        with self._job:
            if self.benchmark_id is not None:
                from genmanip_runtime.atomic import atomic_write_json

                name = RESULT_JSON if self._all_done() else PROGRESS_JSON
                self.run_dir.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self.run_dir / name, metric)
        w.finished = True
        self.stats.add("resets_finished")
        return {"obs": None, "metric": metric, "episode_result": previous}

    def _consume(self, w: _Worker) -> dict[str, Any]:
        fut = w.pending
        assert fut is not None and fut.done()
        w.pending = None
        return fut.result()

    def _entry_for_pending(self, w: _Worker) -> dict[str, Any]:
        assert w.pending is not None
        if w.pending.done():
            return self._consume(w)
        return pending_form(self.metric())

    def _require_job(self) -> None:
        if self.benchmark_id is None:
            raise ValueError("No job started. Call start_new_job first.")

    def reset(self, worker_ids: list[Any] | None) -> dict[str, Any]:
        """``/reset`` (facts §2): pending placeholders; creates missing workers."""
        self._require_job()
        if worker_ids is None:
            worker_ids = list(self.workers)
            if not worker_ids:
                raise ValueError(
                    "worker_ids not provided and no active workers exist; create workers first"
                )
        if not isinstance(worker_ids, list) or not worker_ids:
            raise ValueError("worker_ids must be a non-empty list")
        ids = [str(w) for w in worker_ids]
        if any(w.strip() == "" for w in ids):
            raise ValueError("worker_ids must contain non-empty values")
        self.create_workers(ids)
        out: dict[str, Any] = {}
        for wid in ids:
            w = self.workers[wid]
            with w.lock:
                if w.pending is not None:
                    out[wid] = self._entry_for_pending(w)
                    continue
                if w.episode is not None:
                    # The real server takes a new seed without releasing the old one: it leaks
                    # until its lock goes stale. Clients call /kill first.
                    with self._job:
                        if w.claim is not None:
                            self._claims.pop(w.claim, None)
                            self._leaked.add(w.claim)
                        w.claim = None
                        w.episode = None
                key = self._claim_next(w)
                if key is None and self._all_done():
                    out[wid] = {"obs": None, "metric": self.metric(), "episode_result": None}
                    w.finished = True
                    continue
                self._start_reset(w, None, key)
                out[wid] = pending_form(self.metric())
        return out

    def reset_result(self, worker_ids: list[Any] | None) -> dict[str, Any]:
        """``/reset_result``: a finished reset is returned and consumed; a running one is pending."""
        self._require_job()
        if worker_ids is None:
            worker_ids = [wid for wid, w in list(self.workers.items()) if w.pending is not None]
        if not isinstance(worker_ids, list) or not worker_ids:
            raise ValueError("worker_ids must be a non-empty list")
        ids = [str(w) for w in worker_ids]
        for wid in ids:
            w = self.workers.get(wid)
            if w is None or w.pending is None:
                raise ValueError(f"worker {wid} has no pending reset result")
        out: dict[str, Any] = {}
        for wid in ids:
            w = self.workers[wid]
            with w.lock:
                if w.pending is None:
                    raise ValueError(f"worker {wid} has no pending reset result")
                out[wid] = self._entry_for_pending(w)
        return out

    # ================================================================================== steps ====
    def _encode_frame(self, arr: np.ndarray) -> bytes:
        from genmanip_protocol.codec import JpegFrame

        jf = self.cache.jpeg(arr)
        if not isinstance(jf, JpegFrame):
            jf = JpegFrame.encode(arr, quality=85)
            self.cache.put_jpeg(arr, jf)
        return jf.data

    def _record_frames(self, w: _Worker, obs: dict[str, Any]) -> None:
        for key, val in obs.items():
            if key.startswith("video.") and isinstance(val, np.ndarray):
                w.frames.setdefault(key, []).append(
                    self._record_pool.submit(self._encode_frame, val)
                )

    def _end_episode(self, w: _Worker) -> dict[str, Any]:
        ep = w.episode
        key = w.claim
        if ep is None or key is None:  # killed while stepping
            raise RayActorError("The actor died unexpectedly before finishing this task.")
        score = ep.score
        sr = 1.0 if ep.success else 0.0
        result = {
            "episode_id": ep.episode_id,
            "task_name": key[0],
            "seed": key[1],
            "score": score,
            "sr": sr,
        }
        with self._job:
            self.scores[key] = (score, sr)
            self._claims.pop(key, None)
            self._finalizing += 1
        self.stats.add("episodes_finished")
        frames, started = w.frames, w.started
        w.frames = {}
        w.episode = None
        w.claim = None
        self._finalize_pool.submit(self._finalize, ep, key, w.wid, self.run_dir, frames, started)
        self._start_reset(w, result, None)
        return pending_form(self.metric())

    def _finalize(  # noqa: PLR0917 - a pool job: positional by nature
        self,
        ep: Episode,
        key: _SEED_KEY,
        wid: Any,
        run_dir: Path,
        frames: dict[str, list[Future[bytes]]],
        started: str,
    ) -> None:
        from genmanip_runtime.atomic import atomic_write_bytes, atomic_write_json

        seed_dir = run_dir / key[0] / key[1]
        try:
            seed_dir.mkdir(parents=True, exist_ok=True)
            if self.cfg.save_process:
                from genmanip_results.video import transcode_jpegs

                for cam_key, futures in frames.items():
                    jpegs = [f.result() for f in futures]
                    name = cam_key[len("video.") :]
                    name = name[: -len("_view")] if name.endswith("_view") else name
                    if jpegs:
                        transcode_jpegs(jpegs, seed_dir / f"{name}{VIDEO_SUFFIX}", fps=self.cfg.video_fps)
                meta = {
                    "joint_positions": ep.record_joints,
                    "gripper_positions": ep.record_gripper,
                    "base_positions": ep.record_base,
                    "instruction": ep.instruction,
                    "model_output": ep.record_outputs,
                    "robot_id": ep.robot.robot_id,
                }
                atomic_write_bytes(
                    seed_dir / META_RECORD,
                    pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL),
                )
            info: dict[str, Any] = {
                "score": float(ep.score),
                "success_rate": 1 if ep.success else 0,
                "log_info": {
                    "episode_start_time": started or _now_str(),
                    "episode_end_time": _now_str(),
                    "metric_score": ep.metric_score,
                },
            }
            if ep.termination_reason is not None:
                info["termination_reason"] = ep.termination_reason
            # Written last: its existence means the episode is done.
            atomic_write_json(seed_dir / RESULT_INFO, info)
            lock = run_dir / key[0] / f"{key[1]}{LOCK_SUFFIX}"
            try:
                data = json.loads(lock.read_text(encoding="utf-8"))
                if data.get("pid") == os.getpid() and data.get("worker_id") == str(wid):
                    lock.unlink()
            except (OSError, ValueError):
                pass
        except Exception:
            log.exception("finalize of %s failed", ep.episode_id)
        finally:
            with self._finalize_cv:
                self._finalizing -= 1
                self._finalize_cv.notify_all()

    def _worker(self, wid: str) -> _Worker:
        w = self.workers.get(wid)
        if w is None:
            raise KeyError(wid)
        return w

    def _die(self, w: _Worker) -> None:
        self.stats.add("faults", "die_worker")
        self.kill([w.wid])

    def _lock_lost(self, w: _Worker) -> dict[str, Any]:
        with self._job:
            key = w.claim
            if key is not None:
                self._claims.pop(key, None)
                if key not in self.scores:
                    self._requeued.appendleft(key)
            w.claim = None
            w.episode = None
        w.lock_failures = 0
        self._start_reset(w, None, None)
        entry = pending_form(self.metric())
        entry["lock_lost"] = True
        return entry

    def _apply(self, w: _Worker, action: Any, method: str) -> None:
        ep = w.episode
        assert ep is not None
        if self.faults.should_die(str(w.wid), self.stats.steps_by_worker[str(w.wid)]):
            self._die(w)
            raise RayActorError(
                f"The actor died unexpectedly before finishing this task. (worker {w.wid}, injected fault)"
            )
        try:
            ep.apply(action)
        except StepError as e:
            raise RemoteTaskError(e.cause, method, str(w.wid)) from e
        self.stats.step_applied(str(w.wid), ep.episode_id)
        if self.cfg.save_process:
            self._record_frames(w, ep.observation(render=True))
        if w.dead:
            raise RayActorError("The actor died unexpectedly before finishing this task.")

    def _step_one(self, wid: str, action: Any) -> dict[str, Any]:
        w = self._worker(wid)
        with w.lock:
            if w.pending is not None:
                return self._entry_for_pending(w)  # the action is dropped
            if w.episode is None:
                if w.finished:
                    return {"obs": None, "metric": self.metric(), "episode_result": None}
                raise ValueError(f"Worker {wid} has no active episode; call /reset first")
            ep = w.episode
            if not self._refresh_lock(w):
                return self._lock_lost(w)
            self._apply(w, action, "step")
            w.first_chunk = False
            if ep.done:
                return self._end_episode(w)
            self._refresh_lock(w)
            return {
                "obs": ep.observation(render=True),
                "metric": self.metric(),
                "episode_result": None,
            }

    def step(self, actions: Any) -> dict[str, Any]:
        """``/step``: ``{wid: action}``; workers step in parallel; any failure fails the request."""
        self._require_job()
        if not isinstance(actions, dict):
            raise AttributeError(f"'{type(actions).__name__}' object has no attribute 'items'")
        items = [(str(k), v) for k, v in actions.items()]
        if len(items) == 1:
            wid, act = items[0]
            return {wid: self._step_one(wid, act)}
        futs = [(wid, self._step_pool.submit(self._step_one, wid, act)) for wid, act in items]
        out: dict[str, Any] = {}
        first_error: BaseException | None = None
        for wid, f in futs:
            try:
                out[wid] = f.result()
            except BaseException as e:
                if first_error is None:
                    first_error = e
        if first_error is not None:
            raise first_error
        return out

    def step_chunk(
        self, chunk: Any, *, render_mode: str = "lite", subframes: int = 2, render_suffix: int = 2
    ) -> dict[str, Any]:
        """``/step_chunk`` with the real fast-path / slow-path semantics (facts §4)."""
        self._require_job()
        if not isinstance(chunk, list) or not chunk:
            raise ValueError("action_chunk must be a non-empty list")
        if any(not isinstance(a, dict) or not a for a in chunk):
            raise ValueError("Each action in action_chunk must be a non-empty dict")
        keys = {str(k) for a in chunk for k in a}
        if len(keys) == 1 and all(len(a) == 1 for a in chunk):
            wid = next(iter(keys))
            w = self.workers.get(wid)
            if w is not None:
                with w.lock:
                    if w.pending is not None and w.pending.done() and not w.pending.cancelled():
                        # The real fast-path check consumes a finished, unpolled reset: its first
                        # observation and the previous episode_result are lost.
                        try:
                            swallowed = self._consume(w)
                        except Exception:
                            raise
                        self.stats.add("resets_swallowed")
                        if swallowed.get("obs") is None:
                            return {
                                "obs": {wid: swallowed},
                                "executed_steps": 1,
                                "stopped_early": len(chunk) > 1,
                            }
                    if w.pending is None and w.episode is not None:
                        return self._fast_chunk(w, wid, chunk, render_mode, render_suffix)
        return self._slow_chunk(chunk)

    def _fast_chunk(
        self,
        w: _Worker,
        wid: str,
        chunk: list[dict[Any, Any]],
        render_mode: str,
        render_suffix: int,
    ) -> dict[str, Any]:
        self.stats.add("chunk_paths", "fast")
        if not self._refresh_lock(w):
            return {"obs": {wid: self._lock_lost(w)}, "executed_steps": 0, "stopped_early": True}
        n = len(chunk)
        executed = 0
        entry: dict[str, Any] | None = None
        first = w.first_chunk
        w.first_chunk = False
        for i, body in enumerate(chunk):
            action = next(iter(body.values()))
            self._apply(w, action, "step_chunk")
            executed += 1
            ep = w.episode
            assert ep is not None
            if ep.done:
                entry = self._end_episode(w)
                break
            if i < n - 1 and (render_mode == "always" or first or i >= n - 1 - render_suffix):
                self.stats.add("render_passes")
        self._refresh_lock(w)
        if entry is None:
            assert w.episode is not None
            entry = {
                "obs": w.episode.observation(render=True),
                "metric": self.metric(),
                "episode_result": None,
            }
        done = bool(entry.get("reset_pending"))
        return {
            "obs": {wid: entry},
            "executed_steps": executed,
            "stopped_early": done or executed < n,
        }

    def _slow_chunk(self, chunk: list[dict[Any, Any]]) -> dict[str, Any]:
        self.stats.add("chunk_paths", "slow")
        executed = 0
        resp: dict[str, Any] = {}
        stop = False
        for body in chunk:
            resp = self.step(body)
            executed += 1
            stop = any(
                e.get("reset_pending")
                or e.get("obs") is None
                or (isinstance(e.get("obs"), dict) and e["obs"].get("reset"))
                for e in resp.values()
            )
            if stop:
                break
        # Like the fast path: an episode end (or a worker that is pending/finished) counts as early.
        return {
            "obs": resp,
            "executed_steps": executed,
            "stopped_early": stop or executed < len(chunk),
        }

    # ================================================================================= close ====
    def close(self) -> None:
        """Cancel resets, wait for finalizes (bounded), stop the pools."""
        if self._closed:
            return
        self._closed = True
        with self._job:
            for w in self.workers.values():
                w.cancel.set()
                if w.pending is not None:
                    w.pending.cancel()
            for ev in self._cancels:
                ev.set()
        self.wait_finalizes(timeout=60)
        self._reset_pool.shutdown(wait=True, cancel_futures=True)
        self._step_pool.shutdown(wait=True, cancel_futures=True)
        self._finalize_pool.shutdown(wait=True)
        self._record_pool.shutdown(wait=True, cancel_futures=True)
        self.cache.clear()
