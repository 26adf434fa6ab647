"""What several benchmarks share (files starting with ``_`` are not benchmarks themselves)."""

from __future__ import annotations

import multiprocessing as mp
import resource
from collections.abc import Callable
from typing import Any

from genmanip_testbed import serve_testbed

__all__ = ["ServerProcess", "Spawned", "cpu_s"]


def cpu_s(*, own: bool = True) -> float:
    """CPU seconds (user + system) of the child processes that have ended (ffmpeg, ``gmp eval``
    subprocesses, spawned servers once joined) and, with ``own``, of this process: what a user
    pays, the whole process tree, not the timed loop alone."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = ch.ru_utime + ch.ru_stime
    if own:
        me = resource.getrusage(resource.RUSAGE_SELF)
        total += me.ru_utime + me.ru_stime
    return total


def _serve(conf: dict[str, Any], q: Any, stop: Any) -> None:
    with serve_testbed(**conf) as tb:
        q.put(tb.url)
        stop.wait()


class Spawned:
    """``target(*args, q, stop)`` in its own (spawned) process: ``with Spawned(...) as value``
    gives what the target put on ``q`` once ready (a URL), and stops it (``stop``) on exit."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self._q = ctx.Queue()
        self._stop = ctx.Event()
        self._p = ctx.Process(target=target, args=(*args, self._q, self._stop), daemon=True)

    def __enter__(self) -> str:
        self._p.start()
        return str(self._q.get(timeout=60))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._p.join(20)
        if self._p.is_alive():
            self._p.kill()


class ServerProcess(Spawned):
    """The testbed in its own process: server work must not share the client's GIL.

    ``with ServerProcess(**serve_testbed_kwargs) as url: ...``
    """

    def __init__(self, **conf: Any) -> None:
        super().__init__(_serve, conf)
