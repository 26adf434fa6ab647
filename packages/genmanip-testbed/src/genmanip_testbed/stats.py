"""Server-side counters, so tests can prove what the server really did (no step applied twice, ...)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

__all__ = ["Stats"]


class Stats:
    """Thread-safe counters of one testbed process.

    Attributes (read them directly; each is a :class:`collections.Counter` or an int):
        requests: requests per route path (``"/step"``, ``"/online/<id>/step"``, ...).
        statuses: responses per HTTP status code.
        steps_by_worker: actions applied to the world, per worker id (``str``).
        steps_by_episode: actions applied, per episode id; a replayed action would show up here.
        steps_by_attempt: per episode id, the actions applied in each attempt (one list item per
            reset that started the episode: a seed re-queued by ``/kill`` or a lost lock and
            served again under the same id is a new attempt). The last item is the attempt the
            server scored, so a client's ``steps.jsonl`` must have exactly that many rows.
        chunk_paths: ``"fast"``/``"slow"`` step_chunk executions.
        resets_started, resets_finished: background resets.
        resets_swallowed: finished resets consumed by the chunk fast path (the real server's quirk).
        episodes_finished: episodes that ended (scored).
        kills: workers killed via ``/kill`` or by a fault.
        faults: injected faults per kind (``"latency"``, ``"error_500"``, ``"reset_before"``, ...).
        render_passes: frames the fast path would have rendered for skipped observations.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.steps_by_worker: Counter[str] = Counter()
        self.steps_by_episode: Counter[str] = Counter()
        self.steps_by_attempt: dict[str, list[int]] = {}
        self.chunk_paths: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.resets_started = 0
        self.resets_finished = 0
        self.resets_swallowed = 0
        self.episodes_finished = 0
        self.kills = 0
        self.render_passes = 0

    def add(self, name: str, key: Any = None, n: int = 1) -> None:
        """Increment a counter attribute (``key`` given) or an int attribute (``key`` None)."""
        with self._lock:
            if key is None:
                setattr(self, name, getattr(self, name) + n)
            else:
                getattr(self, name)[key] += n

    def new_attempt(self, episode_id: str) -> None:
        """An episode (re)started: its next actions count toward a new attempt."""
        with self._lock:
            self.steps_by_attempt.setdefault(episode_id, []).append(0)

    def step_applied(self, worker_id: str, episode_id: str) -> None:
        """One action applied to ``episode_id`` by ``worker_id``."""
        with self._lock:
            self.steps_by_worker[worker_id] += 1
            self.steps_by_episode[episode_id] += 1
            attempts = self.steps_by_attempt.setdefault(episode_id, [0])
            attempts[-1] += 1

    @property
    def total_steps(self) -> int:
        """Actions applied to the world, all workers together."""
        with self._lock:
            return sum(self.steps_by_worker.values())

    def snapshot(self) -> dict[str, Any]:
        """A JSON-friendly copy of every counter."""
        with self._lock:
            return {
                "requests": dict(self.requests),
                "statuses": {str(k): v for k, v in self.statuses.items()},
                "steps_by_worker": dict(self.steps_by_worker),
                "steps_by_episode": dict(self.steps_by_episode),
                "steps_by_attempt": {k: list(v) for k, v in self.steps_by_attempt.items()},
                "chunk_paths": dict(self.chunk_paths),
                "faults": dict(self.faults),
                "resets_started": self.resets_started,
                "resets_finished": self.resets_finished,
                "resets_swallowed": self.resets_swallowed,
                "episodes_finished": self.episodes_finished,
                "kills": self.kills,
                "render_passes": self.render_passes,
            }

    def __repr__(self) -> str:
        return f"Stats({self.snapshot()!r})"
