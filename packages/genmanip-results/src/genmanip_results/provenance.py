"""Provenance of generated files: how ``gmp clean`` can *prove* a file is gmp's before deleting it.

A name proves nothing: a user's folder may hold a ``state_plot.png`` or an ``old.tmp`` of their
own. So every writer of a generated file leaves evidence at creation, and cleanup deletes only
what the evidence covers:

* **generated files** (plots, plot logs, overlay videos, viewer caches and their sidecars) are
  registered in a per-directory manifest, :data:`~genmanip_results.layout.GENERATED_MANIFEST`
  (``.gmp-generated.jsonl``): right after writing a file, the writer appends one JSON line
  ``{"v": 1, "name", "category", "ino", "size", "mtime_ns", "by"}`` (:func:`register_generated`,
  or :func:`write_generated` = atomic write + register). A file is gmp's when the newest record
  of its name has its category and the file is still that inode with that size and mtime
  (:meth:`Manifest.proves`): a user's file of the same name, a copy, or a gmp file the user has
  since rewritten is *not* proven and is kept. Partial files (``*.part`` of a video or
  recording being written) are registered *before* they are created (:func:`register_partial`):
  a partial is proven when it is not older than its record.
* **gmp's cache directory** carries a Cache Directory Tag,
  :data:`~genmanip_results.layout.CACHE_DIR_TAG`, with a gmp line after the standard signature,
  written when gmp creates the directory (:func:`ensure_cache_dir`; checked by
  :func:`is_gmp_cache_dir`).
* **temporary files** of :mod:`genmanip_runtime.atomic` are named ``.<name>.<12 hex>.tmp``
  (:func:`is_gmp_tmp_name`); only those, only inside results trees, may be cleaned as stale.

The manifest is appended with ``O_APPEND`` (one ``write`` per registration, so concurrent writers
never interleave a line) and compacted when it grows past :data:`COMPACT_AT` bytes. Every failure
mode errs toward *keeping* files: an unreadable, oversized or torn manifest proves less, never
more. Readers take a directory descriptor (:mod:`genmanip_results.fdwalk`) and never follow a
symlink.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fdwalk import lstat_at, read_file_at
from .layout import CACHE_DIR_TAG, GENERATED_MANIFEST

__all__ = [
    "CACHE_TAG_SIGNATURE",
    "CATEGORY_PLOTS",
    "CATEGORY_VIDEOS",
    "CATEGORY_VIEWER_CACHE",
    "COMPACT_AT",
    "MAX_MANIFEST_BYTES",
    "GeneratedRecord",
    "Manifest",
    "ensure_cache_dir",
    "is_gmp_cache_dir",
    "is_gmp_tmp_name",
    "prune_manifest",
    "read_manifest",
    "register_generated",
    "register_partial",
    "write_generated",
]

#: Categories a record may carry (``gmp clean``'s category names).
CATEGORY_PLOTS = "plots"
CATEGORY_VIEWER_CACHE = "viewer-cache"
#: H.264 videos made from an episode's JPEG frame store (:func:`genmanip_results.frames.ensure_video`):
#: remakeable from the store, so ``gmp clean --videos`` may remove them while the store is there.
CATEGORY_VIDEOS = "videos"

#: A manifest larger than this is not read at all (it proves nothing: files are kept).
MAX_MANIFEST_BYTES = 4 << 20
#: A registration that leaves the manifest larger than this compacts it (one record per name).
COMPACT_AT = 256 << 10

#: First line of every Cache Directory Tag (https://bford.info/cachedir/).
CACHE_TAG_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
# The line that makes a tag gmp's: other tools write tags too (a tag alone proves "a cache",
# not "gmp's cache").
_CACHE_TAG_OWNER = "# genmanip-cache: 1"
_CACHE_TAG_TEXT = (
    f"{CACHE_TAG_SIGNATURE}\n"
    "# This file is a cache directory tag created by genmanip (gmp).\n"
    f"{_CACHE_TAG_OWNER}\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)

# genmanip_runtime.atomic's temporary: f".{target.name}.{secrets.token_hex(6)}.tmp".
_ATOMIC_TMP = re.compile(r"\.[^/\x00]+\.[0-9a-f]{12}\.tmp")
# A partial's mtime may be up to this much older than its record (coarse file-system clocks).
_PARTIAL_SLACK_NS = 2_000_000_000
_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_O_APPEND = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO planted under the manifest's name must not block
    | getattr(os, "O_CLOEXEC", 0)
)


def is_gmp_tmp_name(name: str) -> bool:
    """True for the name of a :mod:`genmanip_runtime.atomic` temporary: ``.<name>.<12 hex>.tmp``."""
    return _ATOMIC_TMP.fullmatch(name) is not None


@dataclass(frozen=True)
class GeneratedRecord:
    """One manifest record: ``name`` (in the manifest's directory) was written by ``by`` as a
    ``category`` file. A complete file is identified by ``ino``/``size``/``mtime_ns``; a partial
    (registered before it was created) by ``t_ns``, the registration time."""

    name: str
    category: str
    by: str
    ino: int | None = None
    size: int | None = None
    mtime_ns: int | None = None
    partial: bool = False
    t_ns: int | None = None

    def proves(self, st: os.stat_result) -> bool:
        """True when ``st`` (an ``lstat``) is the file this record describes."""
        if not stat.S_ISREG(st.st_mode):
            return False
        if self.partial:
            return self.t_ns is not None and st.st_mtime_ns >= self.t_ns - _PARTIAL_SLACK_NS
        return (st.st_ino, st.st_size, st.st_mtime_ns) == (self.ino, self.size, self.mtime_ns)


@dataclass
class Manifest:
    """The records of one directory's manifest, newest per name (:func:`read_manifest`)."""

    records: dict[str, GeneratedRecord] = field(default_factory=dict)

    def proves(self, name: str, st: os.stat_result, category: str) -> bool:
        """True when ``name``'s newest record has ``category`` and describes ``st``."""
        rec = self.records.get(name)
        return rec is not None and rec.category == category and rec.proves(st)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _parse(line: bytes) -> GeneratedRecord | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # a torn or hostile line proves nothing
        return None
    if not isinstance(obj, dict) or obj.get("v") != 1:
        return None
    name, category, by = obj.get("name"), obj.get("category"), obj.get("by", "")
    if not (isinstance(name, str) and isinstance(category, str) and isinstance(by, str)):
        return None
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        return None
    if obj.get("partial") is True:
        t_ns = _int(obj.get("t_ns"))
        return None if t_ns is None else GeneratedRecord(name, category, by, partial=True, t_ns=t_ns)
    ino, size, mtime_ns = _int(obj.get("ino")), _int(obj.get("size")), _int(obj.get("mtime_ns"))
    if ino is None or size is None or mtime_ns is None:
        return None
    return GeneratedRecord(name, category, by, ino=ino, size=size, mtime_ns=mtime_ns)


def read_manifest(dir_fd: int) -> Manifest:
    """The manifest of the directory ``dir_fd`` (empty when there is none, or it is a symlink,
    not a regular file, or larger than :data:`MAX_MANIFEST_BYTES`). Bad lines are skipped."""
    data = read_file_at(dir_fd, GENERATED_MANIFEST, limit=MAX_MANIFEST_BYTES)
    out = Manifest()
    if not data:
        return out
    for line in data.split(b"\n"):
        if line.strip():
            rec = _parse(line)
            if rec is not None:
                out.records[rec.name] = rec  # later lines win: the newest write of a name
    return out


def _line(rec: GeneratedRecord) -> bytes:
    obj: dict[str, Any] = {"v": 1, "name": rec.name, "category": rec.category, "by": rec.by}
    if rec.partial:
        obj |= {"partial": True, "t_ns": rec.t_ns}
    else:
        obj |= {"ino": rec.ino, "size": rec.size, "mtime_ns": rec.mtime_ns}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def _append(dir_fd: int, records: Iterable[GeneratedRecord]) -> None:
    data = b"".join(_line(r) for r in records)
    if not data:
        return
    fd = os.open(GENERATED_MANIFEST, _O_APPEND, 0o666, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{GENERATED_MANIFEST} is not a regular file")
        # One write: O_APPEND places it atomically after every other writer's line.
        os.write(fd, data)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > COMPACT_AT:
        _compact(dir_fd)


def _compact(dir_fd: int) -> None:
    """Rewrite the manifest with the newest record per name that still proves its file.

    A record appended by another writer between the read and the rename is lost: that file is
    then kept by cleanup (never the other way round)."""
    manifest = read_manifest(dir_fd)
    keep: list[GeneratedRecord] = []
    for name, rec in sorted(manifest.records.items()):
        try:
            st = lstat_at(dir_fd, name)
        except OSError:
            continue
        if rec.proves(st):
            keep.append(rec)
    tmp = f".{GENERATED_MANIFEST}.{secrets.token_hex(6)}.tmp"  # the atomic-write pattern
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"".join(_line(r) for r in keep))
        os.replace(tmp, GENERATED_MANIFEST, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _by_directory(paths: Iterable[str | os.PathLike[str]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for p in paths:
        full = os.path.abspath(os.fspath(p))
        groups.setdefault(os.path.dirname(full), []).append(os.path.basename(full))
    return groups


def register_generated(
    *paths: str | os.PathLike[str], category: str, by: str = "gmp"
) -> bool:
    """Record ``paths`` (just written, regular files) in their directories' manifests as gmp's
    ``category`` files; return False when any could not be recorded (it is then kept by
    ``gmp clean``, never deleted). Never raises for I/O: registering must not fail a plot."""
    ok = True
    for directory, names in _by_directory(paths).items():
        try:
            dfd = os.open(directory, _O_DIR)
        except OSError:
            ok = False
            continue
        try:
            records: list[GeneratedRecord] = []
            for name in names:
                try:
                    st = lstat_at(dfd, name)
                except OSError:
                    ok = False
                    continue
                if not stat.S_ISREG(st.st_mode):
                    ok = False
                    continue
                records.append(
                    GeneratedRecord(
                        name, category, by, ino=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns
                    )
                )
            _append(dfd, records)
        except OSError:
            ok = False
        finally:
            os.close(dfd)
    return ok


def register_partial(path: str | os.PathLike[str], *, category: str, by: str = "gmp") -> bool:
    """Record, *before* it is created, that gmp is about to write the partial file ``path``
    (a ``*.part`` renamed into place when done). A partial left behind by a killed writer is then
    provably gmp's. Returns False when it could not be recorded."""
    full = os.path.abspath(os.fspath(path))
    try:
        dfd = os.open(os.path.dirname(full), _O_DIR)
    except OSError:
        return False
    try:
        rec = GeneratedRecord(os.path.basename(full), category, by, partial=True, t_ns=time.time_ns())
        _append(dfd, [rec])
    except OSError:
        return False
    finally:
        os.close(dfd)
    return True


def write_generated(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    category: str,
    by: str = "gmp",
    fsync: bool = True,
) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`genmanip_runtime.atomic.atomic_write_bytes`)
    and register it as a generated ``category`` file. Returns the path. Raises what the write
    raises (``OSError``); a failed registration only leaves the file unprovable."""
    from genmanip_runtime.atomic import atomic_write_bytes

    target = atomic_write_bytes(path, data, fsync=fsync)
    register_generated(target, category=category, by=by)
    return target


def prune_manifest(dir_fd: int) -> bool:
    """Remove the manifest of ``dir_fd`` when none of its records proves an existing file any
    more (everything it listed was deleted); return True when it was removed."""
    try:
        st = lstat_at(dir_fd, GENERATED_MANIFEST)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    manifest = read_manifest(dir_fd)
    for name, rec in manifest.records.items():
        try:
            if rec.proves(lstat_at(dir_fd, name)):
                return False
        except OSError:
            continue
    try:
        now = lstat_at(dir_fd, GENERATED_MANIFEST)
        if (now.st_ino, now.st_size) != (st.st_ino, st.st_size):
            return False  # a writer appended meanwhile: keep it
        os.unlink(GENERATED_MANIFEST, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def ensure_cache_dir(path: str | os.PathLike[str]) -> Path:
    """Create gmp's cache directory ``path`` (parents too) if it is missing and tag it as gmp's
    (:data:`~genmanip_results.layout.CACHE_DIR_TAG`); return it. An existing directory is left
    as it is: only a directory gmp created carries the tag."""
    target = Path(path)
    try:
        target.mkdir(parents=True)
    except FileExistsError:
        return target
    from genmanip_runtime.atomic import atomic_write_text

    atomic_write_text(target / CACHE_DIR_TAG, _CACHE_TAG_TEXT)
    return target


def is_gmp_cache_dir(dir_fd: int) -> bool:
    """True when the directory ``dir_fd`` carries gmp's Cache Directory Tag (a regular file,
    not a symlink, starting with the standard signature and holding gmp's line)."""
    data = read_file_at(dir_fd, CACHE_DIR_TAG, limit=4096)
    if data is None:
        return False
    lines = data.decode("utf-8", "replace").splitlines()
    return bool(lines) and lines[0] == CACHE_TAG_SIGNATURE and _CACHE_TAG_OWNER in lines[1:]
