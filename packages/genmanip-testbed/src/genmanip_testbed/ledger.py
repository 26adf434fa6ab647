"""The loaded job's seed ledger: where every (task, seed) of the job stands, in memory and on disk.

Owns the job's identity (benchmark id, run id, hence the run directory), its tasks in seed order,
and each seed's state: claimed by a worker, leaked (facts §2: ``/reset`` of a busy worker takes a
new seed without releasing the old one), re-queued at the front (``/kill``, a lost lock), or
scored. It also owns every lock-file operation (facts §12.1: created exclusively, touched around
each step, stale after ``lock_stale_s`` or once the seed's ``result_info.json`` exists, removed
only by its owner unless stale), the resume read of ``result_info.json`` (facts §9.2), the
progress-prefixed metric (facts §6), the ``/status`` view (facts §9.1) and the run's
``result.json`` / ``progress.json``.

Lock discipline: the in-memory state is guarded by the job lock handed in (the core's RLock).
Every method takes it itself, so callers may or may not hold it already; a caller holds it
across several calls only where they must be one atomic step (``/status`` reading the workers
too, an episode's end counting its finalize). :meth:`SeedLedger.refresh_lock` is the one exception: it runs under the worker's
lock only (twice a step, not worth the job lock) and touches just the worker's failure count and
``_lock_idents``, whose single-key reads and writes are atomic under the GIL.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from genmanip_results.layout import (
    EVAL_RESULTS_DIR,
    LOCK_SUFFIX,
    PROGRESS_JSON,
    RESULT_INFO,
    RESULT_JSON,
    SAVED_DIR,
)

from .config import CoreConfig
from .errors import GenmanipTestbedError
from .tasks import TaskSpec
from .worker import SeedKey, Worker

__all__ = ["SeedLedger", "lock_path", "unlink_own_lock"]


def lock_path(run_dir: Path, key: SeedKey) -> Path:
    """``<run_dir>/<task_name>/<seed>.lock``."""
    return run_dir / key[0] / f"{key[1]}{LOCK_SUFFIX}"


def unlink_own_lock(path: Path, wid: Any) -> None:
    """Remove a lock file only if this process's worker ``wid`` wrote it (never a foreign one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("pid") == os.getpid() and data.get("worker_id") == str(wid):
            path.unlink()
    except (OSError, ValueError):
        pass


class SeedLedger:
    """The seeds of the loaded job (one ledger per core, re-filled by :meth:`load`)."""

    def __init__(self, *, cfg: CoreConfig, lock: threading.RLock) -> None:
        self._cfg = cfg
        self._lock = lock
        self.benchmark_id: str | None = None
        self.run_id: str | None = None
        self.tasks: list[TaskSpec] = []
        self.order: list[SeedKey] = []
        self.scores: dict[SeedKey, tuple[float, float]] = {}
        self._task_by_name: dict[str, TaskSpec] = {}
        self._claims: dict[SeedKey, Any] = {}
        self._leaked: set[SeedKey] = set()
        self._requeued: deque[SeedKey] = deque()
        # (st_dev, st_ino) of the lock files this process created. Kept across jobs: every claim
        # records its key afresh when it creates its lock.
        #: (device, inode, mtime in ns) of each lock file this process made or last touched
        self._lock_idents: dict[SeedKey, tuple[int, int, int]] = {}
        self._host = socket.gethostname()

    # ================================================================================== job ====
    @property
    def run_dir(self) -> Path:
        """``<results_root>/saved/eval_results/<benchmark>/<run_id>`` of the loaded job."""
        if self.benchmark_id is None or self.run_id is None:
            raise GenmanipTestbedError("no job is loaded: start one with /start_new_job first")
        root = self._cfg.results_root
        return root / SAVED_DIR / EVAL_RESULTS_DIR / self.benchmark_id / self.run_id

    def _seed_dir(self, key: SeedKey) -> Path:
        return self.run_dir / key[0] / key[1]

    def load(self, benchmark_id: str, run_id: str, tasks: list[TaskSpec]) -> None:
        """Make this the ledger of a new job; seeds with a ``result_info.json`` keep their score."""
        with self._lock:
            self.benchmark_id, self.run_id = benchmark_id, run_id
            self.tasks = tasks
            self._task_by_name = {t.name: t for t in tasks}
            self.order = [(t.name, s) for t in tasks for s in t.seeds()]
            self.scores = {}
            self._claims = {}
            self._leaked = set()
            self._requeued = deque()
            for key in self.order:
                info = self._read_result_info(key)
                if info is not None:
                    self.scores[key] = info

    def task(self, name: str) -> TaskSpec:
        return self._task_by_name[name]

    def episode_id(self, key: SeedKey) -> str:
        """``<benchmark_id>/<run_id>/<task_name>/<seed>`` (facts §7)."""
        return f"{self.benchmark_id}/{self.run_id}/{key[0]}/{key[1]}"

    def _read_result_info(self, key: SeedKey) -> tuple[float, float] | None:
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

    # =============================================================================== claims ====
    def claim_next(self, w: Worker) -> SeedKey | None:
        """Claim the first free seed (re-queued ones first) whose lock ``w`` can create."""
        with self._lock:
            if w.dead:
                return None
            candidates = list(self._requeued) + self.order
            for key in candidates:
                if key in self.scores or key in self._claims:
                    continue
                if key in self._leaked and self.lock_fresh(key):
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

    def release(self, w: Worker, *, delete_lock: bool) -> None:
        """Give ``w``'s seed back, first in line unless scored, and drop its episode.

        ``delete_lock``: ``/kill`` deletes the lock file; a lost lock is no longer ours to delete.
        """
        with self._lock:
            key = w.claim
            if key is not None:
                self._claims.pop(key, None)
                if delete_lock and self.benchmark_id is not None:
                    self._lock_idents.pop(key, None)
                    unlink_own_lock(lock_path(self.run_dir, key), w.wid)
                if key not in self.scores:
                    self._requeued.appendleft(key)
            w.claim = None
            w.episode = None

    def leak(self, w: Worker) -> None:
        """Drop ``w``'s claim without releasing the seed: it stays out until its lock goes stale.

        The real server's ``/reset`` of a busy worker does this (facts §2); clients call /kill
        first.
        """
        with self._lock:
            if w.claim is not None:
                self._claims.pop(w.claim, None)
                self._leaked.add(w.claim)
            w.claim = None
            w.episode = None

    def record_score(self, key: SeedKey, score: float, sr: float) -> None:
        """An ended episode's score; its seed is unclaimed (its lock stays until the finalize)."""
        with self._lock:
            self.scores[key] = (score, sr)
            self._claims.pop(key, None)

    def all_done(self) -> bool:
        with self._lock:
            return all(k in self.scores for k in self.order)

    # ================================================================================ locks ====
    def lock_fresh(self, key: SeedKey) -> bool:
        p = lock_path(self.run_dir, key)
        try:
            age = time.time() - p.stat().st_mtime
        except OSError:
            return False
        return age <= self._cfg.lock_stale_s and not (self._seed_dir(key) / RESULT_INFO).exists()

    def _create_lock(self, key: SeedKey, wid: Any) -> bool:
        path = lock_path(self.run_dir, key)
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
                if self.lock_fresh(key):
                    return False
                try:  # stale (or its episode is done): anyone may remove it
                    path.unlink()
                except FileNotFoundError:
                    pass
                continue
            try:
                os.write(fd, payload)
                st = os.fstat(fd)
                self._lock_idents[key] = (st.st_dev, st.st_ino, st.st_mtime_ns)
            finally:
                os.close(fd)
            return True
        return False

    def refresh_lock(self, w: Worker) -> bool:
        """Touch ``w``'s lock; False once three refreshes in a row failed (the lock is lost)."""
        if w.claim is None or self.benchmark_id is None:
            return True
        path = lock_path(self.run_dir, w.claim)
        try:
            # The file this process made or last touched is ours: its inode and the mtime we
            # set say so without reading it, twice a step. The inode alone does not: a lock
            # removed and made again by another process often gets the same inode at once
            # (ext4). Any other file there (re-made, written, or made by an earlier process) is
            # judged by what it says; a filesystem with coarse mtimes only costs that read.
            st = os.stat(path)
            if self._lock_idents.get(w.claim) != (st.st_dev, st.st_ino, st.st_mtime_ns):
                data = json.loads(path.read_text(encoding="utf-8"))
                if data.get("pid") != os.getpid() or data.get("worker_id") != str(w.wid):
                    raise ValueError("not ours")
            t = time.time_ns()
            os.utime(path, ns=(t, t))
            self._lock_idents[w.claim] = (st.st_dev, st.st_ino, t)
        except (OSError, ValueError):
            w.lock_failures += 1
            return w.lock_failures < 3
        w.lock_failures = 0
        return True

    # ============================================================================== results ====
    def metric(self) -> dict[str, dict[str, float]]:
        """The progress-prefixed metric dict (facts §6)."""
        with self._lock:
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

    def status(self, *, refresh: bool, active: list[Any], finalizing: int) -> dict[str, Any]:
        """The ``/status`` data dict (facts §9.1), given the live workers and finalizes in flight."""
        with self._lock:
            total = sum(t.num_test for t in self.tasks)
            if refresh and self.benchmark_id is not None:
                completed = sum(
                    1 for k in self.order if (self._seed_dir(k) / RESULT_INFO).exists()
                )
                in_progress = sum(1 for k in self.order if self.lock_fresh(k))
            else:
                completed = len(self.scores)
                in_progress = len(self._claims) + len(self._leaked)
            results: dict[str, float] = {}
            for t in self.tasks:
                vals = [
                    self.scores[(t.name, s)][0] for s in t.seeds() if (t.name, s) in self.scores
                ]
                if vals:
                    results[t.name] = float(np.mean(vals))
            if not self.tasks:
                status = "idle"
            elif completed >= total and finalizing == 0:
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

    def write_run_metric(self, metric: dict[str, dict[str, float]]) -> None:
        """The job end's file (facts §5): ``result.json`` once every seed is done, else
        ``progress.json``."""
        with self._lock:
            if self.benchmark_id is not None:
                from genmanip_runtime.atomic import atomic_write_json

                name = RESULT_JSON if self.all_done() else PROGRESS_JSON
                self.run_dir.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self.run_dir / name, metric)
