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
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from genmanip_results.discovery import RunInfo
from genmanip_results.layout import SUBMITTED_FLAG
from genmanip_results.paths import is_within

from .errors import BundleError, IncompleteRunError
from .runs import completeness, results_tree

__all__ = [
    "BUNDLE_FORMAT",
    "FLAG_NAME",
    "MANIFEST_NAME",
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
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)


@dataclass(frozen=True)
class Member:
    """A file that goes into the bundle: ``name`` in the zip, the ``source`` read, its size now."""

    name: str
    source: Path
    size: int


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


def check_member_name(name: str) -> None:
    """Raise :class:`BundleError` unless ``name`` is a safe relative POSIX path for a zip member."""
    problem = None
    if not name:
        problem = "empty name"
    elif name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        problem = "absolute path"
    elif "\\" in name:
        problem = "backslash in the name"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        problem = "control character in the name"
    elif any(seg in ("", ".", "..") for seg in name.split("/")):
        problem = "empty, '.' or '..' path segment"
    else:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            problem = "name is not valid UTF-8"
    if problem:
        raise BundleError(f"unsafe member name {name!r}: {problem}")


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
    return None


def collect_members(
    run_dir: str | os.PathLike[str], *, include_videos: bool = False
) -> tuple[list[Member], list[Skipped]]:
    """The files of ``run_dir`` that go into a bundle (sorted by name), and what was left out.

    Raises:
        BundleError: a file whose name cannot be stored safely, or a top-level ``manifest.json``
            (the bundle's own manifest takes that name).
    """
    root = Path(run_dir).resolve()
    if not root.is_dir():
        raise BundleError(f"{str(run_dir)!r} is not a directory")
    members: list[Member] = []
    skipped: list[Skipped] = []
    stack: list[tuple[str, str]] = [(str(root), "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise BundleError(f"cannot read {directory}: {e.strerror or e}") from e
        for entry in entries:
            name = prefix + entry.name
            if entry.is_symlink():
                target = Path(entry.path).resolve()
                if not is_within(target, root):
                    skipped.append(Skipped(name, "symlink pointing outside the run (not followed)"))
                    continue
                if target.is_dir():
                    skipped.append(Skipped(name, "symlinked directory (not followed)"))
                    continue
                if not target.is_file():
                    skipped.append(Skipped(name, "dangling or special symlink"))
                    continue
                source = target
                is_dir = False
            elif entry.is_dir(follow_symlinks=False):
                source = Path(entry.path)
                is_dir = True
            elif entry.is_file(follow_symlinks=False):
                source = Path(entry.path)
                is_dir = False
            else:
                skipped.append(Skipped(name, "not a regular file"))
                continue
            if is_dir:
                if entry.name.startswith("."):
                    skipped.append(Skipped(name + "/", "hidden"))
                else:
                    stack.append((entry.path, name + "/"))
                continue
            reason = _skip_reason(entry.name, include_videos=include_videos)
            if reason:
                skipped.append(Skipped(name, reason))
                continue
            check_member_name(name)
            if name == MANIFEST_NAME:
                raise BundleError(
                    f"the run has a top-level {MANIFEST_NAME}, which is the bundle manifest's name",
                    hint="rename that file",
                )
            members.append(Member(name, source, source.stat().st_size))
    members.sort(key=lambda m: m.name)
    return members, skipped


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


def _open_nofollow(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError(f"{path} is no longer a regular file")
    return fd


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
    members, skipped = collect_members(run.path, include_videos=include_videos)
    if not members:
        raise BundleError(f"run {run.run_id!r} has no files to bundle ({run.path})")
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
                fd = _open_nofollow(m.source)
                with os.fdopen(fd, "rb") as src, zf.open(zi, "w", force_zip64=m.size >= _ZIP64_AT) as dst:
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


def verify_bundle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a bundle end to end and return its manifest.

    Checks: every member name is safe and unique, no directories or symlinks, ``manifest.json``
    has the expected format, the members are exactly the manifest's files, and every member's size
    and SHA-256 (and the content digest) match.

    Raises:
        BundleError: naming the first problem found.
    """
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise BundleError(f"{path}: not a readable zip file ({e})") from e
    with zf:
        infos = zf.infolist()
        seen: set[str] = set()
        for info in infos:
            check_member_name(info.filename)
            if info.filename in seen:
                raise BundleError(f"{path}: duplicate member {info.filename!r}")
            seen.add(info.filename)
            mode = info.external_attr >> 16
            if info.is_dir() or stat.S_ISLNK(mode):
                raise BundleError(f"{path}: member {info.filename!r} is a directory or symlink")
        if MANIFEST_NAME not in seen:
            raise BundleError(f"{path}: no {MANIFEST_NAME}")
        try:
            manifest = json.loads(zf.read(MANIFEST_NAME))
        except ValueError as e:
            raise BundleError(f"{path}: {MANIFEST_NAME} is not valid JSON ({e})") from e
        if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
            raise BundleError(f"{path}: {MANIFEST_NAME}.format is not {BUNDLE_FORMAT!r}")
        files = manifest.get("files")
        if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str)
            for f in files
        ):
            raise BundleError(f"{path}: {MANIFEST_NAME}.files is not a list of {{path, size, sha256}}")
        listed = {f["path"]: f for f in files}
        members = seen - {MANIFEST_NAME}
        if set(listed) != members:
            extra = sorted(members - set(listed))[:5]
            absent = sorted(set(listed) - members)[:5]
            raise BundleError(f"{path}: members and manifest differ (unlisted: {extra}, absent: {absent})")
        for name, entry in sorted(listed.items()):
            h = hashlib.sha256()
            n = 0
            with zf.open(name) as fh:
                while chunk := fh.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
            if h.hexdigest() != entry["sha256"] or n != entry.get("size"):
                raise BundleError(f"{path}: member {name!r} does not match its manifest hash/size")
        if content_digest(files) != manifest.get("content_sha256"):
            raise BundleError(f"{path}: {MANIFEST_NAME}.content_sha256 does not match the files")
    return manifest
