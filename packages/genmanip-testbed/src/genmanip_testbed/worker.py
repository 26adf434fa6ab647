"""One worker of the emulated server (the real server's Ray actor) and the reply forms it gives.

A :class:`Worker` holds what one actor holds: its episode, the seed it claims, its pending
background reset, and the frames it records. Its ``lock`` (re-entrant) serializes the requests
and the reset that use it: steps, ``/reset``, ``/reset_result`` and a reset installing its episode
run under it. ``/kill`` and ``close`` do not take it: they mark the worker dead and cancel its
reset under the job lock alone (a step in flight then fails, as on the real server), which is why
the lock order is a worker's lock first, then the job lock, never the reverse. Also here: the
seed key, the real server's timestamp format, and the pending-form placeholder (facts §2).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from datetime import datetime
from typing import Any

from .world import Episode

__all__ = ["SeedKey", "Worker", "now_str", "pending_form"]

SeedKey = tuple[str, str]  # (task_name, seed)


def now_str() -> str:
    """The real server's timestamp format (run ids, episode start and end times)."""
    return datetime.now().strftime("%Y-%m-%d_%H_%M_%S_%f")


def pending_form(metric: dict[str, Any]) -> dict[str, Any]:
    """The placeholder entry of a worker whose reset is still running (facts §2)."""
    return {
        "obs": {"reset": True, "reset_pending": True},
        "metric": metric,
        "episode_result": None,
        "reset_pending": True,
    }


class Worker:
    """One worker's state (see the module docstring for what ``lock`` covers)."""

    def __init__(self, wid: Any) -> None:
        self.wid = wid
        self.lock = threading.RLock()
        self.episode: Episode | None = None
        self.claim: SeedKey | None = None
        self.pending: Future[dict[str, Any]] | None = None
        self.cancel = threading.Event()
        self.dead = False
        self.finished = False
        self.lock_failures = 0
        self.first_chunk = True
        self.frames: dict[str, list[Future[bytes]]] = {}
        self.started = ""
