"""Path safety: nothing a request names may leave the results root.

Pages address runs by opaque ids and episodes by their path relative to the run, which is looked up in
the scanned index (a request never becomes a file path by string concatenation). These helpers are the
second line of defence for everything that does touch the file system.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from .errors import UnsafePathError

__all__ = ["is_within", "resolve_within", "safe_component", "safe_relative"]

_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}$")


def safe_component(name: str, *, field: str = "name") -> str:
    """Return ``name`` if it is one harmless path component (worker id, camera), else raise.

    Allowed: letters, digits and ``_ . @ + = -``, not starting with a dot or dash, at most 128 chars.
    """
    if not isinstance(name, str) or not _COMPONENT.match(name) or name in (".", ".."):
        raise UnsafePathError(f"{field}: not a valid name: {name!r}")
    return name


def safe_relative(rel: str, *, field: str = "path") -> PurePosixPath:
    """Validate a ``/``-separated relative path: no absolute, ``..``, ``.``, empty, NUL, control chars,
    backslashes or drive letters. Returns it as a :class:`PurePosixPath`."""
    if not isinstance(rel, str) or not rel:
        raise UnsafePathError(f"{field}: empty path")
    if any(ord(c) < 32 or c == "\x7f" for c in rel):
        raise UnsafePathError(f"{field}: control character in path")
    if "\\" in rel:
        raise UnsafePathError(f"{field}: backslash in path")
    if rel.startswith("/"):
        raise UnsafePathError(f"{field}: absolute path")
    parts = rel.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePathError(f"{field}: path segment {part!r} is not allowed")
        if len(part) >= 2 and part[1] == ":" and part[0].isalpha():
            raise UnsafePathError(f"{field}: drive letter in path")
        if len(part.encode("utf-8")) > 255:
            raise UnsafePathError(f"{field}: path segment longer than 255 bytes")
    return PurePosixPath(*parts)


def is_within(path: Path, root: Path) -> bool:
    """True when ``path`` resolved (symlinks followed) lies inside ``root`` resolved."""
    try:
        resolved = Path(path).resolve(strict=False)
        base = Path(root).resolve(strict=False)
    except (OSError, RuntimeError):
        return False
    return resolved == base or base in resolved.parents


def resolve_within(root: Path, rel: str, *, field: str = "path") -> Path:
    """``root / rel`` after :func:`safe_relative`, refusing a result that resolves outside ``root``
    (a symlink pointing out)."""
    candidate = Path(root).joinpath(*safe_relative(rel, field=field).parts)
    if not is_within(candidate, root):
        raise UnsafePathError(f"{field}: {rel!r} points outside the results root")
    return candidate
