"""Dynamic batching: many threads submit one observation each; one thread calls the policy.

Used by the asynchronous runner (each worker's lane submits its observation) and by
``gmp policy serve`` (each connection submits its request). The rule, applied whenever the policy
thread is free:

* take every waiting request (up to ``max_batch``) at once if the batch is full or if every
  *participant* (a lane or connection that may submit) is already waiting — nobody else can come;
* otherwise wait for more, at most ``max_wait_s`` after the oldest waiting request arrived or
  the policy became free, whichever is later (requests that queued during a call get the same
  chance as the submitters that the call's results are just releasing).

While the policy runs, new requests queue up and form the next batch: under load the batches
fill by themselves and ``max_wait_s`` only matters when the policy is idle.

Every call of the user's code happens on the batcher's thread (one thread, in order): policies
need not be thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .errors import GenmanipEvalError

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_WAIT_S",
    "BatchOutcome",
    "BatchStats",
    "Batcher",
    "BatcherClosed",
]

T = TypeVar("T")

#: Largest batch (EBench runs at most 32 workers; a policy's own limit is set with ``max_batch``).
DEFAULT_MAX_BATCH = 32
#: How long an idle policy waits for more observations after the first (s): see docs/performance.md.
DEFAULT_MAX_WAIT_S = 0.005


class BatcherClosed(GenmanipEvalError):
    """The batcher stopped (the run is ending) before this request was served."""


@dataclass(frozen=True)
class BatchOutcome(Generic[T]):
    """What one submitter gets back.

    Attributes:
        value: its item's result (an action dict, a chunk, ...).
        queue_ms: time from submit to the start of its batch's call (ms).
        call_ms: duration of the batch's call (ms), shared by every item of the batch.
        batch_size: how many items the call served.
    """

    value: T
    queue_ms: float
    call_ms: float
    batch_size: int


@dataclass
class BatchStats:
    """Counters of a batcher (read with :meth:`Batcher.snapshot`)."""

    batches: int = 0
    items: int = 0
    sizes: Counter[int] = field(default_factory=Counter)
    queue_ms_total: float = 0.0
    call_ms_total: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON form: counts, mean batch size, mean queue wait and call time (ms), size histogram."""
        return {
            "batches": self.batches,
            "items": self.items,
            "mean_batch": round(self.items / self.batches, 3) if self.batches else None,
            "mean_queue_ms": round(self.queue_ms_total / self.items, 3) if self.items else None,
            "mean_call_ms": round(self.call_ms_total / self.batches, 3) if self.batches else None,
            "sizes": {str(k): v for k, v in sorted(self.sizes.items())},
        }


@dataclass(frozen=True)
class _Request(Generic[T]):
    item: Any
    future: Future[BatchOutcome[T]]
    enqueued: float


class Batcher(Generic[T]):
    """Gather items submitted from many threads into calls of ``call(items) -> results``.

    Args:
        call: serves one batch: a list of items -> a list of results, one per item, in order. An
            exception fails every request of that batch with it (the batcher goes on).
        max_batch: largest batch (>= 1).
        max_wait_s: longest wait for more items once one is waiting and the policy is idle (s).
        name: the thread's name.
    """

    def __init__(
        self,
        call: Callable[[list[Any]], Sequence[T]],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        name: str = "gmp-batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self._fn = call
        self.max_batch = int(max_batch)
        self.max_wait_s = float(max_wait_s)
        self._cv = threading.Condition()
        self._pending: deque[_Request[T]] = deque()
        self._participants = 0
        self._closed = False
        self._stats = BatchStats()
        self._free_since = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ submitters

    def attach(self) -> None:
        """A participant joins (a lane or a connection that will submit items)."""
        with self._cv:
            self._participants += 1
            self._cv.notify_all()

    def detach(self) -> None:
        """A participant leaves: the others no longer wait for it."""
        with self._cv:
            self._participants = max(0, self._participants - 1)
            self._cv.notify_all()

    def submit(self, item: Any) -> Future[BatchOutcome[T]]:
        """Queue ``item``; the future resolves to its :class:`BatchOutcome` (or the call's error)."""
        fut: Future[BatchOutcome[T]] = Future()
        with self._cv:
            if self._closed:
                raise BatcherClosed("the policy batcher is closed")
            self._pending.append(_Request(item, fut, time.perf_counter()))
            self._cv.notify_all()
        return fut

    def __call__(self, item: Any) -> BatchOutcome[T]:
        """Submit ``item`` and wait for its outcome (re-raises the batch's error)."""
        return self.submit(item).result()

    def snapshot(self) -> BatchStats:
        """A copy of the counters so far."""
        with self._cv:
            s = self._stats
            return BatchStats(s.batches, s.items, Counter(s.sizes), s.queue_ms_total, s.call_ms_total)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop: requests still waiting fail with :class:`BatcherClosed`. Idempotent."""
        with self._cv:
            self._closed = True
            left = list(self._pending)
            self._pending.clear()
            self._cv.notify_all()
        for r in left:
            r.future.set_exception(BatcherClosed("the policy batcher closed before serving this request"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ policy thread

    def _take(self) -> list[_Request[T]] | None:
        with self._cv:
            while True:
                if self._closed:
                    return None
                if self._pending:
                    n = len(self._pending)
                    if n >= self.max_batch or n >= self._participants:
                        break
                    since = max(self._pending[0].enqueued, self._free_since)
                    left = since + self.max_wait_s - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                else:
                    self._cv.wait()
            k = min(self.max_batch, len(self._pending))
            return [self._pending.popleft() for _ in range(k)]

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            t0 = time.perf_counter()
            try:
                results = list(self._fn([r.item for r in batch]))
                if len(results) != len(batch):
                    raise GenmanipEvalError(
                        f"a batch of {len(batch)} got {len(results)} result(s)"  # gmp's own adapters check this
                    )
            except BaseException as exc:  # noqa: BLE001 - handed to every waiter of the batch
                for r in batch:
                    r.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                with self._cv:
                    self._free_since = time.perf_counter()
                continue
            call_ms = (time.perf_counter() - t0) * 1000
            with self._cv:
                st = self._stats
                st.batches += 1
                st.items += len(batch)
                st.sizes[len(batch)] += 1
                st.call_ms_total += call_ms
                for r in batch:
                    st.queue_ms_total += (t0 - r.enqueued) * 1000
            for r, value in zip(batch, results):
                r.future.set_result(BatchOutcome(value, (t0 - r.enqueued) * 1000, call_ms, len(batch)))
            with self._cv:
                self._free_since = time.perf_counter()
