"""Choosing a run and judging whether it is complete.

Discovery itself is :mod:`genmanip_results.discovery` (both on-disk layouts); this module only picks
among its :class:`~genmanip_results.discovery.RunInfo` objects and works out which episodes are
missing, from the run's metric file (``result.json`` / ``progress.json``: keys like
``*(3/5)testbed/reach/red_easy`` give each task's seed count) and the episodes found on disk.
Which roots are searched is :func:`genmanip_results.roots.search_roots` (re-exported here as
``default_roots``): ``--root`` when given, else the current directory and ``$GENMANIP_RESULT_DIR``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genmanip_results.compare import AmbiguousRun, RunNotFound
from genmanip_results.compare import resolve_run as resolve_results_run
from genmanip_results.discovery import RunInfo, find_runs, run_policy
from genmanip_results.roots import search_roots as default_roots

from .errors import AmbiguousRunError, RunNotFoundError

__all__ = [
    "Completeness",
    "completeness",
    "default_roots",
    "discover_runs",
    "resolve_run",
    "results_tree",
    "run_summary",
    "select_run",
]


@dataclass(frozen=True)
class Completeness:
    """How complete a run is.

    Attributes:
        expected: episodes the run should have (None when nothing on disk says).
        complete: finished episodes found (``result_info.json`` / ``result.json`` present).
        missing: ``task/seed`` of every unfinished or missing episode, sorted; a task whose seed
            count is unknown and that has no finished episode appears as ``task/*``.
    """

    expected: int | None
    complete: int
    missing: tuple[str, ...]

    @property
    def is_complete(self) -> bool:
        return not self.missing and self.complete > 0


def completeness(run: RunInfo) -> Completeness:
    """Which episodes of ``run`` are missing or unfinished (see :class:`Completeness`).

    Per-task seed counts come from the run's metric dict (``(done/total)`` keys of
    ``result.json`` / ``progress.json``, or ``run.json``'s ``metric``); seeds are ``000`` to
    ``total - 1`` as the server numbers them.
    """
    done: dict[str, set[str]] = {}
    missing: set[str] = set()
    for ep in run.episodes:
        if ep.complete:
            done.setdefault(ep.task_name, set()).add(ep.seed)
        else:
            missing.add(f"{ep.task_name}/{ep.seed}")
    expected: int | None = None
    if run.metric:
        expected = 0
        for tm in run.metric.values():
            if tm.total is None:
                expected = None
                if not done.get(tm.task):
                    missing.add(f"{tm.task}/*")
                continue
            if expected is not None:
                expected += tm.total
            seeds = {f"{i:03d}" for i in range(tm.total)}
            for seed in sorted(seeds - done.get(tm.task, set())):
                missing.add(f"{tm.task}/{seed}")
    n_done = sum(len(s) for s in done.values())
    if expected is None and run.total_episodes is not None:
        expected = run.total_episodes
    if expected is not None and n_done + len(missing) < expected:
        # Totals known only as a number (no per-task seed counts): say how many, not which.
        missing.add(f"({expected - n_done - len(missing)} more episode(s) not started)")
    return Completeness(expected=expected, complete=n_done, missing=tuple(sorted(missing)))


def results_tree(run: RunInfo) -> Path:
    """The results root the run lives in (``<tree>/<benchmark>/<run_id>`` in both layouts).

    A run id may contain ``/`` (the server allows nested ids); when the directory does not end
    in ``<benchmark>/<run_id>`` the run's grandparent is taken.
    """
    path = run.path.resolve()
    names = [run.benchmark, *[p for p in run.run_id.split("/") if p]]
    if len(path.parts) > len(names) and list(path.parts[-len(names):]) == names:
        return path.parents[len(names) - 1]
    return path.parent.parent


def discover_runs(roots: list[Path]) -> list[RunInfo]:
    """Every run under ``roots`` (each run once), newest first."""
    seen: set[Path] = set()
    out: list[RunInfo] = []
    for r in roots:
        if not r.exists():
            raise RunNotFoundError(f"results root {str(r)!r} does not exist")
        for run in find_runs(r):
            key = run.path.resolve()
            if key not in seen:
                seen.add(key)
                out.append(run)
    out.sort(key=lambda r: r.created, reverse=True)
    return out


def select_run(runs: list[RunInfo], run_id: str, benchmark_id: str | None = None) -> RunInfo:
    """The one run with ``run_id`` (and ``benchmark_id`` when given).

    Raises:
        RunNotFoundError: no such run (the message lists the run ids that exist).
        AmbiguousRunError: several match (never a first-match guess); lists every candidate.
    """
    matches = [r for r in runs if r.run_id == run_id]
    if benchmark_id is not None:
        matches = [r for r in matches if r.benchmark == benchmark_id]
    if not matches:
        known = sorted({f"{r.benchmark}/{r.run_id}" for r in runs})
        where = f" under benchmark {benchmark_id!r}" if benchmark_id else ""
        listing = ", ".join(known[:15]) + (" ..." if len(known) > 15 else "") if known else "none"
        raise RunNotFoundError(
            f"no run {run_id!r}{where}; runs found: {listing}",
            hint="`gmp leaderboard list` shows every run; --root picks the project root",
        )
    if len(matches) > 1:
        raise AmbiguousRunError(
            run_id, [f"{r.benchmark} ({r.layout} layout): {r.path}" for r in matches]
        )
    return matches[0]


def resolve_run(
    spec: str, root: str | os.PathLike[str] | None = None, benchmark_id: str | None = None
) -> RunInfo:
    """A run from a run directory or a run id (``RUN`` of ``gmp leaderboard bundle``).

    Found by the readers' one rule, :func:`genmanip_results.compare.resolve_run` (``root`` as
    ``--root`` gave it, searched by :func:`genmanip_results.roots.search_roots`; a run id may be
    spelt ``<benchmark>/<run_id>``); ``benchmark_id`` (``--benchmark-id``) narrows a run id to
    that benchmark. Its failures are said in the leaderboard's terms: :class:`AmbiguousRunError`
    naming every candidate (its ``<benchmark>/<run_id>`` and directory) and what to type;
    :class:`RunNotFoundError` listing the runs there are (:func:`select_run`), or for a path that
    is not a run directory or a root that does not exist.
    """
    try:
        return resolve_results_run(spec, root, benchmark_id=benchmark_id)
    except AmbiguousRun as exc:
        hint = exc.hint if benchmark_id is not None else f"{exc.hint}; or pick one with --benchmark-id BENCHMARK"
        raise AmbiguousRunError(
            spec, [f"{k}: {p}" for k, p in zip(exc.candidates, exc.paths, strict=True)], hint=hint
        ) from None
    except RunNotFound as exc:
        failure = exc
    p = Path(spec)
    if p.is_absolute() or (os.sep in spec and p.exists()):
        raise RunNotFoundError(f"{spec!r} is not a run directory") from failure
    return select_run(discover_runs(default_roots(root)), spec, benchmark_id)


def run_summary(run: RunInfo) -> dict[str, Any]:
    """The row of ``gmp leaderboard list`` for one run (JSON-ready)."""
    comp = completeness(run)
    sub = run.submitted if isinstance(run.submitted, dict) else None
    return {
        "benchmark": run.benchmark,
        "run_id": run.run_id,
        "layout": run.layout,
        "path": str(run.path),
        "episodes_done": comp.complete,
        "episodes_total": comp.expected,
        "complete": comp.is_complete,
        "success_rate": run.success_rate,
        "mean_score": run.mean_score,
        "submitted": sub is not None or run.submitted is not None,
        "submission_id": (sub or {}).get("submission_id"),
        "live": bool(run.live),
        "updated": run.updated,
        "policy": run_policy(run),
    }

