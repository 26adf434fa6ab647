"""The evaluation server's job, worker and reset state machine (wire-independent): the facade.

Reproduces the protocol-visible behaviour of the real GenManip server (reference facts §2-§9): the
pending-form placeholder, background resets whose result is collected by ``/reset_result`` (a
destructive read) or by the next ``/step``, results one hop late, the chunk fast path that swallows
an unpolled finished reset, the slow path that stops after a pending/finished worker, ``/kill``
re-queueing the seed at the front, run-id resume, lock files, and the on-disk result layout.

:class:`EvalCore` holds the routes, the steps and the workers; the rest is in its rooms:

* :mod:`.ledger` (:class:`~.ledger.SeedLedger`): the job, its seeds' claims, lock files, scores
  and metric;
* :mod:`.resets` (:class:`~.resets.Resets`): the reset pool and what a background reset does;
* :mod:`.finalize` (:class:`~.finalize.Finalizer`): episode end, frame recording, result files;
* :mod:`.chunks` (:class:`~.chunks.Chunks`): ``/step_chunk``'s fast and slow paths;
* :mod:`.worker` (:class:`~.worker.Worker`): one worker's state, and the pending form;
* :mod:`.config` (:class:`~.config.CoreConfig`): the tunables, read live by every room.

Threading: one lock for the job state (``_job``, shared by the rooms), one re-entrant lock per
worker; world steps run in the caller's thread (the HTTP layer runs them in a thread pool),
multi-worker ``/step`` fans out to a step pool, resets and finalizes run in their own pools.
Lock order: a worker's lock, then the job lock (``/reset``, a step ending its episode or losing
its lock, a reset installing its episode all nest them so); nothing takes a worker's lock while
holding the job lock (``/kill`` and ``close`` change workers under the job lock alone).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from genmanip_results.paths import UnsafePathError, safe_relative

from .chunks import Chunks
from .config import CoreConfig
from .faults import FaultState
from .finalize import Finalizer
from .ledger import SeedLedger
from .render import FrameCache
from .resets import Resets
from .stats import Stats
from .tasks import TaskSpec, resolve_configs
from .worker import SeedKey as _SEED_KEY
from .worker import Worker as _Worker
from .worker import now_str as _now_str
from .worker import pending_form
from .world import StepError

__all__ = [
    "CoreConfig",
    "EvalCore",
    "InsufficientResourcesError",
    "RayActorError",
    "RemoteTaskError",
    "pending_form",
]

log = logging.getLogger("genmanip_testbed.core")


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


class EvalCore:
    """One evaluation server's state. All public methods are thread-safe.

    Methods raise plain exceptions whose class name and message the HTTP layer turns into the real
    server's ``detail`` strings.

    The underscore methods ``_claim_next``, ``_do_reset``, ``_consume``, ``_end_episode`` and
    ``_apply`` are seams: every claim, reset run, reset hand-over, episode end and action goes
    through them (never straight to a room), so a test or bench can wrap them on the class or an
    instance (``bench/reliability/_testbed_proc.py``, genmanip-ray's launcher tests).
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
        # The job lock: guards the ledger, ``workers``, the finalize count and the reset cancels.
        self._job = threading.RLock()
        self._ledger = SeedLedger(cfg=config, lock=self._job)
        self._finalizer = Finalizer(
            cfg=config, stats=self.stats, cache=self.cache, ledger=self._ledger, lock=self._job
        )
        self._resets = Resets(
            cfg=config,
            robot=self.robot,
            stats=self.stats,
            faults=self.faults,
            cache=self.cache,
            ledger=self._ledger,
            finalizer=self._finalizer,
            lock=self._job,
        )
        self.workers: dict[Any, _Worker] = {}
        self._chunks = Chunks(host=self, ledger=self._ledger, stats=self.stats)
        self._step_pool = ThreadPoolExecutor(32, thread_name_prefix="testbed-step")
        self._closed = False

    # ==================================================================================== job ====
    @property
    def benchmark_id(self) -> str | None:
        return self._ledger.benchmark_id

    @property
    def run_id(self) -> str | None:
        return self._ledger.run_id

    @property
    def tasks(self) -> list[TaskSpec]:
        return self._ledger.tasks

    @property
    def scores(self) -> dict[_SEED_KEY, tuple[float, float]]:
        """``{(task_name, seed): (score, sr)}`` of the scored seeds."""
        return self._ledger.scores

    @property
    def run_dir(self) -> Path:
        """``<results_root>/saved/eval_results/<benchmark>/<run_id>`` of the loaded job."""
        return self._ledger.run_dir

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
        return self._finalizer.wait(timeout)

    def start_new_job(self, config_paths: list[str], run_id: str | None) -> None:
        """Load a job: kill every worker, resolve configs, pick the run id, resume finished seeds."""
        self.wait_finalizes()
        self.kill(list(self.workers))
        effective = run_id if run_id else (self.run_id or _now_str())
        self.validate_run_id(effective)
        benchmark, tasks = resolve_configs(list(config_paths))
        self._ledger.load(benchmark, effective, tasks)
        log.info(
            "job loaded: %s run %s, %d episodes (%d already done)",
            benchmark,
            effective,
            len(self._ledger.order),
            len(self.scores),
        )

    # ================================================================================= metric ====
    def metric(self) -> dict[str, dict[str, float]]:
        """The progress-prefixed metric dict (facts §6)."""
        return self._ledger.metric()

    def status(self, refresh: bool = False) -> dict[str, Any]:
        """The ``/status`` data dict (facts §9.1)."""
        # One hold of the job lock: the seeds, the workers and the finalizes seen at one moment.
        with self._job:
            active = [w for w, wk in self.workers.items() if not wk.dead]
            return self._ledger.status(
                refresh=refresh, active=active, finalizing=self._finalizer.in_flight
            )

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
                self._ledger.release(w, delete_lock=True)
                self.stats.add("kills")

    def _worker(self, wid: str) -> _Worker:
        w = self.workers.get(wid)
        if w is None:
            raise KeyError(wid)
        return w

    def _die(self, w: _Worker) -> None:
        self.stats.add("faults", "die_worker")
        self.kill([w.wid])

    def _require_job(self) -> None:
        if self.benchmark_id is None:
            raise ValueError("No job started. Call start_new_job first.")

    # ================================================================================== seams ====
    # The hook points of the class docstring, and the glue between rooms: a reset is started by
    # the resets room, run in its pool through _do_reset, and claims through _claim_next.
    def _claim_next(self, w: _Worker) -> _SEED_KEY | None:
        return self._ledger.claim_next(w)

    def _start_reset(
        self, w: _Worker, previous: dict[str, Any] | None, key: _SEED_KEY | None
    ) -> None:
        self._resets.start(w, functools.partial(self._do_reset, w, previous, key))

    def _do_reset(
        self,
        w: _Worker,
        previous: dict[str, Any] | None,
        key: _SEED_KEY | None,
        cancel: threading.Event,
    ) -> dict[str, Any]:
        return self._resets.run(w, previous, key, cancel, claim_next=self._claim_next)

    def _consume(self, w: _Worker) -> dict[str, Any]:
        return self._resets.consume(w)

    def _entry_for_pending(self, w: _Worker) -> dict[str, Any]:
        assert w.pending is not None
        if w.pending.done():
            return self._consume(w)
        return pending_form(self.metric())

    def _end_episode(self, w: _Worker) -> dict[str, Any]:
        ep = w.episode
        key = w.claim
        if ep is None or key is None:  # killed while stepping
            raise RayActorError("The actor died unexpectedly before finishing this task.")
        result = self._finalizer.end(w, ep, key)
        self._start_reset(w, result, None)
        return pending_form(self.metric())

    def _lock_lost(self, w: _Worker) -> dict[str, Any]:
        # Three failed refreshes (facts §5): the seed goes back to the queue, the worker moves on.
        self._ledger.release(w, delete_lock=False)
        w.lock_failures = 0
        self._start_reset(w, None, None)
        entry = pending_form(self.metric())
        entry["lock_lost"] = True
        return entry

    # ================================================================================= resets ====
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
                    self._ledger.leak(w)  # the real server's quirk: see SeedLedger.leak
                key = self._claim_next(w)
                if key is None and self._ledger.all_done():
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
            self._finalizer.record(w, ep.observation(render=True))
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
            if not self._ledger.refresh_lock(w):
                return self._lock_lost(w)
            self._apply(w, action, "step")
            w.first_chunk = False
            if ep.done:
                return self._end_episode(w)
            self._ledger.refresh_lock(w)
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
        """``/step_chunk`` with the real fast-path / slow-path semantics (facts §4).

        ``subframes`` is accepted as the real server accepts it; its extra render passes only
        cost the real server time, so the testbed renders none.
        """
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
                        swallowed = self._consume(w)
                        self.stats.add("resets_swallowed")
                        if swallowed.get("obs") is None:
                            return {
                                "obs": {wid: swallowed},
                                "executed_steps": 1,
                                "stopped_early": len(chunk) > 1,
                            }
                    if w.pending is None and w.episode is not None:
                        return self._chunks.fast(
                            w, wid, chunk, render_mode=render_mode, render_suffix=render_suffix
                        )
        return self._chunks.slow(chunk)

    # ================================================================================= close ====
    def close(self) -> None:
        """Cancel resets, wait for finalizes (bounded), stop the pools."""
        if self._closed:
            return
        self._closed = True
        self._resets.cancel_all(self.workers.values())
        self.wait_finalizes(timeout=60)
        self._resets.shutdown()
        self._step_pool.shutdown(wait=True, cancel_futures=True)
        self._finalizer.shutdown()
        self.cache.clear()
