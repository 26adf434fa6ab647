"""Background resets: the reset pool, each reset's cancel event, and what a reset does.

A reset (facts §3, §5) runs in the reset pool while its worker answers the pending form: it waits
the reset delay (or a fault's), claims the next seed (waiting up to ``next_task_timeout`` while the
remaining seeds are locked elsewhere), builds the episode and hands it to the worker; or, when no
seed is left, waits for the finalizes and ends the job for that worker (``result.json`` or
``progress.json``, ``obs`` None). Its result waits in ``Worker.pending`` until
:meth:`Resets.consume` (``/reset_result``, a ``/step``, the chunk fast path) takes it.

Owns the pool and the set of every reset's cancel event (guarded by the job lock handed in).
A reset installs its episode under the worker's lock, and reads the ledger (which takes the job
lock itself) outside it: the worker lock, when held, always comes first.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from genmanip_protocol.robots import RobotSpec

from .config import CoreConfig
from .faults import FaultState
from .finalize import Finalizer
from .ledger import SeedLedger
from .render import FrameCache
from .stats import Stats
from .worker import SeedKey, Worker, now_str
from .world import Episode

__all__ = ["Resets"]


class Resets:
    """Starts, runs and hands over workers' background resets."""

    def __init__(
        self,
        *,
        cfg: CoreConfig,
        robot: RobotSpec,
        stats: Stats,
        faults: FaultState,
        cache: FrameCache,
        ledger: SeedLedger,
        finalizer: Finalizer,
        lock: threading.RLock,
    ) -> None:
        self._cfg = cfg
        self._robot = robot
        self._stats = stats
        self._faults = faults
        self._cache = cache
        self._ledger = ledger
        self._finalizer = finalizer
        self._lock = lock
        self._pool = ThreadPoolExecutor(
            max(4, cfg.capacity + 2), thread_name_prefix="testbed-reset"
        )
        self._cancels: weakref.WeakSet[threading.Event] = weakref.WeakSet()

    def start(self, w: Worker, run: Callable[[threading.Event], dict[str, Any]]) -> None:
        """Give ``w`` a fresh cancel event and submit ``run(cancel)`` as its pending reset.

        ``run`` is the core's ``_do_reset`` seam, bound to this reset's arguments.
        """
        w.cancel = threading.Event()
        # Every reset's cancel event, not only the workers' current ones: close() must stop a
        # reset whose worker was killed or replaced meanwhile, or the pool shutdown waits for it.
        with self._lock:
            self._cancels.add(w.cancel)
        w.finished = False
        self._stats.add("resets_started")
        w.pending = self._pool.submit(run, w.cancel)

    def run(
        self,
        w: Worker,
        previous: dict[str, Any] | None,
        key: SeedKey | None,
        cancel: threading.Event,
        *,
        claim_next: Callable[[Worker], SeedKey | None],
    ) -> dict[str, Any]:
        """The reset itself (in the pool): the next episode's entry, with ``previous`` result.

        ``key`` is the seed already claimed for it, if any; else ``claim_next`` claims one.
        """
        if cancel.wait(self._faults.reset_delay(str(w.wid), self._cfg.reset_delay)):
            raise RuntimeError(f"Worker {w.wid} reset cancelled before start")
        if self._faults.take_stall():
            self._stats.add("faults", "stall_reset")
            cancel.wait()
            raise RuntimeError(f"Worker {w.wid} reset cancelled (stalled)")
        deadline = time.monotonic() + self._cfg.next_task_timeout
        while key is None:
            if cancel.is_set():
                raise RuntimeError(f"Worker {w.wid} reset cancelled before start")
            key = claim_next(w)
            if key is not None:
                break
            if self._ledger.all_done():
                return self._finish_worker(w, previous)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"No task became available for worker {w.wid} within {self._cfg.next_task_timeout}s"
                )
            cancel.wait(self._cfg.rescan_interval)
        task = self._ledger.task(key[0])
        episode_id = self._ledger.episode_id(key)
        ep = Episode(
            self._robot,
            task,
            key[1],
            episode_id,
            num_steps=self._cfg.num_steps,
            is_rel_default=self._cfg.is_rel_default,
            cache=self._cache,
            render=self._cfg.render,
            world_seed=self._cfg.world_seed,
        )
        obs = ep.observation(render=True)
        with w.lock:
            if w.dead or cancel.is_set():
                raise RuntimeError(f"Worker {w.wid} reset cancelled")
            w.episode = ep
            self._stats.new_attempt(episode_id)
            w.first_chunk = True
            w.started = now_str()
            w.frames = {}
            if self._cfg.save_process:
                self._finalizer.record(w, obs)
        self._stats.add("resets_finished")
        return {"obs": obs, "metric": self._ledger.metric(), "episode_result": previous}

    def _finish_worker(self, w: Worker, previous: dict[str, Any] | None) -> dict[str, Any]:
        # Nothing left to claim: the job is over for this worker (facts §5, "Job end").
        self._finalizer.wait()
        metric = self._ledger.metric()
        self._ledger.write_run_metric(metric)
        w.finished = True
        self._stats.add("resets_finished")
        return {"obs": None, "metric": metric, "episode_result": previous}

    @staticmethod
    def consume(w: Worker) -> dict[str, Any]:
        """Take ``w``'s finished reset result (a destructive read; re-raises its failure)."""
        fut = w.pending
        assert fut is not None and fut.done()
        w.pending = None
        return fut.result()

    def cancel_all(self, workers: Iterable[Worker]) -> None:
        """Cancel every worker's pending reset and every reset still running (``close``)."""
        with self._lock:
            for w in workers:
                w.cancel.set()
                if w.pending is not None:
                    w.pending.cancel()
            for ev in self._cancels:
                ev.set()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
