"""The browser's view of a results root: opaque run ids, episode lookup, live workers, comparisons.

Discovery itself is :mod:`genmanip_results.discovery` (both layouts, incremental ``RunScanner``). This
module only indexes its output for the pages. Scanning runs on a background thread: a request takes the
newest snapshot, asks for a rescan when it is older than ``min_interval`` and waits at most ``wait``
seconds for it, so no request blocks on a slow file system for more than a page's worth of work.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from genmanip_results.discovery import EpisodeInfo, RunInfo, RunScanner

# The live-view contract (file names, path safety) is genmanip_results.live: eval writes through
# it, these readers are its; re-exported here for the pages.
from genmanip_results.live import LiveWorker, live_workers
from genmanip_results.stats import PairTable, holm_adjust, pair_outcomes, wilson_interval

__all__ = [
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


def run_key(rel: str) -> str:
    """Opaque, stable id of a run from its path relative to the results root (12 hex chars)."""
    return hashlib.sha256(rel.encode("utf-8")).hexdigest()[:12]


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
    try:
        rel = Path(info.path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = Path(info.path).name
    view = RunView(key=run_key(rel), rel=rel, info=info)
    eps = sorted(info.episodes, key=lambda e: (e.task_name, _seed_key(str(e.seed))))
    for ep in eps:
        r = episode_rel(ep)
        view.episodes[r] = ep
        view.order.append(r)
    view.stats = group_stats(eps)
    view.workers = live_workers(Path(info.path), now=now)
    view.live = bool(getattr(info, "live", False)) or any(w.fresh for w in view.workers)
    return view


@dataclass
class Snapshot:
    """One consistent scan result: runs newest first and by key."""

    runs: list[RunView]
    by_key: dict[str, RunView]
    scanned_at: float
    scan_seconds: float


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
        self._attempts = 0  # finished scans, good or failed
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
                )
                err = None
            except BaseException as exc:  # keep serving the last good snapshot
                snap, err = None, exc
            with self._cond:
                if snap is not None:
                    self._snap = snap
                self._error = err
                self._attempts += 1
                self._busy = False
                self._cond.notify_all()

    @property
    def last_error(self) -> BaseException | None:
        """The exception of the last failed scan (None after a good one)."""
        return self._error

    def snapshot(self, *, wait: float = 0.0, first_wait: float = 5.0) -> Snapshot | None:
        """The newest snapshot, refreshing it in the background when older than ``min_interval``."""
        deadline = time.monotonic() + (first_wait if self._snap is None else wait)
        with self._cond:
            snap = self._snap
            stale = snap is None or time.monotonic() - snap.scanned_at > self.min_interval
            if stale and not self._busy and not self._want:
                self._want = True
                self._cond.notify_all()
            if stale:
                attempts = self._attempts
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    if self._snap is not snap and self._snap is not None:
                        break
                    if self._attempts != attempts and not self._busy and not self._want:
                        break  # a scan finished (perhaps failed): answer with what there is
                    if snap is not None and not self._busy and not self._want:
                        break
                    self._cond.wait(remaining)
            return self._snap

    def wait_for_scan(self, timeout: float = 30.0) -> Snapshot | None:
        """Block until a scan newer than now has finished (tests, benchmarks, ``gmp viz build``)."""
        start = time.monotonic()
        self.request_scan()
        with self._cond:
            while time.monotonic() - start < timeout:
                if (
                    self._snap is not None
                    and self._snap.scanned_at >= start
                    and not self._want
                    and not self._busy
                ):
                    return self._snap
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
