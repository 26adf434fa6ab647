"""The browser's view of a results root: opaque run ids, episode lookup, live workers, comparisons.

Discovery itself is :mod:`genmanip_results.discovery` (both layouts, incremental ``RunScanner``, the
run's state and its key). This module only indexes its output for the pages. Scanning runs on a
background thread: a request takes the newest snapshot; when that is older than ``min_interval`` it
asks for a rescan and waits up to ``wait`` seconds for one that started after the request came in
(pages wait :data:`FRESH_WAIT_S`: they show the tree as it is, not as it was at the previous
request), so no request blocks on a slow file system for more than a few seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from genmanip_results.discovery import EpisodeInfo, RunInfo, RunScanner, run_key, run_rel

# The live-view contract (file names, path safety) is genmanip_results.live: eval writes through
# it, these readers are its; re-exported here for the pages.
from genmanip_results.live import LiveWorker, live_workers
from genmanip_results.stats import PairTable, holm_adjust, pair_outcomes, wilson_interval

__all__ = [
    "FRESH_WAIT_S",
    "Comparison",
    "GroupStats",
    "LiveWorker",
    "ResultsIndex",
    "RunView",
    "Snapshot",
    "compare_runs",
    "episode_rel",
    "group_stats",
    "live_workers",
    "run_key",
]

#: How long (seconds) a page request waits for a rescan of a snapshot older than the scan
#: interval before it answers from the older one (a very slow file system).
FRESH_WAIT_S = 3.0


def episode_rel(ep: EpisodeInfo) -> str:
    """The episode's address inside its run: ``<task_name>/<seed>`` (``/``-separated)."""
    return f"{ep.task_name}/{ep.seed}"


@dataclass(frozen=True)
class GroupStats:
    """Aggregate of a group of episodes (run, suite or task).

    ``n`` counts complete episodes; ``sr`` is ``successes / n`` (None when ``n == 0``); ``ci`` the Wilson
    95% interval of it; ``mean_score`` the mean score of complete episodes with a score.
    """

    n: int
    successes: int
    sr: float | None
    ci: tuple[float, float]
    mean_score: float | None


def group_stats(episodes: Sequence[EpisodeInfo]) -> GroupStats:
    """:class:`GroupStats` of the complete episodes among ``episodes``."""
    done = [e for e in episodes if e.complete]
    n = len(done)
    succ = sum(1 for e in done if e.success)
    scores = [float(e.score) for e in done if e.score is not None and math.isfinite(float(e.score))]
    return GroupStats(
        n=n,
        successes=succ,
        sr=(succ / n) if n else None,
        ci=wilson_interval(succ, n),
        mean_score=(sum(scores) / len(scores)) if scores else None,
    )


@dataclass
class RunView:
    """A scanned run plus what the pages need: ``key`` (opaque id), ``rel`` (path under the root),
    episodes by ``<task>/<seed>``, and whether it is live."""

    key: str
    rel: str
    info: RunInfo
    episodes: dict[str, EpisodeInfo] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    stats: GroupStats | None = None
    live: bool = False
    workers: list[LiveWorker] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.info.benchmark}/{self.info.run_id}"

    @property
    def state(self) -> str | None:
        """The run's state (:attr:`genmanip_results.discovery.RunInfo.state`)."""
        return self.info.state

    def neighbours(self, rel: str) -> tuple[str | None, str | None]:
        """The previous and next episode addresses around ``rel`` (task then seed order)."""
        try:
            i = self.order.index(rel)
        except ValueError:
            return None, None
        prev_rel = self.order[i - 1] if i > 0 else None
        next_rel = self.order[i + 1] if i + 1 < len(self.order) else None
        return prev_rel, next_rel


def _seed_key(seed: str) -> tuple[int, str]:
    return (int(seed), seed) if seed.isdigit() else (1 << 62, seed)


def _make_view(root: Path, info: RunInfo, now: float) -> RunView:
    rel = run_rel(info.path, root)
    view = RunView(key=run_key(rel), rel=rel, info=info)
    eps = sorted(info.episodes, key=lambda e: (e.task_name, _seed_key(str(e.seed))))
    for ep in eps:
        r = episode_rel(ep)
        view.episodes[r] = ep
        view.order.append(r)
    view.stats = group_stats(eps)
    view.workers = live_workers(Path(info.path), now=now)
    # Discovery decides (live frames are one of its signals): a crashed run's last frames must not
    # keep it "live", nor a finished run's.
    view.live = info.live
    return view


@dataclass
class Snapshot:
    """One consistent scan result: runs newest first and by key. ``started_at`` and
    ``scanned_at`` are the :func:`time.monotonic` times the scan started and ended."""

    runs: list[RunView]
    by_key: dict[str, RunView]
    scanned_at: float
    scan_seconds: float
    started_at: float = 0.0


class ResultsIndex:
    """Thread-safe, incrementally refreshed index of every run under ``root``.

    ``snapshot()`` never blocks longer than ``wait`` seconds once a first scan exists; before that it
    waits up to ``first_wait`` seconds and may return ``None`` (the page then says "scanning").
    """

    def __init__(self, root: Path, *, min_interval: float = 2.0) -> None:
        self.root = Path(root)
        self.min_interval = min_interval
        self._scanner = RunScanner(self.root)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._snap: Snapshot | None = None
        self._want = False
        self._busy = False
        self._error: BaseException | None = None
        self._done_started = -math.inf  # start time of the newest finished scan, good or failed
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="gmp-viz-scan", daemon=True)
        self._thread.start()
        self.request_scan()

    def close(self) -> None:
        """Stop the background thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def request_scan(self) -> None:
        """Ask the background thread for a rescan (no-op when one is already pending)."""
        with self._cond:
            self._want = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._want and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._want = False
                self._busy = True
            started = time.monotonic()
            t0 = time.perf_counter()
            try:
                infos = self._scanner.scan()
                now = time.time()
                views = [_make_view(self.root, info, now) for info in infos]
                snap = Snapshot(
                    runs=views,
                    by_key={v.key: v for v in views},
                    scanned_at=time.monotonic(),
                    scan_seconds=time.perf_counter() - t0,
                    started_at=started,
                )
                err = None
            except BaseException as exc:  # keep serving the last good snapshot
                snap, err = None, exc
            with self._cond:
                if snap is not None:
                    self._snap = snap
                self._error = err
                self._done_started = started
                self._busy = False
                self._cond.notify_all()

    @property
    def last_error(self) -> BaseException | None:
        """The exception of the last failed scan (None after a good one)."""
        return self._error

    def snapshot(self, *, wait: float = 0.0, first_wait: float = 5.0) -> Snapshot | None:
        """The newest snapshot; when it started more than ``min_interval`` ago, a rescan is asked
        for and this waits up to ``wait`` seconds (``first_wait`` before the first scan) for a
        scan that started after the call, then answers with the newest there is (None before the
        first scan).

        Waiting for a scan that *started* after the call is what makes a page show the tree as
        it is: a scan already running when the request came in may have listed the directories
        before the change the user is looking for.
        """
        asked = time.monotonic()
        with self._cond:
            snap = self._snap
            if snap is not None and asked - snap.started_at <= self.min_interval:
                return snap
            if not self._want:
                self._want = True  # (also when a scan is running: the next one starts after it)
                self._cond.notify_all()
            deadline = asked + (first_wait if snap is None else wait)
            done_before = self._done_started

            def pending() -> bool:
                if snap is None:  # before a first snapshot, any scan that ends will do
                    return self._done_started == done_before
                return self._done_started < asked  # the scan asked for has not ended yet

            while pending():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    break
                self._cond.wait(remaining)
            return self._snap

    def wait_for_scan(self, timeout: float = 30.0) -> Snapshot | None:
        """Block until a scan that started after this call has finished (tests, benchmarks,
        ``gmp viz build``); the newest snapshot (None when no scan ever succeeded)."""
        start = time.monotonic()
        self.request_scan()
        with self._cond:
            while self._done_started < start and time.monotonic() - start < timeout:
                self._cond.wait(0.05)
            return self._snap


@dataclass(frozen=True)
class Comparison:
    """Run ``a`` against run ``b`` on the (task, seed) pairs both completed.

    ``tasks``: per task ``(n_shared, sr_a, sr_b, delta = sr_b - sr_a)``; ``flipped``: the shared
    episodes whose success differs, as ``(task, seed, success_a, success_b)``. The statistics are
    :mod:`genmanip_results.stats` (the numbers of ``gmp compare``): ``tables`` per task and
    ``overall`` the paired 2x2 tables (:class:`~genmanip_results.stats.PairTable`, B = run ``b``),
    whose ``interval()`` is Newcombe's and ``mcnemar_p()`` the exact McNemar p-value; ``p_holm``
    the per-task Holm-adjusted p-values.
    """

    shared: int
    sr_a: float | None
    sr_b: float | None
    tasks: list[tuple[str, int, float, float, float]]
    flipped: list[tuple[str, str, bool, bool]]
    tables: dict[str, PairTable] = field(default_factory=dict)
    overall: PairTable = field(default_factory=PairTable)
    p_holm: dict[str, float] = field(default_factory=dict)


def compare_runs(a: RunView, b: RunView) -> Comparison:
    """Paired comparison of two runs on shared seeds (see :class:`Comparison`)."""
    def outcomes(v: RunView) -> dict[str, bool]:
        return {k: bool(v.episodes[k].success) for k in v.order if v.episodes[k].complete}

    pairing = pair_outcomes(outcomes(a), outcomes(b))
    by_task: dict[str, list[tuple[bool, bool]]] = {}
    flipped: list[tuple[str, str, bool, bool]] = []
    for k, sa, sb in pairing.pairs:
        ea = a.episodes[k]
        by_task.setdefault(ea.task_name, []).append((sa, sb))
        if sa != sb:
            flipped.append((ea.task_name, str(ea.seed), sa, sb))
    tables = {task: PairTable.from_pairs(pairs) for task, pairs in sorted(by_task.items())}
    tasks = []
    for task, t in tables.items():
        assert t.sr_a is not None and t.sr_b is not None and t.difference is not None
        tasks.append((task, t.n, t.sr_a, t.sr_b, t.difference))
    overall = PairTable.from_pairs((sa, sb) for _, sa, sb in pairing.pairs)
    names = list(tables)
    p_holm = dict(zip(names, holm_adjust([tables[n].mcnemar_p() for n in names]), strict=True))
    return Comparison(
        shared=overall.n,
        sr_a=overall.sr_a,
        sr_b=overall.sr_b,
        tasks=tasks,
        flipped=flipped,
        tables=tables,
        overall=overall,
        p_holm=p_holm,
    )
