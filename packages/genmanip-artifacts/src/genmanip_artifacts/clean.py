"""Safe cleanup of generated files: plan first (a dry run), then delete exactly the plan.

What counts as generated (categories):

* ``viewer-cache``: ``.genmanip_vis.*`` files (the results browser's recordings and their
  sidecars/partials), anywhere under the root, results trees included.
* ``plots`` (only with ``plots=True``): ``action_plot.png``, ``state_plot.png``,
  ``merged_with_plot.mp4`` (+ its ``.part``), ``plot.log`` and the reference client's
  ``merged_with_plot_<8 hex>.mp4``, in episode directories or in directories holding a plot.log
  written by this package.
* ``tmp``: ``*.tmp`` files older than one hour, outside the results trees (the root's known trees
  ``saved/eval_results``, ``client_results``, ``gmp-demo``, ``$GENMANIP_RESULT_DIR`` and every run
  discovery finds: :mod:`genmanip_results.roots`) and outside protected dirs.
* ``logs``, ``mesh-cache``, ``download-cache`` (the latter only with ``all_caches=True``): the
  contents of ``<cache>/logs``, ``<cache>/meshes`` and ``<cache>/downloads`` of this project's cache
  directory (:func:`default_cache_dir`). The server layout's ``logs/`` is never touched.
* ``results`` (only with ``results=True``): whole runs of ``saved/eval_results`` that are not live
  (no fresh lock, no recent writes) and were submitted to a leaderboard (``submitted.flag``), or
  not submitted when ``force=True``. A live run is refused even with ``force``.

Never: following a symlink (a generated symlink is removed, its target never), descending into
``saved/tasks`` / ``saved/demonstrations`` / VCS or virtualenv dirs, deleting a fresh lock, deleting
write-protected files (they are reported as refused), or anything else in a results tree.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from genmanip_protocol.errors import GenmanipError
from genmanip_results.layout import (
    EVAL_RESULTS_DIR,
    INCOMPLETE,
    LOCK_SUFFIX,
    META_RECORD,
    RESULT_INFO,
    RESULT_JSON,
    SAVED_DIR,
    SERVER_INPUT_DIRS,
    STEPS_JSONL,
    SUBMITTED_FLAG,
    VIEWER_CACHE_PREFIX,
)
from genmanip_results.paths import is_within
from genmanip_results.roots import known_trees

from .errors import ArtifactsUsageError
from .plot import MERGED_VIDEO, PLOT_LOG, PLOT_LOG_SIGNATURE, PLOT_OUTPUTS

__all__ = [
    "CATEGORIES",
    "CleanItem",
    "CleanPlan",
    "CleanReport",
    "Refusal",
    "default_cache_dir",
    "execute_clean",
    "format_size",
    "plan_clean",
]

CATEGORIES = ("viewer-cache", "plots", "logs", "tmp", "mesh-cache", "download-cache", "results")

TMP_MAX_AGE_S = 3600.0
#: Same rule as the server: a lock untouched for 300 s is stale.
LOCK_STALE_S = 300.0

_REFERENCE_MERGED = re.compile(r"^merged_with_plot_[0-9a-f]{8}\.mp4$")
_PLOT_NAMES = frozenset((*PLOT_OUTPUTS, MERGED_VIDEO + ".part"))
_EPISODE_MARKERS = (STEPS_JSONL, RESULT_JSON, RESULT_INFO, META_RECORD, INCOMPLETE)
# Never descended into: other people's trees that happen to sit under a project root.
_SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        ".venv",
        "venv",
        ".tox",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
    }
)
_PROTECTED = tuple((SAVED_DIR, name) for name in SERVER_INPUT_DIRS)
_CACHE_SUBDIRS = (("logs", "logs"), ("meshes", "mesh-cache"), ("downloads", "download-cache"))

Kind = Literal["file", "dir", "symlink"]


def default_cache_dir() -> Path:
    """This project's cache directory: ``$GMP_CACHE_DIR``, else ``$XDG_CACHE_HOME/genmanip``, else
    ``~/.cache/genmanip``. Subdirectories: ``logs/``, ``meshes/``, ``downloads/``."""
    env = os.environ.get("GMP_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "genmanip"


def format_size(n: int) -> str:
    """Human-readable size: ``0 B``, ``4.0 KiB``, ``12.3 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - unreachable


@dataclass(frozen=True)
class CleanItem:
    """One thing to delete. ``size`` is in bytes (a directory: its regular files; a link: 0)."""

    path: Path
    category: str
    size: int
    kind: Kind
    note: str = ""


@dataclass(frozen=True)
class Refusal:
    """Something matching a category that will NOT be deleted, and why."""

    path: Path
    category: str
    reason: str


@dataclass
class CleanPlan:
    """The result of :func:`plan_clean`: exactly what :func:`execute_clean` will delete."""

    root: Path
    cache_dir: Path
    items: list[CleanItem] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(i.size for i in self.items)

    def by_category(self) -> dict[str, list[CleanItem]]:
        out: dict[str, list[CleanItem]] = {}
        for c in CATEGORIES:
            items = [i for i in self.items if i.category == c]
            if items:
                out[c] = items
        return out


@dataclass
class CleanReport:
    """What :func:`execute_clean` did."""

    removed: list[CleanItem] = field(default_factory=list)
    failed: list[tuple[CleanItem, str]] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    @property
    def bytes_freed(self) -> int:
        return sum(i.size for i in self.removed)


# ---------------------------------------------------------------- helpers


def _write_protected(st: os.stat_result) -> bool:
    # Mode bits, not os.access(): root may write anything, but a cleared write bit is still the
    # user's "keep this" (like rm's write-protected prompt).
    return not (st.st_mode & stat.S_IWUSR)


def _lstat_walk(top: Path, skip: Callable[[str], bool] = lambda name: False) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under ``top`` with its ``lstat``; descends into real directories only (never
    through a symlink) and not into entries whose name ``skip`` rejects. Unreadable entries are
    passed over."""
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            if skip(e.name):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
            yield Path(e.path), st


def _tree_size(path: Path) -> tuple[int, Path | None]:
    """(bytes of regular files under ``path`` without following links, first write-protected entry)."""
    total = 0
    protected: Path | None = None
    for p, st in _lstat_walk(path):
        if stat.S_ISLNK(st.st_mode):
            continue
        if protected is None and _write_protected(st):
            protected = p
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total, protected


def _newest_activity(run_dir: Path) -> float:
    """Newest mtime in a run, ignoring what is written after a run ends (submission flag, viewer
    caches, plots) and the locks (checked separately)."""

    def after_the_run(name: str) -> bool:
        return (
            name == SUBMITTED_FLAG
            or name.startswith(VIEWER_CACHE_PREFIX)
            or name.endswith(LOCK_SUFFIX)
            or name in _PLOT_NAMES
        )

    # A directory's mtime moves when a plot or cache is added: only files count.
    return max(
        (st.st_mtime for _, st in _lstat_walk(run_dir, after_the_run) if not stat.S_ISDIR(st.st_mode)),
        default=0.0,
    )


def _fresh_locks(run_dir: Path, now: float) -> list[str]:
    """Fresh lock files in a run: the shared reader's verdict plus a direct mtime check."""
    out: list[str] = []
    try:
        from genmanip_results.discovery import read_locks

        for lock in read_locks(run_dir, now=now, stale_after=LOCK_STALE_S):
            if not lock.stale:
                out.append(os.path.relpath(lock.path, run_dir))
    except GenmanipError:
        pass
    # Independent of the JSON content: a lock file touched recently is live, whatever it says.
    for p in _iter_files(run_dir):
        if p.name.endswith(LOCK_SUFFIX):
            try:
                st = p.lstat()
            except OSError:
                continue
            rel = os.path.relpath(p, run_dir)
            if now - st.st_mtime < LOCK_STALE_S and rel not in out:
                seed_done = (p.parent / p.name[: -len(LOCK_SUFFIX)] / RESULT_INFO).exists()
                if not seed_done:
                    out.append(rel)
    return sorted(set(out))


def _iter_files(root: Path) -> Iterator[Path]:
    """Every non-directory entry under ``root`` (symlinks included, never followed)."""
    for p, st in _lstat_walk(root):
        if not stat.S_ISDIR(st.st_mode):
            yield p


def _run_liveness(run_dir: Path, now: float) -> str | None:
    """Why the run counts as live, or None."""
    locks = _fresh_locks(run_dir, now)
    if locks:
        more = f" (+{len(locks) - 1} more)" if len(locks) > 1 else ""
        return f"live run: fresh lock {locks[0]}{more}"
    age = now - _newest_activity(run_dir)
    if age < LOCK_STALE_S:
        return f"live run: written {int(age)} s ago"
    return None


# ---------------------------------------------------------------- planning


@dataclass
class _Ctx:
    root: Path
    plots: bool
    now: float
    results_dirs: list[str]
    plan: CleanPlan
    seen: set[str]


def _add(ctx: _Ctx, path: Path, category: str, st: os.stat_result, note: str = "") -> None:
    key = os.path.abspath(path)
    if key in ctx.seen:
        return
    ctx.seen.add(key)
    if stat.S_ISLNK(st.st_mode):
        ctx.plan.items.append(CleanItem(path, category, 0, "symlink", note))
        return
    if _write_protected(st):
        ctx.plan.refused.append(Refusal(path, category, "write-protected (kept)"))
        return
    if stat.S_ISDIR(st.st_mode):
        size, protected = _tree_size(path)
        if protected is not None:
            ctx.plan.refused.append(
                Refusal(path, category, f"contains write-protected {protected.name} (kept)")
            )
            return
        ctx.plan.items.append(CleanItem(path, category, size, "dir", note))
    else:
        ctx.plan.items.append(CleanItem(path, category, st.st_size, "file", note))


def _in_results(path: str, ctx: _Ctx) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in ctx.results_dirs)


def _plot_dir(names: set[str], dir_path: Path) -> bool:
    if any(m in names for m in _EPISODE_MARKERS):
        return True
    if PLOT_LOG in names:
        try:
            with open(dir_path / PLOT_LOG, encoding="utf-8", errors="replace") as f:
                return f.readline().strip() == PLOT_LOG_SIGNATURE
        except OSError:
            return False
    return False


def _walk_root(ctx: _Ctx) -> None:
    root = ctx.root
    stack: list[Path] = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        names = {e.name for e in entries}
        in_results = _in_results(os.path.abspath(d), ctx)
        plot_dir = ctx.plots and _plot_dir(names, d)
        for e in entries:
            path = Path(e.path)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            is_link = stat.S_ISLNK(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                rel = path.relative_to(root).parts
                if e.name in _SKIP_DIRS or any(rel[-len(p) :] == p for p in _PROTECTED):
                    continue
                stack.append(path)
                continue
            name = e.name
            if name.startswith(VIEWER_CACHE_PREFIX):
                _add(ctx, path, "viewer-cache", st)
            elif plot_dir and (name in _PLOT_NAMES or _REFERENCE_MERGED.match(name)):
                _add(ctx, path, "plots", st)
            elif (
                name.endswith(".tmp")
                and not in_results
                and not is_link
                and ctx.now - st.st_mtime > TMP_MAX_AGE_S
            ):
                _add(ctx, path, "tmp", st, note=f"{int((ctx.now - st.st_mtime) // 3600)} h old")


def _plan_cache(ctx: _Ctx, cache_dir: Path, all_caches: bool) -> None:
    try:
        st = os.lstat(cache_dir)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        ctx.plan.refused.append(
            Refusal(
                cache_dir, "cache", "cache directory is a symlink or not a directory; not followed"
            )
        )
        return
    for sub, category in _CACHE_SUBDIRS:
        if category == "download-cache" and not all_caches:
            continue
        d = cache_dir / sub
        try:
            dst = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISLNK(dst.st_mode) or not stat.S_ISDIR(dst.st_mode):
            ctx.plan.refused.append(
                Refusal(d, category, "a symlink or not a directory; not followed")
            )
            continue
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            ctx.plan.refused.append(Refusal(d, category, f"unreadable ({exc.strerror})"))
            continue
        for e in entries:
            try:
                est = e.stat(follow_symlinks=False)
            except OSError:
                continue
            _add(ctx, Path(e.path), category, est)
    # Stale temporaries at the top of the cache directory (interrupted downloads, atomic writes).
    try:
        with os.scandir(cache_dir) as it:
            for e in it:
                if e.name.endswith(".tmp") and e.is_file(follow_symlinks=False):
                    est = e.stat(follow_symlinks=False)
                    if ctx.now - est.st_mtime > TMP_MAX_AGE_S:
                        _add(ctx, Path(e.path), "tmp", est)
    except OSError:
        pass


def _results_trees(root: Path) -> list[str]:
    """Absolute paths of every results tree of ``root``: its known trees and
    ``$GENMANIP_RESULT_DIR`` (:func:`genmanip_results.roots.known_trees`), and every run
    discovery finds under it."""
    trees = {os.path.abspath(t) for t in known_trees(root)}
    try:
        from genmanip_results.discovery import find_runs

        for run in find_runs(root):
            trees.add(os.path.abspath(run.path))
    except GenmanipError:
        pass
    return sorted(trees)


def _plan_results(ctx: _Ctx, force: bool) -> None:
    base = ctx.root / SAVED_DIR / EVAL_RESULTS_DIR
    try:
        bst = os.lstat(base)
    except OSError:
        return
    if stat.S_ISLNK(bst.st_mode):
        ctx.plan.refused.append(
            Refusal(base, "results", "saved/eval_results is a symlink; not followed")
        )
        return
    from genmanip_results.discovery import find_runs

    for run in sorted(find_runs(base), key=lambda r: str(r.path)):
        path = Path(run.path)
        if run.layout != "server":
            continue
        # (the parent: a run directory that is itself a symlink is refused just below)
        if not is_within(path.parent, base):
            ctx.plan.refused.append(
                Refusal(path, "results", "outside saved/eval_results; not followed")
            )
            continue
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            ctx.plan.refused.append(
                Refusal(path, "results", "run directory is a symlink; not followed")
            )
            continue
        live = _run_liveness(path, ctx.now)
        if live is not None:
            ctx.plan.refused.append(
                Refusal(path, "results", live + " (never deleted, even with --force)")
            )
            continue
        if run.submitted is None and not force:
            ctx.plan.refused.append(
                Refusal(
                    path,
                    "results",
                    "not submitted to a leaderboard (no submitted.flag); --force deletes it",
                )
            )
            continue
        note = "submitted" if run.submitted is not None else "NOT submitted (--force)"
        _add(ctx, path, "results", st, note=f"{run.benchmark}/{run.run_id}, {note}")
        if ctx.plan.items and ctx.plan.items[-1].path == path:
            # Plots and viewer caches inside the run go with it: drop their separate entries.
            prefix = os.path.abspath(path) + os.sep
            ctx.plan.items = [
                i for i in ctx.plan.items if not os.path.abspath(i.path).startswith(prefix)
            ]


def plan_clean(
    root: Path | str = ".",
    *,
    plots: bool = False,
    results: bool = False,
    all_caches: bool = False,
    force: bool = False,
    cache_dir: Path | str | None = None,
    now: float | None = None,
) -> CleanPlan:
    """List what a cleanup would delete, by category; deletes nothing.

    Args:
        root: the project root to scan (never left: symlinks are not followed).
        plots: also list plot outputs. results: also list whole server-layout runs that may go.
        all_caches: also list the download cache. force: allow unsubmitted (never live) runs.
        cache_dir: this project's cache directory (default :func:`default_cache_dir`).
        now: the clock (tests).

    Raises:
        ArtifactsUsageError: the root does not exist or is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise ArtifactsUsageError(f"{root}: not a directory")
    root = Path(os.path.abspath(root))
    cache = Path(os.path.abspath(cache_dir if cache_dir is not None else default_cache_dir()))
    now = time.time() if now is None else now
    plan = CleanPlan(root=root, cache_dir=cache)
    ctx = _Ctx(
        root=root, plots=plots, now=now, results_dirs=_results_trees(root), plan=plan, seen=set()
    )
    _walk_root(ctx)
    _plan_cache(ctx, cache, all_caches)
    if results:
        _plan_results(ctx, force)
    return plan


# ---------------------------------------------------------------- execution


class _LiveLockFound(Exception):
    pass


def _rmtree(parent_fd: int, name: str, now: float) -> None:
    """Remove ``name`` (relative to ``parent_fd``) recursively without ever following a symlink.

    Directories are opened with O_NOFOLLOW relative to their parent's descriptor, so a directory
    swapped for a symlink mid-way is unlinked, not entered. A fresh ``*.lock`` aborts the removal.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            os.unlink(name, dir_fd=parent_fd)
            return
        raise
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                _rmtree(fd, e.name, now)
                continue
            if e.name.endswith(LOCK_SUFFIX):
                st = e.stat(follow_symlinks=False)
                if now - st.st_mtime < LOCK_STALE_S:
                    raise _LiveLockFound(e.name)
            os.unlink(e.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def _same(st: os.stat_result, item: CleanItem) -> bool:
    if item.kind == "symlink":
        return stat.S_ISLNK(st.st_mode)
    if item.kind == "dir":
        return stat.S_ISDIR(st.st_mode)
    return stat.S_ISREG(st.st_mode)


def execute_clean(plan: CleanPlan, *, now: float | None = None) -> CleanReport:
    """Delete the items of ``plan`` (nothing else). Each item is re-checked first: it must still be
    the same kind of thing, inside the root or the cache dir, and a run must still not be live.
    Failures are collected, never raised."""
    report = CleanReport(refused=list(plan.refused))
    for item in plan.items:
        t = time.time() if now is None else now
        path = item.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            report.failed.append((item, exc.strerror or str(exc)))
            continue
        if not _same(st, item):
            report.failed.append((item, "changed since it was listed; left alone"))
            continue
        # The parent's real location: the item itself may be a symlink (only the link goes).
        if not (is_within(path.parent, plan.root) or is_within(path.parent, plan.cache_dir)):
            report.failed.append((item, "no longer inside the root; left alone"))
            continue
        if item.category == "results":
            live = _run_liveness(path, t)
            if live is not None:
                report.refused.append(Refusal(path, "results", live))
                continue
        try:
            if item.kind == "dir":
                parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    _rmtree(parent_fd, path.name, t)
                finally:
                    os.close(parent_fd)
            else:
                os.unlink(path)
        except _LiveLockFound as exc:
            report.refused.append(
                Refusal(path, item.category, f"live lock {exc} appeared; stopped")
            )
            continue
        except OSError as exc:
            report.failed.append((item, exc.strerror or str(exc)))
            continue
        report.removed.append(item)
    return report
