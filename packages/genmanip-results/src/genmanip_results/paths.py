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
file name on any system. Everything raises :class:`UnsafePathError` (or returns ``False``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_protocol.schema import safe_relative_path

from .errors import GenmanipResultsError

__all__ = ["UnsafePathError", "is_within", "safe_component", "safe_join", "safe_relative"]

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
