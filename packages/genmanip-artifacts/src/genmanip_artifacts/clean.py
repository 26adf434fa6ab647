"""Safe cleanup of generated files: plan first (a dry run), then delete exactly the plan.

The rule: delete only what gmp **provably** created (:mod:`genmanip_results.provenance`). A name
proves nothing (a user's folder may hold a ``state_plot.png``); the evidence is written at
creation:

* ``viewer-cache``: ``.genmanip_vis.*`` files (the results browser's recordings, sidecars,
  partials) anywhere under the root, results trees included, that their directory's
  ``.gmp-generated.jsonl`` manifest registers (same inode, size and mtime as when gmp wrote them;
  a partial: registered before it was created, and older than one hour).
* ``plots`` (only with ``plots=True``): ``action_plot.png``, ``state_plot.png``,
  ``merged_with_plot.mp4`` (+ its ``.part``) and ``plot.log`` that the manifest registers, in
  any directory (episode directories and ``gmp plot --out`` directories alike).
* ``tmp``: temporaries of gmp's atomic writes (``.<name>.<12 hex>.tmp``) older than one hour,
  only inside results trees (the root's known trees ``saved/eval_results``, ``client_results``,
  ``gmp-demo``, ``$GENMANIP_RESULT_DIR`` and every run discovery finds:
  :mod:`genmanip_results.roots`) and at the top of gmp's cache directory. Any other ``*.tmp`` is
  not gmp's and is never looked at.
* ``logs``, ``mesh-cache``, ``download-cache`` (the latter only with ``all_caches=True``): the
  contents of ``logs/``, ``meshes/`` and ``downloads/`` of gmp's cache directory
  (:func:`default_cache_dir`), and only when that directory carries gmp's Cache Directory Tag
  (written when gmp creates it). A ``cache_dir`` named explicitly without it raises
  :class:`~genmanip_artifacts.errors.CacheDirNotGmpError`. The server layout's ``logs/`` is never
  touched.
* ``results`` (only with ``results=True``): whole runs of ``saved/eval_results`` that are not live
  (no fresh lock, no recent writes) and were submitted to a leaderboard (``submitted.flag``), or
  not submitted when ``force=True``. A live run is refused even with ``force``.

A file named like a generated one but not proven (made by an older gmp that wrote no manifest,
or by someone else) is listed as a :class:`Refusal` with reason :data:`NOT_PROVEN` and kept.

Everything below the root (and the cache directory) is walked and deleted through directory
descriptors with no-follow semantics (:mod:`genmanip_results.fdwalk`): a directory swapped for a
symlink between planning and deleting — or during either — is never entered, and each deletion
re-checks that the entry is still the inode that was planned. Never: following a symlink,
descending into ``saved/tasks`` / ``saved/demonstrations`` / VCS or virtualenv dirs, deleting a
fresh lock, deleting write-protected files (they are reported as refused), or anything else in a
results tree.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from genmanip_protocol.errors import GenmanipError
from genmanip_results.fdwalk import (
    DirListing,
    Entry,
    Ident,
    RemovalVetoed,
    WalkRefused,
    ident,
    kind_of,
    list_dir,
    lstat_at,
    open_dir_at,
    open_dirs,
    open_top,
    remove_tree,
    walk,
)
from genmanip_results.layout import (
    CACHE_DIR_TAG,
    EVAL_RESULTS_DIR,
    FRAME_STORE_SUFFIX,
    GENERATED_MANIFEST,
    LOCK_SUFFIX,
    RESULT_INFO,
    SAVED_DIR,
    SERVER_INPUT_DIRS,
    SUBMITTED_FLAG,
    VIDEO_PART_SUFFIX,
    VIDEO_SUFFIX,
    VIEWER_CACHE_PREFIX,
)
from genmanip_results.provenance import (
    CATEGORY_PLOTS,
    CATEGORY_VIDEOS,
    CATEGORY_VIEWER_CACHE,
    Manifest,
    is_gmp_cache_dir,
    is_gmp_tmp_name,
    prune_manifest,
    read_manifest,
)
from genmanip_results.roots import known_trees

from .errors import ArtifactsUsageError, CacheDirNotGmpError
from .plot import MERGED_VIDEO, PLOT_OUTPUTS

__all__ = [
    "CATEGORIES",
    "NOT_PROVEN",
    "CleanItem",
    "CleanPlan",
    "CleanReport",
    "Refusal",
    "default_cache_dir",
    "execute_clean",
    "format_size",
    "plan_clean",
]

CATEGORIES = ("viewer-cache", "plots", "videos", "logs", "tmp", "mesh-cache", "download-cache", "results")

#: The reason of a :class:`Refusal` for a file named like a generated one that no provenance
#: record covers (an older gmp's output, or a user's file).
NOT_PROVEN = "not provably gmp's: kept"

TMP_MAX_AGE_S = 3600.0
#: Same rule as the server: a lock untouched for 300 s is stale.
LOCK_STALE_S = 300.0

# The reference client's overlay video: named like a plot but never gmp's (listed, kept).
_REFERENCE_MERGED = re.compile(r"^merged_with_plot_[0-9a-f]{8}\.mp4$")
_PLOT_NAMES = frozenset((*PLOT_OUTPUTS, MERGED_VIDEO + ".part"))
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
_PROVEN_CATEGORIES = frozenset((CATEGORY_PLOTS, CATEGORY_VIEWER_CACHE, CATEGORY_VIDEOS))
# A video being made from a frame store (genmanip_results.frames.ensure_video) before its rename.
_VIDEO_PART = VIDEO_PART_SUFFIX
_CHANGED = "changed since it was listed; left alone"

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
    """One thing to delete. ``size`` is in bytes (a directory: its regular files; a link: 0).

    ``base`` (the root or the cache directory), ``rel`` (the path below it), ``ident`` and
    ``parent_ident`` (``(dev, ino)`` of the entry and of its directory when planned) let
    :func:`execute_clean` find exactly this entry again by descriptor, never by a path that
    could have been redirected."""

    path: Path
    category: str
    size: int
    kind: Kind
    note: str = ""
    base: Path | None = None
    rel: tuple[str, ...] = ()
    ident: Ident | None = None
    parent_ident: Ident | None = None


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
    #: ``(dev, ino)`` of the root and the cache directory when planned.
    root_ident: Ident | None = None
    cache_ident: Ident | None = None

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


def _tree_size(parent_fd: int, entry: Entry) -> tuple[int, str | None]:
    """(bytes of regular files in the directory ``entry`` of ``parent_fd``, without following
    links; name of its first write-protected entry, or None)."""
    total = 0
    protected: str | None = None
    fd = open_dir_at(parent_fd, entry.name, expect=entry.ident, rel=entry.rel)
    try:
        for listing in walk(fd):
            for e in listing.entries:
                if e.kind == "symlink":
                    continue
                if protected is None and _write_protected(e.st):
                    protected = e.name
                if e.kind == "file":
                    total += e.st.st_size
    finally:
        os.close(fd)
    return total, protected


def _after_the_run(name: str) -> bool:
    """Written after a run ends (submission flag, viewer caches, plots, their manifest) or a lock
    (checked separately): does not make a run live."""
    return (
        name in (SUBMITTED_FLAG, GENERATED_MANIFEST)
        or name.startswith(VIEWER_CACHE_PREFIX)
        or name.endswith(LOCK_SUFFIX)
        or name in _PLOT_NAMES
    )


def _seed_done(lock_dir_fd: int, lock_name: str) -> bool:
    """``<seed>/result_info.json`` exists next to ``<seed>.lock`` (read by descriptor)."""
    seed = lock_name[: -len(LOCK_SUFFIX)]
    try:
        fd = open_dir_at(lock_dir_fd, seed)
    except (OSError, WalkRefused):
        return False
    try:
        return stat.S_ISREG(lstat_at(fd, RESULT_INFO).st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def _fresh_locks(run_fd: int, run_dir: Path, now: float) -> list[str]:
    """Fresh lock files in a run: the shared reader's verdict plus a direct mtime check."""
    out: list[str] = []
    try:
        from genmanip_results.discovery import read_locks

        for lock in read_locks(run_dir, now=now, stale_after=LOCK_STALE_S):
            if not lock.stale:
                out.append(os.path.relpath(lock.path, run_dir))
    except (GenmanipError, OSError):
        pass
    # Independent of the JSON content: a lock file touched recently is live, whatever it says.
    for listing in walk(run_fd):
        for e in listing.entries:
            if e.kind == "dir" or not e.name.endswith(LOCK_SUFFIX):
                continue
            rel = "/".join(e.rel)
            if now - e.st.st_mtime < LOCK_STALE_S and rel not in out:
                if not _seed_done(listing.fd, e.name):
                    out.append(rel)
    return sorted(set(out))


def _newest_activity(run_fd: int) -> float:
    """Newest mtime of a file in a run, ignoring what is written after a run ends."""
    newest = 0.0
    for listing in walk(run_fd):
        for e in listing.entries:
            # A directory's mtime moves when a plot or cache is added: only files count.
            if e.kind != "dir" and not _after_the_run(e.name):
                newest = max(newest, e.st.st_mtime)
    return newest


def _run_liveness(run_fd: int, run_dir: Path, now: float) -> str | None:
    """Why the run counts as live, or None."""
    locks = _fresh_locks(run_fd, run_dir, now)
    if locks:
        more = f" (+{len(locks) - 1} more)" if len(locks) > 1 else ""
        return f"live run: fresh lock {locks[0]}{more}"
    age = now - _newest_activity(run_fd)
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
    videos: bool = False


def _add(
    ctx: _Ctx, base: Path, listing: DirListing, e: Entry, category: str, *, note: str = ""
) -> None:
    path = base.joinpath(*e.rel)
    key = os.path.abspath(path)
    if key in ctx.seen:
        return
    ctx.seen.add(key)

    def item(size: int, kind: Kind) -> CleanItem:
        return CleanItem(
            path, category, size, kind, note,
            base=base, rel=e.rel, ident=e.ident, parent_ident=listing.ident,
        )  # fmt: skip

    kind = e.kind
    if kind == "symlink":
        ctx.plan.items.append(item(0, "symlink"))
    elif kind == "other":
        ctx.plan.refused.append(Refusal(path, category, "not a regular file (kept)"))
    elif _write_protected(e.st):
        ctx.plan.refused.append(Refusal(path, category, "write-protected (kept)"))
    elif kind == "dir":
        try:
            size, protected = _tree_size(listing.fd, e)
        except (OSError, WalkRefused) as exc:
            ctx.plan.refused.append(Refusal(path, category, f"unreadable ({exc}); kept"))
            return
        if protected is not None:
            ctx.plan.refused.append(
                Refusal(path, category, f"contains write-protected {protected} (kept)")
            )
            return
        ctx.plan.items.append(item(size, "dir"))
    else:
        ctx.plan.items.append(item(e.st.st_size, "file"))


def _in_results(path: str, ctx: _Ctx) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in ctx.results_dirs)


def _descend_root(e: Entry) -> bool:
    return e.name not in _SKIP_DIRS and not any(e.rel[-len(p) :] == p for p in _PROTECTED)


def _generated_category(
    name: str, plots: bool, *, videos: bool = False, names: frozenset[str] = frozenset()
) -> str | None:
    """The category a file of this name would be, if provenance proves it gmp's (``names``: the
    other names of its directory)."""
    if name.startswith(VIEWER_CACHE_PREFIX):
        return CATEGORY_VIEWER_CACHE
    if name.endswith(_VIDEO_PART) and name[: -len(_VIDEO_PART)] + FRAME_STORE_SUFFIX in names:
        return CATEGORY_VIDEOS  # a killed maker's partial video (the store it came from is kept)
    if (videos and name.endswith(VIDEO_SUFFIX)
            and name[: -len(VIDEO_SUFFIX)] + FRAME_STORE_SUFFIX in names):
        return CATEGORY_VIDEOS  # remakeable from the frame store next to it
    if plots and (name in _PLOT_NAMES or _REFERENCE_MERGED.match(name)):
        return CATEGORY_PLOTS
    return None


def _judge_generated(
    ctx: _Ctx, listing: DirListing, manifest: Manifest, e: Entry, category: str
) -> None:
    path = ctx.root.joinpath(*e.rel)
    if not manifest.proves(e.name, e.st, category):
        key = os.path.abspath(path)
        if key not in ctx.seen:
            ctx.seen.add(key)
            ctx.plan.refused.append(Refusal(path, category, NOT_PROVEN))
        return
    rec = manifest.records[e.name]
    if rec.partial and ctx.now - e.st.st_mtime < TMP_MAX_AGE_S:
        # A partial younger than an hour may still be being written by a running gmp.
        return
    _add(ctx, ctx.root, listing, e, category, note="partial" if rec.partial else "")


def _walk_root(ctx: _Ctx, root_fd: int) -> None:
    for listing in walk(root_fd, descend=_descend_root):
        in_results = _in_results(os.path.join(ctx.root, *listing.rel), ctx)
        manifest: Manifest | None = None
        names = frozenset(e.name for e in listing.entries if e.kind == "file")
        for e in listing.entries:
            if e.kind == "dir":
                continue
            category = _generated_category(e.name, ctx.plots, videos=ctx.videos, names=names)
            if category is not None:
                if manifest is None:
                    manifest = read_manifest(listing.fd)
                _judge_generated(ctx, listing, manifest, e, category)
            elif (
                in_results
                and e.kind == "file"
                and is_gmp_tmp_name(e.name)
                and ctx.now - e.st.st_mtime > TMP_MAX_AGE_S
            ):
                hours = int((ctx.now - e.st.st_mtime) // 3600)
                _add(ctx, ctx.root, listing, e, "tmp", note=f"{hours} h old")


def _plan_cache(ctx: _Ctx, cache_dir: Path, all_caches: bool, explicit: bool) -> None:
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
    try:
        fd = open_top(cache_dir, follow=False)
    except (OSError, WalkRefused) as exc:
        ctx.plan.refused.append(Refusal(cache_dir, "cache", f"cannot open ({exc}); kept"))
        return
    try:
        top = list_dir(fd)
        if not is_gmp_cache_dir(fd):
            if explicit:
                raise CacheDirNotGmpError(cache_dir)
            if any(sub in top.names for sub, _ in _CACHE_SUBDIRS):
                ctx.plan.refused.append(
                    Refusal(
                        cache_dir,
                        "cache",
                        f"not provably gmp's cache directory (no gmp {CACHE_DIR_TAG}): kept",
                    )
                )
            return
        ctx.plan.cache_ident = top.ident
        by_name = {e.name: e for e in top.entries}
        for sub, category in _CACHE_SUBDIRS:
            if category == "download-cache" and not all_caches:
                continue
            d = cache_dir / sub
            sub_entry = by_name.get(sub)
            if sub_entry is None:
                continue
            if sub_entry.kind != "dir":
                ctx.plan.refused.append(
                    Refusal(d, category, "a symlink or not a directory; not followed")
                )
                continue
            try:
                sfd = open_dir_at(fd, sub, expect=sub_entry.ident, rel=(sub,))
            except (OSError, WalkRefused) as exc:
                ctx.plan.refused.append(Refusal(d, category, f"unreadable ({exc})"))
                continue
            try:
                # Relative to the cache dir: the entries' ``rel`` is below ``sub``.
                listing = list_dir(sfd, (sub,))
                for e in listing.entries:
                    _add(ctx, cache_dir, listing, e, category)
            finally:
                os.close(sfd)
        # Stale temporaries of gmp's atomic writes at the top of the cache directory.
        for e in top.entries:
            if (
                e.kind == "file"
                and is_gmp_tmp_name(e.name)
                and ctx.now - e.st.st_mtime > TMP_MAX_AGE_S
            ):
                _add(ctx, cache_dir, top, e, "tmp")
    finally:
        os.close(fd)


def _results_trees(root: Path) -> list[str]:
    """Absolute paths of every results tree of ``root``: its known trees and
    ``$GENMANIP_RESULT_DIR`` (:func:`genmanip_results.roots.known_trees`), and every run
    discovery finds under it."""
    trees = {os.path.abspath(t) for t in known_trees(root)}
    try:
        from genmanip_results.discovery import find_runs

        for run in find_runs(root):
            trees.add(os.path.abspath(run.path))
    except (GenmanipError, OSError):
        pass
    return sorted(trees)


def _plan_results(ctx: _Ctx, root_fd: int, force: bool) -> None:
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
        rel = tuple(Path(os.path.relpath(os.path.abspath(path), ctx.root)).parts)
        if len(rel) < 3 or rel[:2] != (SAVED_DIR, EVAL_RESULTS_DIR) or ".." in rel:
            ctx.plan.refused.append(
                Refusal(path, "results", "outside saved/eval_results; not followed")
            )
            continue
        try:
            parent_fd = open_dirs(root_fd, rel[:-1])
        except WalkRefused:
            ctx.plan.refused.append(
                Refusal(path, "results", "outside saved/eval_results; not followed")
            )
            continue
        except OSError:
            continue
        try:
            try:
                st = lstat_at(parent_fd, rel[-1])
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                ctx.plan.refused.append(
                    Refusal(path, "results", "run directory is a symlink; not followed")
                )
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                run_fd = open_dir_at(parent_fd, rel[-1], expect=ident(st), rel=rel)
            except (OSError, WalkRefused):
                continue
            try:
                live = _run_liveness(run_fd, path, ctx.now)
            finally:
                os.close(run_fd)
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
            parent_listing = DirListing(parent_fd, rel[:-1], ident(os.fstat(parent_fd)), [])
            _add(
                ctx,
                ctx.root,
                parent_listing,
                Entry(rel[-1], rel, st),
                "results",
                note=f"{run.benchmark}/{run.run_id}, {note}",
            )
            if ctx.plan.items and ctx.plan.items[-1].path == path:
                # Plots and viewer caches inside the run go with it: drop their separate entries.
                prefix = os.path.abspath(path) + os.sep
                ctx.plan.items = [
                    i for i in ctx.plan.items if not os.path.abspath(i.path).startswith(prefix)
                ]
        finally:
            os.close(parent_fd)


def plan_clean(
    root: Path | str = ".",
    *,
    plots: bool = False,
    results: bool = False,
    all_caches: bool = False,
    force: bool = False,
    cache_dir: Path | str | None = None,
    now: float | None = None,
    videos: bool = False,
) -> CleanPlan:
    """List what a cleanup would delete, by category; deletes nothing.

    Always listed among the ``videos``: a ``<camera>.mp4.part`` that a killed video maker left next
    to its frame store (proven, older than an hour). With ``videos``: also every ``<camera>.mp4``
    made from a frame store that is still there (remade on demand by the next viewer).

    Args:
        root: the project root to scan (never left: symlinks are not followed).
        plots: also list plot outputs. results: also list whole server-layout runs that may go.
        all_caches: also list the download cache. force: allow unsubmitted (never live) runs.
        cache_dir: gmp's cache directory (default :func:`default_cache_dir`); one named here must
            carry gmp's cache tag.
        now: the clock (tests).

    Raises:
        ArtifactsUsageError: the root does not exist or is not a directory.
        CacheDirNotGmpError: ``cache_dir`` was given and is not gmp's cache directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise ArtifactsUsageError(f"{root}: not a directory")
    root = Path(os.path.abspath(root))
    cache = Path(os.path.abspath(cache_dir if cache_dir is not None else default_cache_dir()))
    now = time.time() if now is None else now
    plan = CleanPlan(root=root, cache_dir=cache)
    ctx = _Ctx(
        root=root, plots=plots, now=now, results_dirs=_results_trees(root), plan=plan, seen=set(),
        videos=videos,
    )
    try:
        root_fd = open_top(root)
    except OSError as exc:
        raise ArtifactsUsageError(f"{root}: cannot open ({exc.strerror or exc})") from exc
    try:
        plan.root_ident = ident(os.fstat(root_fd))
        _walk_root(ctx, root_fd)
        _plan_cache(ctx, cache, all_caches, explicit=cache_dir is not None)
        if results:
            _plan_results(ctx, root_fd, force)
    finally:
        os.close(root_fd)
    return plan


# ---------------------------------------------------------------- execution


def _lock_veto(now: float) -> Callable[[Entry], str | None]:
    def veto(e: Entry) -> str | None:
        if e.name.endswith(LOCK_SUFFIX) and now - e.st.st_mtime < LOCK_STALE_S:
            return f"live lock {e.name} appeared; stopped"
        return None

    return veto


class _Bases:
    """The root and the cache directory, opened once each and checked to be what was planned."""

    def __init__(self, plan: CleanPlan) -> None:
        self.plan = plan
        self.fds: dict[Path, int] = {}

    def fd(self, base: Path) -> int:
        if base in self.fds:
            return self.fds[base]
        is_root = base == self.plan.root
        expect = self.plan.root_ident if is_root else self.plan.cache_ident
        fd = open_top(base, follow=is_root)
        if expect is not None and ident(os.fstat(fd)) != expect:
            os.close(fd)
            raise WalkRefused(str(base), "was replaced since it was listed")
        self.fds[base] = fd
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _remove_item(
    item: CleanItem, parent_fd: int, now: float, report: CleanReport
) -> bool:
    """Re-check ``item`` inside its (already verified) directory and remove it; True if removed."""
    name = item.rel[-1]
    try:
        st = lstat_at(parent_fd, name)
    except FileNotFoundError:
        return False
    if kind_of(st) != item.kind or (item.ident is not None and ident(st) != item.ident):
        report.failed.append((item, _CHANGED))
        return False
    if item.category in _PROVEN_CATEGORIES and not read_manifest(parent_fd).proves(
        name, st, item.category
    ):
        report.failed.append((item, "no longer provably gmp's; left alone"))
        return False
    if item.kind == "file" and _write_protected(st):
        report.refused.append(Refusal(item.path, item.category, "write-protected (kept)"))
        return False
    veto = None
    if item.category == "results":
        try:
            run_fd = open_dir_at(parent_fd, name, expect=item.ident, rel=item.rel)
        except WalkRefused:
            report.failed.append((item, _CHANGED))
            return False
        try:
            live = _run_liveness(run_fd, item.path, now)
        finally:
            os.close(run_fd)
        if live is not None:
            report.refused.append(Refusal(item.path, "results", live))
            return False
        veto = _lock_veto(now)
    if item.kind == "dir":
        remove_tree(parent_fd, name, expect=item.ident, veto=veto, rel=item.rel)
    else:
        os.unlink(name, dir_fd=parent_fd)
    return True


def execute_clean(plan: CleanPlan, *, now: float | None = None) -> CleanReport:
    """Delete the items of ``plan`` (nothing else). Each item is found again by descriptor from
    the root (or cache dir) without following a symlink, and re-checked first: its directory must
    be the one planned, it must be the same inode and kind, still provably gmp's, and a run must
    still not be live. Failures are collected, never raised."""
    report = CleanReport(refused=list(plan.refused))
    bases = _Bases(plan)
    touched: set[tuple[Path, tuple[str, ...]]] = set()
    try:
        for planned in plan.items:
            t = time.time() if now is None else now
            base = planned.base if planned.base is not None else plan.root
            # An item built by hand (no rel): found below the root by its path.
            rel = planned.rel or tuple(Path(os.path.relpath(planned.path, base)).parts)
            item = planned if planned.rel == rel else dataclasses.replace(planned, rel=rel)
            try:
                parent_fd = open_dirs(bases.fd(base), rel[:-1], expect=item.parent_ident)
            except FileNotFoundError:
                continue
            except WalkRefused:
                report.failed.append((item, _CHANGED))
                continue
            except OSError as exc:
                report.failed.append((item, exc.strerror or str(exc)))
                continue
            try:
                if _remove_item(item, parent_fd, t, report):
                    report.removed.append(item)
                    if item.category in _PROVEN_CATEGORIES:
                        touched.add((base, rel[:-1]))
            except RemovalVetoed as exc:
                report.refused.append(Refusal(item.path, item.category, exc.reason))
            except WalkRefused:
                report.failed.append((item, _CHANGED))
            except OSError as exc:
                report.failed.append((item, exc.strerror or str(exc)))
            finally:
                os.close(parent_fd)
        # A manifest whose files are all gone goes too: no gmp litter is left behind.
        for base, rel in sorted(touched):
            try:
                fd = open_dirs(bases.fd(base), rel)
            except (OSError, WalkRefused):
                continue
            try:
                prune_manifest(fd)
            finally:
                os.close(fd)
    finally:
        bases.close()
    return report
