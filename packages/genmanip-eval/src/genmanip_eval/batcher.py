"""Dynamic batching: many threads submit one observation each; one thread calls the policy.

Used by the asynchronous runner (each worker's lane submits its observation) and by
``gmp policy serve`` (each connection submits its request). Submitters are *participants*, named
by a key (the worker id, the connection): the batcher learns how long each one usually stays away
between its result and its next request (its step at the server, typically), and uses that to
decide, whenever the policy is free, whether to wait for more:

* a full batch (``max_batch``) goes at once;
* otherwise it waits for the participants that are *due*: away for less than their usual absence
  (times a margin). A participant that is not due — resetting for seconds, behind a slow reply,
  gone — is not waited for, so one slow worker never holds the others (a lane whose episode
  ended says so at once, :meth:`Batcher.away`: its reset is no usual absence);
* never longer than ``max_wait_s`` after the oldest waiting request arrived or the policy became
  free, whichever is later (requests that queued during a call get the same chance as the
  participants the call's results are just releasing);
* not at all when the policy's calls are cheap (under :data:`_MIN_WORTH_WAITING_S`): merging saves
  a call that costs nothing, and waiting would lock the lanes in phase, so that their requests
  reach the server together and queue there instead of overlapping one another's steps.

With every participant stepping at the same pace the lanes fall into step: one batch holds them
all, which is what a GPU policy wants (a batch of 8 costs little more than a batch of 1). While the
policy runs, new requests queue up and form the next batch.

**Two pipelined groups.** With one batch holding everyone, the policy idles while the workers step
and the workers idle while it runs: a cycle costs S + P(n) for n steps (S the usual absence, P(k)
the call's duration for k items). Split into two groups that alternate, the policy serves one
while the other steps: a cycle costs max(S + P(n/2), 2 P(n/2)). A call never gets slower with fewer
items, so that is no worse whenever S >= P(n), and better by up to P's share of the cycle (the
real server's 48 ms step against a 30-70 ms VLA call). The batcher measures both (the median
absence of its participants; the median call time at the full batch size, the largest of the
recent batches) and splits while S >= P(n), back to one group below 0.75 P(n) (the shorter steps
of smaller groups must not make it flap). In two groups every participant belongs to one; a batch
holds one group, and only that group's due participants are waited for (while the other group's
ready requests go). One that
comes back from a long absence (a reset) joins the group with fewer active participants. Calls
shorter than :data:`_MIN_PIPELINED_CALL_S` are not worth overlapping; ``pipeline=False`` keeps
one group.
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
    "Unbatched",
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
#: A policy call shorter than this (s) is not worth overlapping with the workers' steps.
_MIN_PIPELINED_CALL_S = 0.005
#: A policy call shorter than this (s) is not worth waiting for stragglers to share.
_MIN_WORTH_WAITING_S = 0.005
#: Calls timed at the full batch size before two groups are considered.
_MIN_FULL_CALLS = 4
#: Back to one group when the usual absence falls below this share of the full batch's call.
_UNSPLIT_BELOW = 0.75


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
    grouped_batches: int = 0  # batches formed while the participants ran as two groups

    def as_dict(self) -> dict[str, Any]:
        """JSON form: counts, mean batch size, mean queue wait and call time (ms), size histogram,
        and how many batches were formed in two pipelined groups."""
        return {
            "batches": self.batches,
            "grouped_batches": self.grouped_batches,
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
    group: int = 0  # 0 or 1 while the batcher runs two groups
    serving: bool = False  # its request is in the call running now

    def usual(self) -> float | None:
        """Its median absence (s), None before it has one."""
        return _median(self.absences) if self.absences else None

    def due_until(self, slack: float) -> float | None:
        """Until when it is worth waiting for (None: no history yet, so it is not waited for)."""
        usual = self.usual()
        if self.released is None or usual is None:
            return None
        return self.released + usual * _DUE_MARGIN + slack


def _median(xs: Any) -> float:
    v = sorted(xs)
    return float(v[len(v) // 2])


class Batcher(Generic[T]):
    """Gather items submitted from many threads into calls of ``call(items) -> results``.

    Args:
        call: serves one batch: a list of items -> a list of results, one per item, in order. An
            exception fails every request of that batch with it (the batcher goes on).
        max_batch: largest batch (>= 1).
        max_wait_s: longest wait for more items once one is waiting and the policy is idle (s).
        slack_s: added to a participant's due time (s), see the module docstring.
        pipeline: split the participants into two alternating groups when that is faster (see
            the module docstring); False: one group.
        name: the thread's name.
    """

    def __init__(
        self,
        call: Callable[[list[Any]], Sequence[T]],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        slack_s: float = DEFAULT_SLACK_S,
        pipeline: bool = True,
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
        self.pipeline = bool(pipeline)
        self.groups = 1  # 1 or 2 (read-only outside; see _regroup)
        self._call_s: dict[int, deque[float]] = {}  # call durations by batch size
        self._recent: deque[tuple[int, float]] = deque(maxlen=_HISTORY)  # (size, duration)
        self._full_size = 0  # the one-group batch size the split was decided on
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

    def away(self, key: Any) -> None:
        """Participant ``key`` is away for longer than usual from now on (its episode ended: a
        reset, which takes seconds on the real server): nobody waits for it until its next
        request, which is not counted as a usual absence and joins the smaller of two groups.

        Without this the batcher learns it only once the participant stays away past its due
        time (1.5 usual absences): the others of its group waited that long at every episode
        boundary.
        """
        with self._cv:
            member = self._members.get(key)
            if member is not None:
                member.released = None
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
            if member is not None:
                due = member.due_until(self.slack_s)
                if self.groups == 2 and (due is None or now > due):
                    # back from a long absence (a reset) or new: its group went on without it
                    member.group = self._smaller_group(now, key)
                if member.released is not None:
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
            return BatchStats(s.batches, s.items, Counter(s.sizes), s.queue_ms_total,
                              s.call_ms_total, s.grouped_batches)

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
                batch, wake = self._ready(now)
                if batch is not None:
                    break
                self._cv.wait(max(0.0, wake - now))
            batch = batch[: self.max_batch]
            for r in batch:
                if (m := self._members.get(r.key)) is not None:
                    m.serving = True
            taken = {id(r) for r in batch}
            self._pending = deque(r for r in self._pending if id(r) not in taken)
            return batch

    def _ready(self, now: float) -> tuple[list[_Request[T]] | None, float]:
        """The batch to serve now, else (None, when to look again). One group: everything
        waiting. Two: the first group, oldest request first, that need not wait (the other
        group's ready requests never wait behind a group still gathering)."""
        if self.groups == 1:
            candidates: list[tuple[int | None, list[_Request[T]]]] = [(None, list(self._pending))]
        else:
            by_group: dict[int, list[_Request[T]]] = {}
            for r in self._pending:
                by_group.setdefault(self._group_of(r.key), []).append(r)
            candidates = list(by_group.items())  # (in order of each group's oldest request)
        wake = float("inf")
        worth = self._worth_waiting()
        for group, batch in candidates:
            if len(batch) >= self.max_batch:
                return batch, now
            deadline = max(batch[0].enqueued, self._free_since) + self.max_wait_s
            due = self._next_due(now, group) if worth else None
            if due is None or now >= deadline:
                return batch, now
            wake = min(wake, deadline, due)
        return None, wake

    def _group_of(self, key: Any) -> int:
        member = self._members.get(key)
        return member.group if member is not None else 0

    def _active(self, m: _Participant, key: Any, now: float, waiting: set[Any]) -> bool:
        """Waiting, being served, or away for no longer than usual (not resetting for seconds)."""
        due = m.due_until(self.slack_s)
        return m.serving or key in waiting or (due is not None and due > now)

    def _smaller_group(self, now: float, key: Any) -> int:
        """The group with fewer active participants (``key`` itself not counted)."""
        waiting = {r.key for r in self._pending}
        sizes = [0, 0]
        for k, m in self._members.items():
            if k != key and self._active(m, k, now, waiting):
                sizes[m.group] += 1
        return 0 if sizes[0] <= sizes[1] else 1

    def _split(self) -> None:
        """Two groups: every other participant in each (they are in step: any halves will do)."""
        self.groups = 2
        for i, m in enumerate(self._members.values()):
            m.group = i % 2

    def _worth_waiting(self) -> bool:
        """Whether calls cost enough to wait for stragglers (True until one was timed)."""
        return not self._recent or _median(c for _, c in self._recent) >= _MIN_WORTH_WAITING_S

    def _regroup(self, size: int, call_s: float) -> None:
        """Record a call of ``size`` items that took ``call_s``; choose one group or two (under
        ``_cv``). See the module docstring for the rule."""
        self._call_s.setdefault(size, deque(maxlen=_HISTORY)).append(call_s)
        self._recent.append((size, call_s))
        if self.groups == 1:
            # the full batch: the largest of the recent ones (not the member count: a worker
            # resetting for seconds leaves the others' batches one short)
            self._full_size = max(n for n, _ in self._recent)
        full = self._call_s.get(self._full_size, ())
        usual = [u for m in self._members.values() if (u := m.usual()) is not None]
        if (not self.pipeline or self._full_size < 2 or len(self._members) < 2
                or len(full) < _MIN_FULL_CALLS or not usual):
            self.groups = 1
            return
        p_full, absence = _median(full), _median(usual)
        if self.groups == 1 and p_full >= _MIN_PIPELINED_CALL_S and absence >= p_full:
            self._split()
        elif self.groups == 2 and (absence < _UNSPLIT_BELOW * p_full or p_full < _MIN_PIPELINED_CALL_S):
            self.groups = 1

    def _next_due(self, now: float, group: int | None) -> float | None:
        """The latest time still worth waiting until for a due participant of ``group`` (None:
        every group; returns None when none is due)."""
        waiting = {r.key for r in self._pending}
        latest: float | None = None
        for key, m in self._members.items():
            if key in waiting or (group is not None and m.group != group):
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
                    member.serving = False

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
                self._regroup(len(batch), call_ms / 1000)
                st.grouped_batches += self.groups == 2
            self._release(batch)
            for r, value in zip(batch, results, strict=True):
                r.future.set_result(BatchOutcome(value, (t0 - r.enqueued) * 1000, call_ms, len(batch)))


class Unbatched(Generic[T]):
    """The submitter side of a :class:`Batcher` without the batching: each item is served by
    ``call([item])`` on the submitting thread, at once.

    For policies that batch elsewhere (a policy server batches the requests of every connection:
    batching them here first would couple the workers, each waiting for the others' replies).
    ``batch_size_of(key)`` names the batch that really served a key's call (None: 1).
    """

    def __init__(self, call: Callable[[list[Any]], Sequence[T]], *,
                 batch_size_of: Callable[[Any], int | None] | None = None) -> None:
        self._fn = call
        self._size_of = batch_size_of
        self._lock = threading.Lock()
        self._stats = BatchStats()
        self._closed = False

    def attach(self, key: Any) -> None:
        """(Nothing to learn: every call goes at once.)"""

    def detach(self, key: Any) -> None:
        """(See :meth:`attach`.)"""

    def away(self, key: Any) -> None:
        """(See :meth:`attach`.)"""

    def __call__(self, item: Any, key: Any = None) -> BatchOutcome[T]:
        """Serve ``item`` now, on this thread (re-raises the call's error)."""
        if self._closed:
            raise BatcherClosed("the policy is closed")
        t0 = time.perf_counter()
        results = list(self._fn([item]))
        call_ms = (time.perf_counter() - t0) * 1000
        if len(results) != 1:
            raise GenmanipEvalError(f"a batch of 1 got {len(results)} result(s)")
        size = (self._size_of(key) if self._size_of is not None else None) or 1
        with self._lock:
            st = self._stats
            st.items += 1
            st.sizes[size] += 1  # (calls by the size of the batch that served them)
            st.call_ms_total += call_ms
        return BatchOutcome(results[0], 0.0, call_ms, size)

    def snapshot(self) -> BatchStats:
        """The counters so far, in a :class:`Batcher`'s terms: ``items`` the calls, ``sizes`` and
        ``batches`` the batches that served them (k calls served by batches of n are k / n such
        batches, rounded; the batches held other processes' requests too)."""
        with self._lock:
            s = self._stats
            sizes = Counter({n: max(1, round(c / n)) for n, c in s.sizes.items()})
            batches = sum(sizes.values())
            # (mean_call_ms stays the mean round trip of one call)
            call_total = s.call_ms_total / s.items * batches if s.items else 0.0
            return BatchStats(batches, s.items, sizes, s.queue_ms_total, call_total,
                              s.grouped_batches)

    def close(self, timeout: float | None = 5.0) -> None:
        """Refuse later calls. Idempotent."""
        self._closed = True


def merge_batch_stats(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two :meth:`BatchStats.as_dict` records as one (two processes', two actors'): counts add,
    means are weighted by their counts; ``a`` None: ``b``."""
    if not a:
        return dict(b)
    out: dict[str, Any] = {"batches": a["batches"] + b["batches"], "items": a["items"] + b["items"],
                           "grouped_batches": a.get("grouped_batches", 0) + b.get("grouped_batches", 0)}
    sizes = {k: a["sizes"].get(k, 0) + b["sizes"].get(k, 0) for k in {*a["sizes"], *b["sizes"]}}
    out["sizes"] = dict(sorted(sizes.items(), key=lambda kv: int(kv[0])))
    out["mean_batch"] = round(out["items"] / out["batches"], 3) if out["batches"] else None
    for key, weight in (("mean_queue_ms", "items"), ("mean_call_ms", "batches")):
        total = sum((x[key] or 0.0) * x[weight] for x in (a, b))
        out[key] = round(total / out[weight], 3) if out[weight] else None
    return out
