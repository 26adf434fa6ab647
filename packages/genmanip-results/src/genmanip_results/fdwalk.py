"""The one no-follow walk of a directory tree by file descriptor (``gmp clean`` and bundling).

Every path-based check ("is this a directory? then delete inside it") has a gap between the check
and the use: a directory swapped for a symlink in that gap redirects the use to wherever the link
points. This module closes the gap the way ``rm -r`` and ``os.fwalk`` do: a tree is held by
directory descriptors, and every step below the top is taken *relative to its parent's
descriptor* with no-follow semantics:

* directories are opened with ``os.open(name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=parent)``
  and the opened descriptor's ``fstat`` must be the very directory (device, inode) that was listed,
  so neither a symlink nor another directory moved into its place is ever entered;
* entries are listed with ``os.scandir(fd)`` and examined with
  ``os.stat(name, dir_fd=fd, follow_symlinks=False)``;
* files are opened with ``O_NOFOLLOW | O_NONBLOCK`` relative to their directory, then ``fstat``-ed:
  only a regular file, and (when the caller knows it) the same inode as listed, is returned;
* removal is ``os.unlink(name, dir_fd=fd)`` / ``os.rmdir(name, dir_fd=fd)`` after the same identity
  check, so a deletion can only ever hit the entry that was examined, inside the tree.

The top directory is the one thing opened by path (the caller named it). Nothing here follows a
symlink below it. Errors: :class:`WalkRefused` (an entry is not what it was, a symlink where a
directory was expected, a tree nested deeper than :data:`MAX_DEPTH`) and plain :class:`OSError`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from genmanip_protocol.errors import ExitCode

from .errors import GenmanipResultsError

__all__ = [
    "MAX_DEPTH",
    "DirListing",
    "Entry",
    "Ident",
    "Kind",
    "RemovalVetoed",
    "WalkRefused",
    "ident",
    "kind_of",
    "list_dir",
    "lstat_at",
    "open_dir_at",
    "open_dirs",
    "open_file_at",
    "open_file_in",
    "open_top",
    "read_file_at",
    "remove_at",
    "remove_tree",
    "walk",
]

#: Deepest directory level :func:`walk` and :func:`remove_tree` enter below the top. Each level
#: holds one descriptor open; a hostile tree nested thousands deep must not exhaust them.
MAX_DEPTH = 128

#: ``(st_dev, st_ino)``: what makes "the same file" across two ``stat`` calls.
Ident = tuple[int, int]
Kind = Literal["file", "dir", "symlink", "other"]

_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# O_NONBLOCK: opening a FIFO swapped in for a file must not hang; regular files ignore it.
_O_FILE = (
    os.O_RDONLY
    | _O_NOFOLLOW
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
# What open(O_NOFOLLOW) says about a symlink: ELOOP (Linux), EMLINK (FreeBSD), ENOTDIR with
# O_DIRECTORY on some systems, EFTYPE (NetBSD).
_NOT_FOLLOWED = frozenset(
    e for e in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR, getattr(errno, "EFTYPE", None)) if e
)


class WalkRefused(GenmanipResultsError):
    """An entry is not what the walk expected (a symlink or another file where a checked directory
    or file was, a tree nested too deeply); nothing was done to it. ``path`` names it relative to
    the walk's top (``/``-joined), ``reason`` says why."""

    exit_code = ExitCode.REFUSED

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path or '.'}: {reason}")
        self.path = path
        self.reason = reason


class RemovalVetoed(WalkRefused):
    """:func:`remove_tree`'s ``veto`` callback stopped the removal (e.g. a fresh lock appeared)."""


def ident(st: os.stat_result) -> Ident:
    """``(st_dev, st_ino)`` of a stat result."""
    return (st.st_dev, st.st_ino)


def kind_of(st: os.stat_result) -> Kind:
    """``"file"`` (regular), ``"dir"``, ``"symlink"`` or ``"other"`` (FIFO, socket, device)."""
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


def _show(rel: Sequence[str]) -> str:
    return "/".join(rel)


def open_top(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """Open the top of a walk (the directory the caller named) and return its descriptor.

    ``follow=False`` refuses a top that is itself a symlink (:class:`WalkRefused`); components
    above it are resolved as the operating system does (the caller chose that path)."""
    flags = _O_DIR | (0 if follow else _O_NOFOLLOW)
    try:
        return os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno in _NOT_FOLLOWED:
            raise WalkRefused(os.fspath(path), "is a symlink or not a directory; not followed") from exc
        raise


def lstat_at(dir_fd: int, name: str) -> os.stat_result:
    """``lstat`` of ``name`` inside the directory ``dir_fd`` (never follows a symlink)."""
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def open_dir_at(
    parent_fd: int, name: str, *, expect: Ident | None = None, rel: Sequence[str] = ()
) -> int:
    """Open the subdirectory ``name`` of ``parent_fd`` without following a symlink.

    With ``expect`` the opened directory must be that ``(dev, ino)`` (the one listed earlier).
    Raises :class:`WalkRefused` for a symlink, a non-directory or another directory in its place
    (``rel`` names it in the message), :class:`OSError` otherwise (e.g. it is gone)."""
    where = _show(rel) if rel else name
    try:
        fd = os.open(name, _O_DIR | _O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in _NOT_FOLLOWED:
            raise WalkRefused(where, "is a symlink or not a directory; not followed") from exc
        raise
    if expect is not None:
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if ident(st) != expect:
            os.close(fd)
            raise WalkRefused(where, "was replaced by another directory; not entered")
    return fd


def open_dirs(
    top_fd: int, parts: Sequence[str], *, expect: Ident | None = None
) -> int:
    """Descend ``parts`` from ``top_fd``, each step :func:`open_dir_at` (no symlink followed);
    return a new descriptor of the last directory (``parts == ()``: a duplicate of ``top_fd``).
    ``expect`` is checked against the last directory."""
    fd = os.dup(top_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = open_dir_at(fd, part, expect=expect if last else None, rel=parts[: i + 1])
            os.close(fd)
            fd = nxt
        if not parts and expect is not None and ident(os.fstat(fd)) != expect:
            raise WalkRefused(".", "was replaced by another directory; not entered")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file_at(
    dir_fd: int, name: str, *, expect: Ident | None = None, rel: Sequence[str] = ()
) -> int:
    """Open the regular file ``name`` of ``dir_fd`` for reading, never through a symlink; return
    the descriptor. The opened file is ``fstat``-ed: anything but a regular file (or, with
    ``expect``, another file than the one listed) is closed again and :class:`WalkRefused`."""
    where = _show(rel) if rel else name
    try:
        fd = os.open(name, _O_FILE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_FOLLOWED:
            raise WalkRefused(where, "is a symlink; not followed") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WalkRefused(where, "is not a regular file; not read")
        if expect is not None and ident(st) != expect:
            raise WalkRefused(where, "was replaced by another file; not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file_in(top_fd: int, parts: Sequence[str], *, expect: Ident | None = None) -> int:
    """Open the regular file at ``parts`` below ``top_fd``: every directory on the way with
    :func:`open_dir_at`, the file with :func:`open_file_at` (no symlink anywhere)."""
    if not parts:
        raise WalkRefused(".", "is not a file")
    parent = open_dirs(top_fd, parts[:-1])
    try:
        return open_file_at(parent, parts[-1], expect=expect, rel=parts)
    finally:
        os.close(parent)


def read_file_at(dir_fd: int, name: str, *, limit: int) -> bytes | None:
    """The bytes of the regular file ``name`` of ``dir_fd`` (no symlink followed), or ``None``
    when it is missing, not a regular file or larger than ``limit`` bytes."""
    try:
        fd = open_file_at(dir_fd, name)
    except (OSError, WalkRefused):
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    return None if len(data) > limit else data


@dataclass(frozen=True)
class Entry:
    """One entry of a listed directory: its ``name``, its path ``rel`` below the walk's top (the
    name included) and its ``lstat`` result ``st``."""

    name: str
    rel: tuple[str, ...]
    st: os.stat_result

    @property
    def kind(self) -> Kind:
        return kind_of(self.st)

    @property
    def ident(self) -> Ident:
        return ident(self.st)


@dataclass
class DirListing:
    """One directory of a :func:`walk`.

    Attributes:
        fd: the directory's descriptor: valid while the caller handles this listing (the walk
            closes it later); use it with ``dir_fd=`` functions (:func:`open_file_at`, ...).
        rel: its path below the top (``()`` for the top itself).
        ident: its ``(dev, ino)``.
        entries: every entry, ``lstat``-ed, sorted by name.
        prune: names of subdirectories not to descend into (add to it, like ``os.walk``'s
            ``dirnames``).
    """

    fd: int
    rel: tuple[str, ...]
    ident: Ident
    entries: list[Entry]
    prune: set[str] = field(default_factory=set)

    @property
    def names(self) -> set[str]:
        return {e.name for e in self.entries}


class _Ref:
    """A directory descriptor shared by its listing and its not-yet-opened subdirectories."""

    __slots__ = ("fd", "pending")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = 0

    def release(self) -> None:
        self.pending -= 1
        if self.pending <= 0 and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _list(fd: int, rel: tuple[str, ...]) -> list[Entry]:
    with os.scandir(fd) as it:
        names = sorted(e.name for e in it)
    out: list[Entry] = []
    for name in names:
        try:
            st = lstat_at(fd, name)
        except OSError:
            continue  # vanished between listing and stat: nothing to report or touch
        out.append(Entry(name, (*rel, name), st))
    return out


def list_dir(fd: int, rel: Sequence[str] = ()) -> DirListing:
    """The listing of the directory ``fd`` alone (every entry ``lstat``-ed, sorted; no descent).
    The listing's ``fd`` is ``fd`` itself: the caller keeps owning it. ``rel`` is prefixed to
    every entry's ``rel``."""
    base = tuple(rel)
    return DirListing(fd, base, ident(os.fstat(fd)), _list(fd, base))


def walk(
    top_fd: int,
    *,
    descend: Callable[[Entry], bool] | None = None,
    on_skip: Callable[[tuple[str, ...], str], None] | None = None,
    max_depth: int = MAX_DEPTH,
) -> Iterator[DirListing]:
    """Walk the tree below ``top_fd`` top-down, one :class:`DirListing` per directory.

    Only real directories are descended (never a symlink), each opened relative to its parent
    with ``O_NOFOLLOW`` and checked to be the directory that was listed; ``descend`` (and the
    listing's ``prune``) can keep the walk out of some. A directory that cannot be entered —
    swapped, unreadable, deeper than ``max_depth`` — is passed to ``on_skip(rel, reason)`` and
    left out. ``top_fd`` itself is not closed. At most one descriptor per level is open.
    """
    refs: list[_Ref] = []
    # (parent, name, rel, expected identity, depth) of directories still to open
    stack: list[tuple[_Ref, str, tuple[str, ...], Ident, int]] = []

    def skip(rel: tuple[str, ...], reason: str) -> None:
        if on_skip is not None:
            on_skip(rel, reason)

    def visit(ref: _Ref, rel: tuple[str, ...], depth: int) -> Iterator[DirListing]:
        try:
            entries = _list(ref.fd, rel)
            me = ident(os.fstat(ref.fd))
        except OSError as exc:
            skip(rel, f"unreadable ({exc.strerror or exc})")
            ref.pending = 1
            ref.release()
            return
        listing = DirListing(ref.fd, rel, me, entries)
        yield listing
        subdirs = [
            e
            for e in entries
            if e.kind == "dir"
            and e.name not in listing.prune
            and (descend is None or descend(e))
        ]
        ref.pending = len(subdirs) + 1  # +1: this listing, released just below
        for e in reversed(subdirs):  # popped in name order
            stack.append((ref, e.name, e.rel, e.ident, depth + 1))
        ref.release()

    first = _Ref(os.dup(top_fd))
    refs.append(first)
    try:
        yield from visit(first, (), 0)
        while stack:
            parent, name, rel, expect, depth = stack.pop()
            child: _Ref | None = None
            try:
                if depth > max_depth:
                    skip(rel, f"nested deeper than {max_depth} levels; not entered")
                else:
                    child = _Ref(open_dir_at(parent.fd, name, expect=expect, rel=rel))
            except WalkRefused as exc:
                skip(rel, exc.reason)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    skip(rel, f"unreadable ({exc.strerror or exc})")
            finally:
                parent.release()
            if child is not None:
                refs.append(child)
                yield from visit(child, rel, depth)
    finally:
        # The caller may stop early: close whatever is still open.
        for ref in refs:
            if ref.fd >= 0:
                os.close(ref.fd)
                ref.fd = -1


def _check(st: os.stat_result, expect: Ident | None, kind: Kind | None, where: str) -> None:
    if kind is not None and kind_of(st) != kind:
        raise WalkRefused(where, f"is now a {kind_of(st)}, was a {kind}; left alone")
    if expect is not None and ident(st) != expect:
        raise WalkRefused(where, "was replaced by another file; left alone")


def remove_at(
    dir_fd: int,
    name: str,
    *,
    expect: Ident | None = None,
    kind: Kind | None = None,
    veto: Callable[[Entry], str | None] | None = None,
    rel: Sequence[str] = (),
) -> None:
    """Remove the entry ``name`` of ``dir_fd``: a file or symlink is unlinked (a link's target is
    never touched), a directory removed with :func:`remove_tree`.

    The entry is ``lstat``-ed right before: with ``expect``/``kind`` it must still be that inode
    and that kind, else :class:`WalkRefused` and nothing is removed."""
    where = _show(rel) if rel else name
    st = lstat_at(dir_fd, name)
    _check(st, expect, kind, where)
    if stat.S_ISDIR(st.st_mode):
        remove_tree(dir_fd, name, expect=ident(st), veto=veto, rel=rel or (name,))
    else:
        os.unlink(name, dir_fd=dir_fd)


def remove_tree(
    parent_fd: int,
    name: str,
    *,
    expect: Ident | None = None,
    veto: Callable[[Entry], str | None] | None = None,
    rel: Sequence[str] = (),
    max_depth: int = MAX_DEPTH,
) -> None:
    """Remove the directory ``name`` of ``parent_fd`` and everything in it, never following a
    symlink: each subdirectory is opened with ``O_NOFOLLOW`` relative to its parent and checked
    to be the directory just listed, so one swapped for a link mid-way is not entered (the link
    itself is unlinked, its target untouched). ``veto(entry)`` is asked before each file goes; a
    reason stops the removal with :class:`RemovalVetoed` (what was removed so far stays removed).
    """
    base = tuple(rel) if rel else (name,)
    fd = open_dir_at(parent_fd, name, expect=expect, rel=base)
    try:
        _empty_dir(fd, base, veto, 0, max_depth)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def _empty_dir(
    fd: int,
    rel: tuple[str, ...],
    veto: Callable[[Entry], str | None] | None,
    depth: int,
    max_depth: int,
) -> None:
    if depth >= max_depth:
        raise WalkRefused(_show(rel), f"nested deeper than {max_depth} levels; not removed")
    for entry in _list(fd, rel):
        if entry.kind == "dir":
            sub = open_dir_at(fd, entry.name, expect=entry.ident, rel=entry.rel)
            try:
                _empty_dir(sub, entry.rel, veto, depth + 1, max_depth)
            finally:
                os.close(sub)
            os.rmdir(entry.name, dir_fd=fd)
            continue
        if veto is not None:
            reason = veto(entry)
            if reason:
                raise RemovalVetoed(_show(entry.rel), reason)
        # Re-checked right before: the entry must still be what was listed.
        _check(lstat_at(fd, entry.name), entry.ident, entry.kind, _show(entry.rel))
        os.unlink(entry.name, dir_fd=fd)
