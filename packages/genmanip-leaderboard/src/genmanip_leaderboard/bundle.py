"""Verified submission bundles: a zip of one run plus a ``manifest.json`` of SHA-256 hashes.

What goes in (paths relative to the run directory):

* every regular file of the run, except hidden files and directories (``.live/``, the
  ``.<name>.<random>.tmp`` files of atomic writes), temporary and lock files (``*.tmp``, ``*.part``,
  ``*~``, ``*.swp``, ``*.lock``, ...), quarantined corrupt files (``*.corrupt-*``), ``compress_*``
  leftovers and ``submitted.flag``;
* videos and Rerun recordings (``.mp4 .avi .mov .mkv .webm .rrd``) only with ``include_videos``;
* a symlink only when it points at a regular file inside the run directory (its content is
  stored under the link's name); symlinked directories are never descended, links that leave the
  run directory are never followed. Nothing that is not a regular file (FIFOs, sockets) is read.

Every member name is checked (no absolute paths, no ``.``/``..`` segments, no backslashes or
control characters), files are opened with ``O_NOFOLLOW``, and the hash of each member is taken
from exactly the bytes written into the zip. :func:`verify_bundle` re-reads a zip and checks all
of it against its manifest before anything is uploaded.

The zip is written next to its final path as a hidden temporary file and renamed into place, and
never inside the run's results tree.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import secrets
import stat
import struct
import sys
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from genmanip_protocol.errors import GenmanipError
from genmanip_results.discovery import RunInfo
from genmanip_results.fdwalk import (
    DirListing,
    Entry,
    Ident,
    WalkRefused,
    ident,
    kind_of,
    lstat_at,
    open_dirs,
    open_file_in,
    open_top,
    walk,
)
from genmanip_results.layout import (
    FRAME_STORE_SUFFIX,
    PROGRESS_JSON,
    RESULT_JSON,
    RUN_JSON,
    SUBMITTED_FLAG,
)
from genmanip_results.paths import is_within

from .errors import (
    BundleCorruptError,
    BundleError,
    BundleManifestError,
    BundleMemberNameError,
    BundleMismatchError,
    BundleSourceChangedError,
    BundleTooLargeError,
    BundleUnsupportedError,
    IncompleteRunError,
)
from .runs import Completeness, completeness, results_tree

__all__ = [
    "BUNDLE_FORMAT",
    "FLAG_NAME",
    "MANIFEST_NAME",
    "MAX_BUNDLE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_MANIFEST_BYTES",
    "VIDEO_SUFFIXES",
    "Bundle",
    "Member",
    "Skipped",
    "build_bundle",
    "bundle_filename",
    "check_member_name",
    "collect_members",
    "content_digest",
    "default_bundle_dir",
    "file_sha256",
    "verify_bundle",
    "verify_zip",
]

BUNDLE_FORMAT = "genmanip-bundle/1"
MANIFEST_NAME = "manifest.json"
FLAG_NAME = SUBMITTED_FLAG
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".rrd")
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", ".swo", ".lock", ".lck", "~")
# Already-compressed formats: deflating them again costs CPU for nothing.
_STORED_SUFFIXES = frozenset((*VIDEO_SUFFIXES, ".zip", ".gz", ".xz", ".bz2", ".zst", ".png", ".jpg", ".jpeg", ".npz"))
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_CHUNK = 1 << 20
_ZIP64_AT = 1 << 31
#: :func:`verify_bundle` refuses a zip whose members declare more uncompressed bytes in all.
MAX_BUNDLE_BYTES = 1 << 40
#: ... and a ``manifest.json`` larger than this (it is read into memory).
MAX_MANIFEST_BYTES = 64 << 20
#: ... and a ``manifest.json`` nested deeper than this (a bundle's is 4 levels, plus run.json).
MAX_JSON_DEPTH = 64
# Deflate cannot expand data more than ~1032:1; a member declaring more is lying (a zip bomb).
_MAX_DEFLATE_RATIO = 1032
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_ENCRYPTED = 0x1
_LOCAL_HEADER = 30  # the fixed part of a zip local file header
_SHA256 = re.compile(r"[0-9a-f]{64}")
# What zipfile's parser raises on hostile input besides BadZipFile: a truncated or inconsistent
# structure surfaces as any of these, all meaning "this zip is damaged" (never a gmp bug).
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    struct.error,
    ValueError,
    KeyError,
    IndexError,
    OverflowError,
    zlib.error,
)


@dataclass(frozen=True)
class Member:
    """A file that goes into the bundle: ``name`` in the zip, the ``source`` read, its size now.

    ``rel`` is the file read, below the run directory (for a symlink member: its target's), and
    ``ident`` its ``(dev, ino)`` when listed: the bundle reads exactly that file, opened by
    descriptor from the run directory without following a symlink anywhere on the way."""

    name: str
    source: Path
    size: int
    rel: tuple[str, ...] = ()
    ident: Ident | None = None


@dataclass(frozen=True)
class Skipped:
    """A path of the run left out of the bundle and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Bundle:
    """A written and verified bundle.

    Attributes:
        path: the zip file.
        sha256: SHA-256 of the zip file (hex).
        content_sha256: SHA-256 over the members' hashes and names (hex): identical for an
            unchanged run however often it is bundled (the zip itself differs by its timestamp).
        size: zip size in bytes.
        manifest: the ``manifest.json`` stored in the zip.
        skipped: files of the run that were left out, with the reason.
    """

    path: Path
    sha256: str
    content_sha256: str
    size: int
    manifest: dict[str, Any]
    skipped: tuple[Skipped, ...] = field(default=())


def _name_problem(name: str) -> str | None:
    """Why ``name`` is not a safe relative POSIX path for a zip member, or None."""
    if not name:
        return "empty name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if "\\" in name:
        return "backslash in the name"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "control character in the name"
    if any(seg in ("", ".", "..") for seg in name.split("/")):
        return "empty, '.' or '..' path segment"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    return None


def check_member_name(name: str) -> None:
    """Raise :class:`~genmanip_leaderboard.errors.BundleMemberNameError` (a :class:`BundleError`)
    unless ``name`` is a safe relative POSIX path for a zip member."""
    problem = _name_problem(name)
    if problem:
        err = BundleMemberNameError("", f"unsafe member name {name!r}: {problem}")
        err.member = name
        raise err


def _skip_reason(name: str, *, include_videos: bool) -> str | None:
    if name.startswith("."):
        return "hidden"
    low = name.lower()
    if name == FLAG_NAME:
        return "submission marker"
    if low.endswith(_TEMP_SUFFIXES):
        return "temporary or lock file"
    if ".corrupt-" in low:
        return "quarantined corrupt file"
    if name.startswith("compress_"):
        return "leftover of a compression"
    if not include_videos and low.endswith(VIDEO_SUFFIXES):
        return "video/recording (use --include-videos)"
    if name.endswith(FRAME_STORE_SUFFIX):
        # (gmp eval --transcode deferred): with --include-videos its mp4 is made and bundled
        return "JPEG frame store (its mp4 goes in with --include-videos)"
    return None


def _link_target(
    root_fd: int, root_real: str, listing: DirListing, e: Entry
) -> tuple[tuple[str, ...], os.stat_result] | str:
    """The file a symlink of the run points at, as ``(parts below the run, lstat)``, or why it
    is left out. The target is only *named* here (its text); it is then looked up from the run's
    descriptor one directory at a time without following anything, so only a regular file really
    inside the run qualifies — no chain of links, no directory."""
    try:
        target = os.readlink(e.name, dir_fd=listing.fd)
    except OSError:
        return "dangling or special symlink"
    if os.path.isabs(target):
        full = os.path.join(os.path.realpath(os.path.dirname(target)), os.path.basename(target))
        rel = os.path.relpath(full, root_real)
        if rel == os.curdir:
            return "symlinked directory (not followed)"
        parts: list[str] = rel.split(os.sep)
        if parts[0] == os.pardir:
            return "symlink pointing outside the run (not followed)"
    else:
        parts = list(listing.rel)
        own = False  # a '..' after a segment of the target itself could skip a symlink
        for seg in target.split("/"):
            if seg in ("", "."):
                continue
            if seg == "..":
                if own:
                    return "symlink through '..' inside its target (not followed)"
                if not parts:
                    return "symlink pointing outside the run (not followed)"
                parts.pop()
            else:
                parts.append(seg)
                own = True
        if not parts:
            return "symlinked directory (not followed)"
    try:
        parent = open_dirs(root_fd, parts[:-1])
    except WalkRefused:
        return "symlink through another symlink (not followed)"
    except OSError:
        return "dangling or special symlink"
    try:
        st = lstat_at(parent, parts[-1])
    except OSError:
        return "dangling or special symlink"
    finally:
        os.close(parent)
    kind = kind_of(st)
    if kind == "dir":
        return "symlinked directory (not followed)"
    if kind == "symlink":
        return "symlink to another symlink (not followed)"
    if kind != "file":
        return "dangling or special symlink"
    return tuple(parts), st


def _root_real(root_fd: int, root: Path) -> str:
    """The real path of the run directory held by ``root_fd`` (used to read link targets)."""
    real = os.path.realpath(root)
    try:
        same = ident(os.stat(real)) == ident(os.fstat(root_fd))
    except OSError:
        same = False
    if not same:
        raise BundleSourceChangedError(str(root), "the run directory was replaced")
    return real


def _collect(
    root_fd: int, root: Path, *, include_videos: bool
) -> tuple[list[Member], list[Skipped]]:
    root_real = _root_real(root_fd, root)
    members: list[Member] = []
    skipped: list[Skipped] = []

    def on_skip(rel: tuple[str, ...], reason: str) -> None:
        # A directory of the run that cannot be entered: the bundle would silently lack it.
        name = "/".join(rel)
        if "replaced" in reason or "symlink" in reason:
            raise BundleSourceChangedError(name + "/", reason)
        raise BundleError(f"cannot read {root / name}: {reason}")

    def descend(e: Entry) -> bool:
        return not e.name.startswith(".")

    for listing in walk(root_fd, descend=descend, on_skip=on_skip):
        prefix = "".join(p + "/" for p in listing.rel)
        for e in listing.entries:
            name = prefix + e.name
            kind = e.kind
            if kind == "symlink":
                found = _link_target(root_fd, root_real, listing, e)
                if isinstance(found, str):
                    skipped.append(Skipped(name, found))
                    continue
                rel, st = found
            elif kind == "dir":
                if e.name.startswith("."):
                    skipped.append(Skipped(name + "/", "hidden"))
                continue
            elif kind == "file":
                rel, st = e.rel, e.st
            else:
                skipped.append(Skipped(name, "not a regular file"))
                continue
            reason = _skip_reason(e.name, include_videos=include_videos)
            if reason:
                skipped.append(Skipped(name, reason))
                continue
            check_member_name(name)
            if name == MANIFEST_NAME:
                raise BundleError(
                    f"the run has a top-level {MANIFEST_NAME}, which is the bundle manifest's name",
                    hint="rename that file",
                )
            members.append(Member(name, root.joinpath(*rel), st.st_size, rel=rel, ident=ident(st)))
    members.sort(key=lambda m: m.name)
    return members, skipped


def _check_run_present(run: RunInfo, members: list[Member]) -> None:
    """What discovery read the run from must be in the bundle: the run's metric file or
    ``run.json``, and every complete episode (its result file is never left out by name). One
    missing was swapped for a symlink (or replaced) after the run was read, and the manifest
    would call the run complete without its files."""
    names = {m.name for m in members}
    # The run-level files discovery read the run from (never left out by name either).
    if run.manifest is not None and RUN_JSON not in names:
        raise BundleSourceChangedError(RUN_JSON, "is not a file of the run any more (a symlink now?)")
    # A client run's metric may come from run.json's "metric" (gmp online run writes it there).
    metric_in_manifest = run.manifest is not None and isinstance(run.manifest.get("metric"), dict)
    if run.metric and not metric_in_manifest and not names & {RESULT_JSON, PROGRESS_JSON}:
        raise BundleSourceChangedError(
            RESULT_JSON, "is not a file of the run any more (a symlink now?)"
        )
    dirs = {m.name.rsplit("/", 1)[0] for m in members if "/" in m.name}
    base = os.path.abspath(run.path)
    for e in run.episodes:
        if not e.complete:
            continue
        rel = os.path.relpath(os.path.abspath(e.path), base).replace(os.sep, "/")
        if rel not in dirs:
            raise BundleSourceChangedError(
                rel, "is not a directory of the run any more (a symlink now?), its files were not read"
            )


def collect_members(
    run_dir: str | os.PathLike[str], *, include_videos: bool = False
) -> tuple[list[Member], list[Skipped]]:
    """The files of ``run_dir`` that go into a bundle (sorted by name), and what was left out.

    The run is walked by directory descriptor (:func:`genmanip_results.fdwalk.walk`): no symlink
    is followed and a directory swapped while walking is never entered.

    Raises:
        BundleError: a file whose name cannot be stored safely, or a top-level ``manifest.json``
            (the bundle's own manifest takes that name); its subclass
            BundleSourceChangedError when the run changed under the walk.
    """
    root = Path(run_dir)
    try:
        fd = open_top(root)
    except OSError as exc:
        raise BundleError(f"{str(run_dir)!r} is not a directory") from exc
    try:
        return _collect(fd, Path(os.path.abspath(root)), include_videos=include_videos)
    finally:
        os.close(fd)


def content_digest(files: Iterable[dict[str, Any]]) -> str:
    """SHA-256 over ``"<sha256>  <path>\\n"`` lines of the members sorted by path (``sha256sum`` style)."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: str(f["path"])):
        h.update(f"{f['sha256']}  {f['path']}\n".encode())
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def default_bundle_dir() -> Path:
    """``$XDG_CACHE_HOME/genmanip/bundles`` (default ``~/.cache/genmanip/bundles``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "genmanip" / "bundles"


def bundle_filename(run_id: str) -> str:
    """``results_<run_id>.zip`` with every character outside ``[A-Za-z0-9._-]`` replaced by ``_``."""
    return "results_" + re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._") + ".zip"


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        if name.lower().replace("_", "-").startswith("genmanip"):
            out[name] = dist.version
    # Source checkouts (packages on sys.path, not installed) have no metadata: the two packages
    # that wrote this bundle still say their versions.
    from genmanip_protocol import __version__ as protocol_version

    from .__about__ import __version__

    out.setdefault("genmanip-protocol", protocol_version)
    out.setdefault("genmanip-leaderboard", __version__)
    return dict(sorted(out.items()))


def _open_member(root_fd: int, m: Member) -> int:
    """Open the file of ``m`` from the run's descriptor: every directory with ``O_NOFOLLOW``
    relative to its parent, the file with ``O_NOFOLLOW`` and ``fstat``-ed to be the regular
    file that was listed. Anything else is :class:`BundleSourceChangedError`, never read."""
    try:
        return open_file_in(root_fd, m.rel, expect=m.ident)
    except WalkRefused as exc:
        raise BundleSourceChangedError(m.name, exc.reason) from exc
    except OSError as exc:
        raise BundleSourceChangedError(m.name, f"cannot be opened ({exc.strerror or exc})") from exc


def _task_summary(run: RunInfo) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for task, eps in sorted(run.tasks().items()):
        done = [e for e in eps if e.complete]
        scores = [e.score for e in done if e.score is not None]
        out[task] = {
            "episodes": len(eps),
            "complete": len(done),
            "successes": sum(1 for e in done if e.success),
            "mean_score": sum(scores) / len(scores) if scores else None,
        }
    return out


def _resolve_out(run: RunInfo, out: str | os.PathLike[str] | None) -> Path:
    name = bundle_filename(run.run_id)
    if out is None:
        target = default_bundle_dir() / re.sub(r"[^A-Za-z0-9._-]+", "_", run.benchmark) / name
    else:
        target = Path(out).expanduser()
        if target.is_dir() or str(out).endswith(("/", os.sep)):
            target = target / name
    target = target.absolute()
    tree = results_tree(run)
    # Only where the zip's directory really is matters: the zip is renamed into place, so a
    # symlink already at the target is replaced, never written through.
    if is_within(target.parent, tree) or is_within(target.parent, run.path):
        raise BundleError(
            f"refusing to write the bundle inside the results tree ({tree}): {target}",
            hint="choose --out outside it (the default is a cache directory)",
        )
    return target


def build_bundle(
    run: RunInfo,
    out: str | os.PathLike[str] | None = None,
    *,
    include_videos: bool = False,
    allow_incomplete: bool = False,
) -> Bundle:
    """Zip ``run`` with its manifest, verify the result and return it.

    ``out`` is the zip path or a directory (default: :func:`default_bundle_dir`
    ``/<benchmark>/results_<run_id>.zip``); it must lie outside the run's results tree.

    Raises:
        IncompleteRunError: unfinished or missing episodes (listed) and not ``allow_incomplete``.
        BundleError: an episode without a valid score, an unsafe file name, an output path inside
            the results tree, or a failed verification.
    """
    comp = completeness(run)
    if not comp.is_complete and not allow_incomplete:
        if comp.complete == 0 and not comp.missing:
            raise IncompleteRunError(run.run_id, ["(no episodes at all)"])
        raise IncompleteRunError(
            run.run_id,
            list(comp.missing),
            hint="finish the run (resume it with the same run id) or pass --allow-incomplete",
        )
    bad = [
        f"{e.task_name}/{e.seed} (score {e.score!r})"
        for e in run.episodes
        if e.complete and (e.score is None or not (0.0 <= e.score <= 1.0))
    ]
    if bad:
        raise BundleError(
            f"run {run.run_id!r} has episodes without a valid score in [0, 1]: {', '.join(bad[:10])}"
        )
    target = _resolve_out(run, out)
    if include_videos:
        _make_videos(run)
    try:
        root_fd = open_top(run.path)
    except OSError as exc:
        raise BundleError(f"{str(run.path)!r} is not a directory") from exc
    try:
        return _build(run, comp, root_fd, target, out, include_videos=include_videos)
    finally:
        os.close(root_fd)


def _make_videos(run: RunInfo) -> None:
    """Make the H.264 mp4 of every camera of a finished episode that has only its JPEG frame store
    (:func:`genmanip_results.frames.ensure_video`: atomic, under the episode's lock), so that
    ``--include-videos`` bundles browser-playable videos whatever ``--transcode`` recorded."""
    from genmanip_results.frames import ensure_video, episode_streams

    for ep in run.episodes:
        if not ep.complete:
            continue
        for cam, stream in episode_streams(ep.path).items():
            if stream.video is None and stream.store is not None:
                try:
                    ensure_video(ep.path, cam, within=run.path, nice=10)
                except GenmanipError as exc:
                    raise BundleError(f"{ep.task_name}/{ep.seed}: cannot make {cam}.mp4: {exc}") from exc


def _build(
    run: RunInfo,
    comp: Completeness,
    root_fd: int,
    target: Path,
    out: str | os.PathLike[str] | None,
    *,
    include_videos: bool,
) -> Bundle:
    # One descriptor of the run for listing and reading: every member is opened relative to it.
    members, skipped = _collect(
        root_fd, Path(os.path.abspath(run.path)), include_videos=include_videos
    )
    if not members:
        raise BundleError(f"run {run.run_id!r} has no files to bundle ({run.path})")
    _check_run_present(run, members)
    if out is None:
        # gmp's cache directory, tagged as gmp's when this creates it (gmp clean checks the tag).
        from genmanip_results.provenance import ensure_cache_dir

        ensure_cache_dir(default_bundle_dir().parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.part"
    files: list[dict[str, Any]] = []
    total_bytes = 0
    try:
        with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
            for m in members:
                zi = zipfile.ZipInfo(m.name, date_time=_ZIP_EPOCH)
                suffix = os.path.splitext(m.name)[1].lower()
                zi.compress_type = zipfile.ZIP_STORED if suffix in _STORED_SUFFIXES else zipfile.ZIP_DEFLATED
                zi.external_attr = (stat.S_IFREG | 0o644) << 16
                h = hashlib.sha256()
                n = 0
                fd = _open_member(root_fd, m)
                # The size now (not when listed): a file that grew past 2 GiB needs zip64.
                size_now = os.fstat(fd).st_size
                with os.fdopen(fd, "rb") as src, zf.open(zi, "w", force_zip64=max(m.size, size_now) >= _ZIP64_AT) as dst:
                    while chunk := src.read(_CHUNK):
                        h.update(chunk)
                        dst.write(chunk)
                        n += len(chunk)
                files.append({"path": m.name, "size": n, "sha256": h.hexdigest()})
                total_bytes += n
            digest = content_digest(files)
            episodes = run.episodes
            manifest: dict[str, Any] = {
                "format": BUNDLE_FORMAT,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "benchmark": run.benchmark,
                "run_id": run.run_id,
                "layout": run.layout,
                "complete": comp.is_complete,
                "missing": list(comp.missing),
                "include_videos": include_videos,
                "counts": {
                    "files": len(files),
                    "bytes": total_bytes,
                    "episodes": len(episodes),
                    "episodes_complete": comp.complete,
                    "episodes_expected": comp.expected,
                    "episodes_success": sum(1 for e in episodes if e.complete and e.success),
                    "tasks": len(run.tasks()),
                },
                "success_rate": run.success_rate,
                "mean_score": run.mean_score,
                "tasks": _task_summary(run),
                "run_manifest": run.manifest,
                "versions": _versions(),
                "python": platform.python_version(),
                "platform": sys.platform,
                "content_sha256": digest,
                "files": files,
            }
            mi = zipfile.ZipInfo(MANIFEST_NAME, date_time=_ZIP_EPOCH)
            mi.compress_type = zipfile.ZIP_DEFLATED
            mi.external_attr = (stat.S_IFREG | 0o644) << 16
            zf.writestr(mi, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
        verified = verify_bundle(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Bundle(
        path=target,
        sha256=file_sha256(target),
        content_sha256=str(verified["content_sha256"]),
        size=target.stat().st_size,
        manifest=verified,
        skipped=tuple(skipped),
    )


def _check_structure(p: str, infos: list[zipfile.ZipInfo], start_dir: int | None, max_bytes: int) -> None:
    """Everything about the members that can be checked without decompressing a byte: names,
    duplicates, kinds, methods, encryption, declared sizes (against the limit and against what
    their compressed data can expand to) and that no member's data overlaps another's."""
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        if info.orig_filename != name:
            # zipfile cuts a name at its first NUL: "a\x00../../x" would pass as "a".
            raise BundleMemberNameError(
                p, "unsafe member name: NUL or separator in the stored name",
                member=info.orig_filename,
            )  # fmt: skip
        problem = _name_problem(name)
        if problem:
            raise BundleMemberNameError(p, f"unsafe member name: {problem}", member=name)
        if name in seen:
            raise BundleMemberNameError(p, "duplicate member name", member=name)
        seen.add(name)
        mode = info.external_attr >> 16
        if info.is_dir() or stat.S_ISLNK(mode):
            raise BundleUnsupportedError(p, "is a directory or symlink", member=name)
        if info.flag_bits & _ENCRYPTED:
            raise BundleUnsupportedError(p, "is encrypted (gmp bundles never are)", member=name)
        if info.compress_type not in _ZIP_METHODS:
            raise BundleUnsupportedError(
                p, f"unknown compression method {info.compress_type} (only stored or deflate)",
                member=name,
            )  # fmt: skip
        if info.file_size > max_bytes:
            raise BundleTooLargeError(
                p, f"declares {info.file_size} uncompressed bytes, more than the limit {max_bytes}",
                member=name,
            )  # fmt: skip
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise BundleCorruptError(
                p, f"stored member with {info.compress_size} compressed but {info.file_size} "
                "uncompressed bytes", member=name,
            )  # fmt: skip
        if info.file_size > info.compress_size * _MAX_DEFLATE_RATIO + 1024:
            raise BundleTooLargeError(
                p, f"declares {info.file_size} bytes from {info.compress_size} compressed: more "
                "than deflate can expand to (a zip bomb)", member=name,
            )  # fmt: skip
        total += info.file_size
        if total > max_bytes:
            raise BundleTooLargeError(
                p, f"members declare more than {max_bytes} uncompressed bytes in all"
            )
    # Each member's data must end before the next member (and the central directory) begins:
    # entries sharing or overlapping data are the non-recursive zip bomb.
    spans = sorted(infos, key=lambda i: i.header_offset)
    for a, b in zip(spans, [*spans[1:], None], strict=True):
        end = a.header_offset + _LOCAL_HEADER + a.compress_size
        limit = b.header_offset if b is not None else start_dir
        if limit is not None and end > limit:
            raise BundleCorruptError(
                p, "its data overlaps the next member or the central directory", member=a.filename
            )


def _read_member(p: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """The decompressed chunks of a (structure-checked) member, at most its declared size; every
    failure is a typed error naming the member."""
    name = info.filename
    n = 0
    try:
        with zf.open(info) as fh:
            while chunk := fh.read(_CHUNK):
                n += len(chunk)
                if n > info.file_size:  # zipfile stops at the declared size; never trust that
                    raise BundleTooLargeError(p, "expands past its declared size", member=name)
                yield chunk
    except BundleTooLargeError:
        raise
    except zipfile.BadZipFile as exc:
        what = "bad CRC-32 (damaged data)" if "CRC" in str(exc) else f"damaged ({exc})"
        raise BundleCorruptError(p, what, member=name) from exc
    except zlib.error as exc:
        raise BundleCorruptError(p, f"corrupt deflate stream ({exc})", member=name) from exc
    except EOFError as exc:
        raise BundleCorruptError(p, "truncated data", member=name) from exc
    except NotImplementedError as exc:
        raise BundleUnsupportedError(p, f"cannot be decompressed ({exc})", member=name) from exc
    except RuntimeError as exc:  # zipfile: "File ... is encrypted, password required"
        raise BundleUnsupportedError(p, f"cannot be read ({exc})", member=name) from exc
    except OSError as exc:
        raise BundleCorruptError(p, f"cannot be read ({exc.strerror or exc})", member=name) from exc
    except _ZIP_ERRORS as exc:
        raise BundleCorruptError(p, f"damaged ({exc!r})", member=name) from exc


def _json_depth(obj: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value)
    return deepest


def _load_manifest(p: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> dict[str, Any]:
    if info.file_size > MAX_MANIFEST_BYTES:
        raise BundleTooLargeError(
            p, f"{info.file_size} bytes, more than the limit {MAX_MANIFEST_BYTES}",
            member=MANIFEST_NAME,
        )  # fmt: skip
    data = b"".join(_read_member(p, zf, info))
    try:
        manifest = json.loads(data.decode("utf-8"))
    except RecursionError as exc:
        raise BundleManifestError(
            p, f"nested deeper than {MAX_JSON_DEPTH} levels", member=MANIFEST_NAME
        ) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleManifestError(p, f"is not valid JSON ({exc})", member=MANIFEST_NAME) from exc
    if _json_depth(manifest) > MAX_JSON_DEPTH:
        raise BundleManifestError(
            p, f"nested deeper than {MAX_JSON_DEPTH} levels", member=MANIFEST_NAME
        )
    if not isinstance(manifest, dict):
        raise BundleManifestError(p, "is not a JSON object", member=MANIFEST_NAME)
    return manifest


def _manifest_files(p: str, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``manifest["files"]`` checked field by field, by path."""

    def bad(field: str, problem: str) -> BundleManifestError:
        return BundleManifestError(p, problem, member=MANIFEST_NAME, field=field)

    if manifest.get("format") != BUNDLE_FORMAT:
        raise bad("format", f"expected {BUNDLE_FORMAT!r}, got {manifest.get('format')!r:.80}")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise bad("files", "expected a list of {path, size, sha256}")
    listed: dict[str, dict[str, Any]] = {}
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise bad(f"files[{i}]", "expected an object {path, size, sha256}")
        path, size, sha = f.get("path"), f.get("size"), f.get("sha256")
        if not isinstance(path, str):
            raise bad(f"files[{i}].path", "expected a string")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise bad(f"files[{i}].size", f"expected a non-negative integer, got {size!r:.40}")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise bad(f"files[{i}].sha256", "expected 64 lowercase hex digits")
        if path in listed:
            raise bad(f"files[{i}].path", f"{path!r:.80} is listed twice")
        listed[path] = f
    if not isinstance(manifest.get("content_sha256"), str):
        raise bad("content_sha256", "expected a string")
    return listed


def _open_zip(p: str, source: str | os.PathLike[str] | IO[bytes]) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(source)
    except OSError as exc:
        raise BundleCorruptError(p, f"cannot be read ({exc.strerror or exc})") from exc
    except (*_ZIP_ERRORS, NotImplementedError, RuntimeError) as exc:
        raise BundleCorruptError(p, f"not a readable zip file ({exc})") from exc


def _checked_infos(p: str, zf: zipfile.ZipFile, max_bytes: int) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    start_dir = getattr(zf, "start_dir", None)
    _check_structure(p, infos, start_dir if isinstance(start_dir, int) else None, max_bytes)
    return infos


def verify_zip(
    source: str | os.PathLike[str] | IO[bytes],
    *,
    max_bytes: int = MAX_BUNDLE_BYTES,
    name: str | None = None,
) -> list[zipfile.ZipInfo]:
    """The checks of :func:`verify_bundle` that hold for any zip, gmp bundle or not (no manifest
    needed): member names, kinds, methods, encryption, declared sizes within ``max_bytes`` and
    what the compressed data can expand to, no overlapping members (all before decompressing a
    byte), then every member read in full (CRC-32, size bounded by its declaration).

    ``source`` is a path or a seekable binary file (an upload); ``name`` is how errors name the zip
    (default: the path). Returns the members. Raises the :class:`BundleVerifyError` tree, as
    :func:`verify_bundle`.
    """
    if name is not None:
        p = name
    else:
        p = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "zip"
    with _open_zip(p, source) as zf:
        infos = _checked_infos(p, zf, max_bytes)
        for info in infos:
            for _chunk in _read_member(p, zf, info):
                pass
    return infos


def verify_bundle(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_BUNDLE_BYTES
) -> dict[str, Any]:
    """Check a bundle end to end and return its manifest.

    Checks, before anything is decompressed: every member name is safe and unique, no
    directories, symlinks, encrypted members or methods other than stored/deflate, declared sizes
    within ``max_bytes`` (:data:`MAX_BUNDLE_BYTES` in all) and within what the compressed data can
    expand to, no overlapping members, and each member's declared size is its manifest size.
    Then ``manifest.json`` (at most :data:`MAX_MANIFEST_BYTES`, nested at most
    :data:`MAX_JSON_DEPTH` levels) field by field, the members are exactly the manifest's files,
    and every member's bytes (CRC, size, SHA-256) and the content digest match.

    Raises:
        BundleVerifyError: naming the first problem, with the member and manifest field: its
            subclasses BundleCorruptError, BundleUnsupportedError, BundleManifestError,
            BundleMismatchError (exit 4), BundleMemberNameError and BundleTooLargeError (exit 9).
    """
    p = os.fspath(path)
    with _open_zip(p, path) as zf:
        infos = _checked_infos(p, zf, max_bytes)
        by_name = {i.filename: i for i in infos}
        if MANIFEST_NAME not in by_name:
            raise BundleManifestError(p, f"no {MANIFEST_NAME}")
        manifest = _load_manifest(p, zf, by_name[MANIFEST_NAME])
        listed = _manifest_files(p, manifest)
        members = set(by_name) - {MANIFEST_NAME}
        if set(listed) != members:
            extra = sorted(members - set(listed))[:5]
            absent = sorted(set(listed) - members)[:5]
            raise BundleMismatchError(
                p, f"members and manifest differ (unlisted: {extra}, absent: {absent})"
            )
        for name, entry in sorted(listed.items()):
            info = by_name[name]
            if info.file_size != entry["size"]:
                # Bounded before reading: a member is read only up to the size the manifest says.
                raise BundleMismatchError(
                    p, f"does not match its manifest entry: {info.file_size} bytes in the zip, "
                    f"{entry['size']} in {MANIFEST_NAME}", member=name,
                )  # fmt: skip
            h = hashlib.sha256()
            for chunk in _read_member(p, zf, info):
                h.update(chunk)
            if h.hexdigest() != entry["sha256"]:
                raise BundleMismatchError(
                    p, "does not match its manifest hash", member=name, field="sha256"
                )
        if content_digest(listed.values()) != manifest.get("content_sha256"):
            raise BundleMismatchError(
                p, "does not match the files", member=MANIFEST_NAME, field="content_sha256"
            )
    return manifest
