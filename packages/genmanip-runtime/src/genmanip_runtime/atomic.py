"""Crash-safe file writes and a cross-process advisory lock.

The one implementation of atomic writes in gmp. A reader never sees a half-written file: data goes
to a temporary file in the *same* directory (``.<name>.<random>.tmp``, so the rename cannot cross
file systems), is fsync'ed, renamed over the target, and the directory is fsync'ed so the rename
itself survives a power loss.

:class:`FileLock` is an advisory ``flock`` on a separate lock file; it is released by the kernel
when the holder dies, so a crashed process never leaves a lock behind. :func:`merge_json` combines
both into a read-modify-write that loses no update between concurrent processes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from genmanip_protocol.errors import EncodeError

from .errors import LockTimeout

__all__ = [
    "FileLock",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "dumps_json",
    "json_default",
    "merge_json",
    "read_json",
]

if sys.platform == "win32":  # pragma: no cover - Windows: a byte-range lock instead of flock
    import msvcrt

    def _lock_nb(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock_nb(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable. Not possible on every platform / file system (Windows, some
    # network mounts): there the rename is still atomic, only its durability is weaker.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically; return the path.

    The temporary file ``.<name>.<random>.tmp`` is created next to the target with mode ``0666``
    minus the umask (like a plain ``open``), and removed again if anything fails. The parent
    directory must exist. ``fsync=False`` skips both fsyncs (atomic but not durable: for caches).
    """
    target = Path(path)
    directory = target.parent
    tmp = directory / f".{target.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        _fsync_dir(directory)
    return target


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", fsync: bool = True
) -> Path:
    """Replace ``path`` with ``text`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def json_default(obj: Any) -> Any:
    """``json.dumps`` fallback for numpy scalars/arrays, paths, sets and tuples-like objects."""
    # Imported lazily: JSON writing must not force numpy on callers that never pass arrays.
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays and scalars
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, bytes):
        raise TypeError("bytes are not JSON serializable (encode them explicitly)")
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _find_non_finite(obj: Any, where: str = "$") -> str | None:
    if isinstance(obj, float):
        return where if not math.isfinite(obj) else None
    if isinstance(obj, dict):
        for k, v in obj.items():
            hit = _find_non_finite(v, f"{where}.{k}")
            if hit:
                return hit
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            hit = _find_non_finite(v, f"{where}[{i}]")
            if hit:
                return hit
    return None


def dumps_json(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Serialize to strict JSON (no NaN/Infinity, which browsers and ``jq`` reject)."""
    try:
        return json.dumps(
            obj, indent=indent, sort_keys=sort_keys, allow_nan=False, default=json_default
        )
    except ValueError as exc:
        where = _find_non_finite(json.loads(json.dumps(obj, default=json_default)))
        raise EncodeError(
            f"cannot write non-finite number at {where or '?'} as JSON ({exc})"
        ) from exc
    except TypeError as exc:
        raise EncodeError(f"cannot write value as JSON: {exc}") from exc


def atomic_write_json(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    fsync: bool = True,
) -> Path:
    """Write ``obj`` as strict UTF-8 JSON (trailing newline) atomically.

    numpy scalars/arrays become numbers/lists. Raises :class:`EncodeError` naming the first
    non-finite value (NaN/inf are not JSON) or the unserializable type; the target is untouched.
    """
    text = dumps_json(obj, indent=indent, sort_keys=sort_keys) + "\n"
    return atomic_write_text(path, text, fsync=fsync)


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """Return the parsed JSON at ``path``, or ``default`` when the file does not exist.

    Corrupt JSON raises ``json.JSONDecodeError`` (a ``ValueError``); callers decide what it means.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default


class FileLock:
    """Cross-process exclusive lock on ``path`` (created if missing).

    ``timeout`` seconds to wait (``None`` waits forever, ``0`` tries once); raises
    :class:`~genmanip_protocol.errors.LockTimeout`. Each instance owns its own open file, so two
    instances exclude each other even inside one process (threads included). Not reentrant.

    ``remove=True`` deletes the lock file on release, while still holding it. That is safe
    because every acquisition checks, once it holds its file's lock, that ``path`` still names
    that file: a waiter that locked an inode someone removed meanwhile opens ``path`` again and
    waits on the new file, so two holders can never both "hold" it. (A locker that does not go
    through this class can be fooled: use ``remove`` only on files only this class locks.)

    Usage::

        with FileLock(run_dir / "episode_result.lock", timeout=10):
            ...
    """

    def __init__(
        self, path: str | os.PathLike[str], timeout: float | None = 10.0, *, poll: float = 0.01,
        remove: bool = False,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self.remove = remove
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        """True while this instance holds the lock."""
        return self._fd is not None

    def _try(self, fd: int) -> bool:
        try:
            _lock_nb(fd)
        except (BlockingIOError, PermissionError):
            return False
        except OSError as exc:  # pragma: no cover - EDEADLK etc. on odd file systems
            if exc.errno in (11, 13, 35):
                return False
            raise
        return True

    def _current(self, fd: int) -> bool:
        """Does ``path`` still name the file ``fd`` has open (not removed or replaced)?"""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        own = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)

    def acquire(self) -> FileLock:
        """Take the lock, waiting up to ``timeout`` seconds."""
        if self._fd is not None:
            raise RuntimeError(f"FileLock({self.path}) is already held by this instance")
        deadline = None if self.timeout is None else time.monotonic() + max(0.0, self.timeout)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            delay = min(self.poll, 0.0005)
            try:
                while not self._try(fd):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise LockTimeout(str(self.path), float(self.timeout or 0.0))
                    # Short sleeps first (uncontended handovers are quick), then the poll interval.
                    time.sleep(delay)
                    delay = min(self.poll, delay * 2)
                if self._current(fd):
                    break
                # The holder we waited for removed the file (remove=True): that lock is gone,
                # the lock is now the file at path.
                _unlock(fd)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock (a no-op when not held); with ``remove``, delete the file first."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self.remove and self._current(fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            _unlock(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FileLock({str(self.path)!r}, timeout={self.timeout!r}, locked={self.locked})"


def _quarantine_corrupt(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = path.with_name(f"{path.stem}.corrupt-{stamp}.json")
    n = 1
    while dest.exists():  # several corruptions within one second: keep them all
        dest = path.with_name(f"{path.stem}.corrupt-{stamp}-{n}.json")
        n += 1
    os.replace(path, dest)
    return dest


def merge_json(
    path: str | os.PathLike[str],
    update_fn: Callable[[dict[str, Any]], dict[str, Any] | None],
    lock_path: str | os.PathLike[str] | None = None,
    timeout: float | None = 10.0,
    *,
    indent: int | None = 2,
    sort_keys: bool = True,
) -> dict[str, Any]:
    """Read-modify-write a JSON object file under a cross-process lock; return the new object.

    ``update_fn`` receives the current object (``{}`` when the file is missing, or corrupt, or not a
    JSON object — a corrupt file is first renamed to ``<stem>.corrupt-<YYYYmmdd-HHMMSS>.json`` so
    nothing is lost) and returns the new object, or ``None`` after mutating it in place.
    ``lock_path`` defaults to ``<stem>.lock`` next to the file (the reference client's
    ``episode_result.lock``). Raises :class:`LockTimeout` after ``timeout`` seconds.
    """
    target = Path(path)
    lock = Path(lock_path) if lock_path is not None else target.with_name(target.stem + ".lock")
    with FileLock(lock, timeout):
        current: dict[str, Any]
        try:
            loaded = read_json(target, default={})
        except (ValueError, UnicodeDecodeError):
            _quarantine_corrupt(target)
            loaded = {}
        if not isinstance(loaded, dict):
            _quarantine_corrupt(target)
            loaded = {}
        current = loaded
        result = update_fn(current)
        new = current if result is None else result
        if not isinstance(new, dict):
            raise TypeError(f"merge_json update_fn must return a dict or None, got {type(new)}")
        atomic_write_json(target, new, indent=indent, sort_keys=sort_keys)
        return new
