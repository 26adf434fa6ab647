"""Path safety for the results trees: nothing a server, a request or a file names may leave them.

Two sides, two owners:

* the **wire rule** for a name or relative path (no ``..``, absolute paths, NUL and control
  characters, backslashes, drive letters, over-long segments) is
  :func:`genmanip_protocol.schema.safe_relative_path`, the protocol's vocabulary; :func:`safe_relative`
  applies exactly that rule and only retypes its error;
* the **filesystem side** is here: :func:`is_within` (containment after resolving symlinks) and
  :func:`safe_join` (wire-checked names joined under a root, then checked for containment).

:func:`safe_component` is the stricter rule for a single name that is served back by name (a
worker id, a camera): a conservative character set, so such a name is harmless in a URL or a
file name on any system. :func:`safe_file` builds the path of a file named after such a name
(``<camera>.mp4``, ``.frames/<camera>.jpegs``) at the point where the path is built. Everything
raises :class:`UnsafePathError` (or returns ``False``).

Opening files (the check where the file is opened, not where its name was found):

* :func:`open_within` / :func:`read_bytes_within` are THE way a results reader opens a file
  (discovery, series, live view, viz): the file, every symlink resolved, must be a regular file
  inside the root, and the descriptor actually opened is checked again (``O_NOFOLLOW`` on the
  resolved path, then ``/proc/self/fd``), so a file swapped for a symlink between a scan and a
  read is refused, not read. A FIFO cannot block the reader (``O_NONBLOCK``).
* :func:`create_exclusive` is the way a writer creates a file next to files it may not own
  (``O_CREAT | O_EXCL | O_NOFOLLOW``): it never truncates, overwrites or follows anything.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_protocol.schema import safe_relative_path

from .errors import GenmanipResultsError

__all__ = [
    "UnsafePathError",
    "create_exclusive",
    "is_within",
    "open_within",
    "read_bytes_within",
    "safe_component",
    "safe_file",
    "safe_join",
    "safe_relative",
]

_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}")


class UnsafePathError(GenmanipResultsError):
    """A name or path would leave its results root (``..``, absolute, NUL, a symlink out, ...).
    The message starts with the offending field's name (``"episode: ..."``)."""

    exit_code = ExitCode.REFUSED


def safe_relative(rel: str, *, field: str = "path") -> PurePosixPath:
    """``rel`` as a :class:`PurePosixPath` if the wire rule
    (:func:`~genmanip_protocol.schema.safe_relative_path`) accepts it, else
    :class:`UnsafePathError` ``"<field>: ..."``."""
    try:
        return safe_relative_path(rel, field=field)
    except ValidationError as exc:
        # str(ValidationError) is "<field>: expected ..., got ...": the field leads the message.
        raise UnsafePathError(str(exc)) from exc


def safe_component(name: str, *, field: str = "name") -> str:
    """Return ``name`` if it is one harmless path component (worker id, camera), else raise
    :class:`UnsafePathError`.

    Allowed: letters, digits and ``_ . @ + = -``, not starting with a dot or dash, at most 128
    characters.
    """
    # fullmatch: ``$`` would let a trailing newline through.
    if not isinstance(name, str) or not _COMPONENT.fullmatch(name):
        raise UnsafePathError(f"{field}: not a valid name: {name!r}")
    return name


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when ``path`` lies inside ``root`` (or is it), both resolved with every symlink
    followed (missing components are taken as they are). ``False`` when either cannot be
    resolved. To allow the last component to be a symlink (only the link is touched), pass its
    parent directory."""
    try:
        real = os.path.realpath(path)
        base = os.path.realpath(root)
    except (OSError, ValueError, RuntimeError):  # NUL in the name, a symlink loop (older Pythons)
        return False
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def safe_join(root: str | os.PathLike[str], *names: str, field: str = "path") -> Path:
    """``root / name / ...`` when every name passes :func:`safe_relative` (each may hold ``/``)
    and the joined path, symlinks resolved, stays inside ``root``; else :class:`UnsafePathError`.

    The returned path is not resolved (it is spelled under ``root``, as the caller gave it).
    """
    candidate = Path(root)
    for name in names:
        candidate = candidate.joinpath(*safe_relative(name, field=field).parts)
    if not is_within(candidate, root):
        shown = "/".join(names)
        raise UnsafePathError(f"{field}: {shown!r} points outside the results root")
    return candidate


def safe_file(
    directory: str | os.PathLike[str], name: str, *, suffix: str = "", field: str = "name"
) -> Path:
    """``directory / (name + suffix)`` for a wire-supplied ``name`` (a camera, a worker id) that
    passes :func:`safe_component`, when that path (an existing symlink resolved) stays inside
    ``directory``; else :class:`UnsafePathError` ``"<field>: ..."``.

    Call it where the path is built (``safe_file(ep_dir, cam, suffix=".mp4", field="camera")``),
    so no caller can join a name it has not checked.
    """
    safe_component(name, field=field)
    candidate = Path(directory) / f"{name}{suffix}"
    if not is_within(candidate, directory):
        raise UnsafePathError(f"{field}: {name!r}: {candidate.name} resolves outside {directory}")
    return candidate


def _real(path: str | os.PathLike[str], field: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError, RuntimeError) as exc:  # NUL in the name, a symlink loop
        raise UnsafePathError(f"{field}: {os.fspath(path)!r} cannot be resolved ({exc})") from exc


def _inside(real: str, base: str) -> bool:
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _fd_path(fd: int) -> str | None:
    """The path the kernel holds for an open descriptor (Linux ``/proc``), else None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def open_within(
    path: str | os.PathLike[str], root: str | os.PathLike[str], *, field: str = "path"
) -> BinaryIO:
    """Open ``path`` for reading (binary) when it is a regular file inside ``root`` with every
    symlink resolved; the one way a results reader opens a file.

    A symlink inside ``root`` to another file inside ``root`` is followed; anything that resolves
    outside (a symlinked file or directory, also one swapped in between the check and the open)
    is refused before a byte is read.

    Raises:
        UnsafePathError: ``"<field>: ... resolves outside the results root"`` (the file is never
            opened), or the file changed into a symlink while it was being opened.
        OSError: the file is missing (``FileNotFoundError``), unreadable, or not a regular file
            (a directory, a FIFO, a device: ``EINVAL``).
    """
    base = _real(root, field)
    real = _real(path, field)
    if not _inside(real, base):
        raise UnsafePathError(f"{field}: {Path(path).name!r} resolves outside the results root")
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    # O_NONBLOCK: opening a FIFO planted under a results name must not hang the reader.
    flags |= getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the resolved file became a symlink meanwhile
            raise UnsafePathError(f"{field}: {Path(path).name!r} changed while being opened") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        opened = _fd_path(fd)
        if opened is not None and not _inside(opened, base):
            # a directory on the way was swapped for a symlink between realpath and open
            raise UnsafePathError(f"{field}: {Path(path).name!r} resolves outside the results root")
        if flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes_within(
    path: str | os.PathLike[str], root: str | os.PathLike[str], *, field: str = "path"
) -> bytes:
    """The bytes of ``path`` under the rules of :func:`open_within` (same exceptions)."""
    with open_within(path, root, field=field) as fh:
        return fh.read()


def create_exclusive(
    path: str | os.PathLike[str],
    *,
    within: str | os.PathLike[str],
    field: str = "path",
    mode: int = 0o644,
) -> BinaryIO:
    """Create ``path`` (a new file, opened for binary writing) whose directory resolves inside
    ``within``; never truncates, overwrites or follows an existing file or symlink.

    Raises:
        UnsafePathError: the directory resolves outside ``within``.
        FileExistsError: something (a file, a symlink, anything) already has that name.
        OSError: it cannot be created.
    """
    p = Path(path)
    if not is_within(p.parent, within):
        raise UnsafePathError(f"{field}: {p.name!r}: its directory resolves outside the results root")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(p, flags, mode)
    try:
        opened = _fd_path(fd)
        if opened is not None and not _inside(opened, _real(within, field)):
            os.unlink(opened)  # ours (O_EXCL), made through a directory swapped meanwhile
            raise UnsafePathError(f"{field}: {p.name!r}: its directory resolves outside the results root")
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
