"""Chunk fan-out: one ``/step_chunk`` per worker, sent from parallel threads.

Per worker, so the server's fast path always applies (a finished or resetting worker never cuts
another's chunk short). The caller applies every worker whose chunk succeeded before the
failures are raised (:func:`raise_failures`), so no answered chunk goes unrecorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .errors import StepError

__all__ = ["ChunkFanOut", "raise_failures"]

T = TypeVar("T")


class ChunkFanOut:
    """Runs ``send(worker_id)`` for several workers at once (a pool made on first use)."""

    def __init__(self, max_workers: int, *, parallel: bool) -> None:
        self._max_workers = max_workers
        self.parallel = parallel
        self._pool: ThreadPoolExecutor | None = None

    def run(
        self, wids: Iterable[str], send: Callable[[str], T]
    ) -> tuple[dict[str, T], dict[str, BaseException]]:
        """``(results, errors)`` per worker. Without parallelism (or for one worker) the workers
        are sent one after another, stopping at the first failure (the rest are not sent)."""
        ids = list(wids)
        results: dict[str, T] = {}
        errors: dict[str, BaseException] = {}
        if len(ids) == 1 or not self.parallel:
            for wid in ids:
                try:
                    results[wid] = send(wid)
                except BaseException as exc:
                    errors[wid] = exc
                    break
            return results, errors
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._max_workers,
                                            thread_name_prefix="gmp-chunk")
        futs = {wid: self._pool.submit(send, wid) for wid in ids}
        for wid, fut in futs.items():
            try:
                results[wid] = fut.result()
            except BaseException as exc:
                errors[wid] = exc
        return results, errors

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def raise_failures(errors: dict[str, BaseException]) -> None:
    """Raise what the failed chunks say: a Ctrl-C / interrupt first (not a failure), else the
    first error, naming every failed worker (transient only if every failure was)."""
    if not errors:
        return
    for e in errors.values():
        if not isinstance(e, Exception):  # Ctrl-C / SIGTERM / interrupt() while waiting
            raise e
    first = next(iter(errors.values()))
    if isinstance(first, StepError):
        first.workers = list(errors)
        first.transient = all(isinstance(e, StepError) and e.transient for e in errors.values())
    raise first
