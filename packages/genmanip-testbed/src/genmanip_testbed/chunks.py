"""``/step_chunk``'s two paths (facts §4): the one-worker fast path and the per-step slow path.

Owns their semantics and their counters (``chunk_paths``, ``render_passes``), and no state. A chunk
is steps, so it runs them through the core's seams (:class:`ChunkHost`): whatever wraps the core's
``_apply``, ``_end_episode`` or ``step`` sees every step of a chunk too. The route itself (input
checks, the choice of path, the fast-path check that swallows a finished, unpolled reset) is
:meth:`~genmanip_testbed.core.EvalCore.step_chunk`.

Locks: the fast path runs under the worker's lock, held by the caller; the slow path takes none
itself (each ``step`` takes its workers' locks).
"""

from __future__ import annotations

from typing import Any, Protocol

from .ledger import SeedLedger
from .stats import Stats
from .worker import Worker

__all__ = ["ChunkHost", "Chunks"]


class ChunkHost(Protocol):
    """The core's step machinery a chunk runs on."""

    def step(self, actions: Any) -> dict[str, Any]: ...

    def _apply(self, w: Worker, action: Any, method: str) -> None: ...

    def _end_episode(self, w: Worker) -> dict[str, Any]: ...

    def _lock_lost(self, w: Worker) -> dict[str, Any]: ...


class Chunks:
    """Runs an action chunk on the fast or the slow path."""

    def __init__(self, *, host: ChunkHost, ledger: SeedLedger, stats: Stats) -> None:
        self._host = host
        self._ledger = ledger
        self._stats = stats

    def fast(
        self,
        w: Worker,
        wid: str,
        chunk: list[dict[Any, Any]],
        *,
        render_mode: str,
        render_suffix: int,
    ) -> dict[str, Any]:
        """The one-worker path: lock refreshed around the chunk, renders skipped but the last.

        The caller holds ``w.lock``; ``w`` has an episode and no pending reset.
        """
        self._stats.add("chunk_paths", "fast")
        if not self._ledger.refresh_lock(w):
            return {"obs": {wid: self._host._lock_lost(w)}, "executed_steps": 0, "stopped_early": True}
        n = len(chunk)
        executed = 0
        entry: dict[str, Any] | None = None
        first = w.first_chunk
        w.first_chunk = False
        for i, body in enumerate(chunk):
            action = next(iter(body.values()))
            self._host._apply(w, action, "step_chunk")
            executed += 1
            ep = w.episode
            assert ep is not None
            if ep.done:
                entry = self._host._end_episode(w)
                break
            if i < n - 1 and (render_mode == "always" or first or i >= n - 1 - render_suffix):
                self._stats.add("render_passes")
        self._ledger.refresh_lock(w)
        if entry is None:
            assert w.episode is not None
            entry = {
                "obs": w.episode.observation(render=True),
                "metric": self._ledger.metric(),
                "episode_result": None,
            }
        done = bool(entry.get("reset_pending"))
        return {
            "obs": {wid: entry},
            "executed_steps": executed,
            "stopped_early": done or executed < n,
        }

    def slow(self, chunk: list[dict[Any, Any]]) -> dict[str, Any]:
        """``/step`` per element; stops after the first that leaves a worker pending or finished."""
        self._stats.add("chunk_paths", "slow")
        executed = 0
        resp: dict[str, Any] = {}
        stop = False
        for body in chunk:
            resp = self._host.step(body)
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
