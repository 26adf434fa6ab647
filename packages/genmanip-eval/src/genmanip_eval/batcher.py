"""Dynamic batching: many threads submit one observation each; one thread calls the policy.

Used by the asynchronous runner (each worker's lane submits its observation) and by
``gmp policy serve`` (each connection submits its request). Submitters are *participants*, named
by a key (the worker id, the connection): the batcher learns how long each one usually stays away
between its result and its next request (its step at the server, typically), and uses that to
decide, whenever the policy is free, whether to wait for more:

* a full batch (``max_batch``) goes at once;
* otherwise it waits for the participants that are *due*: away for less than their usual absence
  (times a margin). A participant that is not due — resetting for seconds, behind a slow reply,
  gone — is not waited for, so one slow worker never holds the others;
* never longer than ``max_wait_s`` after the oldest waiting request arrived or the policy became
  free, whichever is later (requests that queued during a call get the same chance as the
  participants the call's results are just releasing).

With every participant stepping at the same pace the lanes fall into step: one batch holds them
all, which is what a GPU policy wants (a batch of 8 costs little more than a batch of 1). While the
policy runs, new requests queue up and form the next batch.

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
    "merge_batch_stats",
]

T = TypeVar("T")

#: Largest batch (EBench runs at most 32 workers; a policy's own limit is set with ``max_batch``).
DEFAULT_MAX_BATCH = 32
#: The longest an idle policy waits for due participants (s). Only participants that are due are
#: waited for (see the module docstring), so this is a cap for when their pace changes; it must
#: exceed one server step (~48 ms real, more on a loaded machine) or groups of lanes that drifted
#: apart never merge again. See docs/performance.md for the measurement.
DEFAULT_MAX_WAIT_S = 0.2
#: A participant is due while away for less than this many times its usual absence (plus a slack).
_DUE_MARGIN = 1.5
#: The slack added to that (s): a thread's wake-up and a result's delivery take a little time.
DEFAULT_SLACK_S = 0.005
#: Absences remembered per participant (their median is the usual absence).
_HISTORY = 16


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
    key: Any
    future: Future[BatchOutcome[T]]
    enqueued: float


@dataclass
class _Participant:
    """What the batcher knows of one submitter: when it was released, how long it stays away."""

    released: float | None = None  # when its last result was handed out (None: not yet)
    absences: deque[float] = field(default_factory=lambda: deque(maxlen=_HISTORY))

    def due_until(self, slack: float) -> float | None:
        """Until when it is worth waiting for (None: no history yet, so it is not waited for)."""
        if self.released is None or not self.absences:
            return None
        usual = sorted(self.absences)[len(self.absences) // 2]
        return self.released + usual * _DUE_MARGIN + slack


class Batcher(Generic[T]):
    """Gather items submitted from many threads into calls of ``call(items) -> results``.

    Args:
        call: serves one batch: a list of items -> a list of results, one per item, in order. An
            exception fails every request of that batch with it (the batcher goes on).
        max_batch: largest batch (>= 1).
        max_wait_s: longest wait for more items once one is waiting and the policy is idle (s).
        slack_s: added to a participant's due time (s), see the module docstring.
        name: the thread's name.
    """

    def __init__(
        self,
        call: Callable[[list[Any]], Sequence[T]],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        slack_s: float = DEFAULT_SLACK_S,
        name: str = "gmp-batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self._fn = call
        self.max_batch = int(max_batch)
        self.max_wait_s = float(max_wait_s)
        self.slack_s = float(slack_s)
        self._cv = threading.Condition()
        self._pending: deque[_Request[T]] = deque()
        self._members: dict[Any, _Participant] = {}
        self._closed = False
        self._stats = BatchStats()
        self._free_since = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ submitters

    def attach(self, key: Any) -> None:
        """Participant ``key`` joins (a lane's worker id, a connection)."""
        with self._cv:
            self._members.setdefault(key, _Participant())
            self._cv.notify_all()

    def detach(self, key: Any) -> None:
        """Participant ``key`` leaves: nobody waits for it any more."""
        with self._cv:
            self._members.pop(key, None)
            self._cv.notify_all()

    def submit(self, item: Any, key: Any = None) -> Future[BatchOutcome[T]]:
        """Queue ``item`` of participant ``key``; the future resolves to its :class:`BatchOutcome`
        (or the call's error). A key never attached is served, but never waited for."""
        fut: Future[BatchOutcome[T]] = Future()
        now = time.perf_counter()
        with self._cv:
            if self._closed:
                raise BatcherClosed("the policy batcher is closed")
            member = self._members.get(key)
            if member is not None and member.released is not None:
                member.absences.append(now - member.released)
                member.released = None
            self._pending.append(_Request(item, key, fut, now))
            self._cv.notify_all()
        return fut

    def __call__(self, item: Any, key: Any = None) -> BatchOutcome[T]:
        """Submit ``item`` and wait for its outcome (re-raises the batch's error)."""
        return self.submit(item, key).result()

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
                if not self._pending:
                    self._cv.wait()
                    continue
                now = time.perf_counter()
                if len(self._pending) >= self.max_batch:
                    break
                since = max(self._pending[0].enqueued, self._free_since)
                deadline = since + self.max_wait_s
                due = self._next_due(now)
                if due is None or now >= deadline:
                    break
                self._cv.wait(min(deadline, due) - now)
            k = min(self.max_batch, len(self._pending))
            return [self._pending.popleft() for _ in range(k)]

    def _next_due(self, now: float) -> float | None:
        """The latest time still worth waiting until for a due participant (None: none is due)."""
        waiting = {r.key for r in self._pending}
        latest: float | None = None
        for key, m in self._members.items():
            if key in waiting:
                continue
            until = m.due_until(self.slack_s)
            if until is not None and until > now:
                latest = until if latest is None else max(latest, until)
        return latest

    def _release(self, batch: list[_Request[T]]) -> None:
        now = time.perf_counter()
        with self._cv:
            self._free_since = now
            for r in batch:
                member = self._members.get(r.key)
                if member is not None:
                    member.released = now

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
            except BaseException as exc:  # handed to every waiter of the batch
                for r in batch:
                    r.future.set_exception(exc)
                self._release(batch)
                if not isinstance(exc, Exception):
                    raise
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
            self._release(batch)
            for r, value in zip(batch, results, strict=True):
                r.future.set_result(BatchOutcome(value, (t0 - r.enqueued) * 1000, call_ms, len(batch)))


def merge_batch_stats(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two :meth:`BatchStats.as_dict` records as one (two processes', two actors'): counts add,
    means are weighted by their counts; ``a`` None: ``b``."""
    if not a:
        return dict(b)
    out: dict[str, Any] = {"batches": a["batches"] + b["batches"], "items": a["items"] + b["items"]}
    sizes = {k: a["sizes"].get(k, 0) + b["sizes"].get(k, 0) for k in {*a["sizes"], *b["sizes"]}}
    out["sizes"] = dict(sorted(sizes.items(), key=lambda kv: int(kv[0])))
    out["mean_batch"] = round(out["items"] / out["batches"], 3) if out["batches"] else None
    for key, weight in (("mean_queue_ms", "items"), ("mean_call_ms", "batches")):
        total = sum((x[key] or 0.0) * x[weight] for x in (a, b))
        out[key] = round(total / out[weight], 3) if out[weight] else None
    return out
