"""Server-supplied ids: the wire-level rules that make an episode id safe to use as a path.

An ``episode_id`` comes from the server and ends up joined under the results root, so it is
checked here, once, before anything is written because a server said so.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from ..errors import ValidationError, Violation
from ._checks import _describe, _short

__all__ = ["safe_relative_path", "split_episode_id"]


_DRIVE = re.compile(r"^[A-Za-z]:")
_MAX_SEGMENT_BYTES = 255
_MAX_PATH_BYTES = 4096


def safe_relative_path(value: Any, *, field: str = "episode_id") -> PurePosixPath:
    """Return ``value`` as a relative POSIX path that cannot leave the directory it is joined to.

    Rejected (``ValidationError`` naming ``field``): non-strings, empty strings, absolute paths,
    ``..``, ``.`` and empty segments (``a//b``, a trailing ``/``), NUL and other control
    characters, backslashes, drive letters (``C:``), segments over 255 bytes and paths over 4096
    bytes (UTF-8). Used before writing anything under the results root because a server said so.
    """

    def bad(expected: str, actual: str) -> ValidationError:
        return ValidationError(Violation(field, expected, actual))

    if not isinstance(value, str):
        raise bad("a relative path string", _describe(value))
    if not value:
        raise bad("a non-empty relative path", "an empty string")
    for ch in value:
        if ord(ch) < 32 or ord(ch) == 127:
            raise bad("a path without control characters", f"{_short(value)} (contains {ch!r})")
    if "\\" in value:
        raise bad("a path without backslashes", _short(value))
    if value.startswith("/"):
        raise bad("a relative path", f"absolute path {_short(value)}")
    if _DRIVE.match(value):
        raise bad("a relative path", f"drive-letter path {_short(value)}")
    if len(value.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        raise bad(
            f"at most {_MAX_PATH_BYTES} bytes",
            f"{len(value.encode('utf-8', 'surrogatepass'))} bytes",
        )
    segments = value.split("/")
    for seg in segments:
        if seg in ("", ".", ".."):
            shown = "an empty segment" if seg == "" else f"a {seg!r} segment"
            raise bad("a path without empty, '.' or '..' segments", f"{_short(value)} ({shown})")
        if _DRIVE.match(seg):
            raise bad("a path without drive letters", f"{_short(value)} (segment {_short(seg)})")
        if len(seg.encode("utf-8", "surrogatepass")) > _MAX_SEGMENT_BYTES:
            raise bad(
                f"segments of at most {_MAX_SEGMENT_BYTES} bytes",
                f"a segment of {len(seg.encode('utf-8', 'surrogatepass'))} bytes",
            )
    return PurePosixPath(*segments)


def split_episode_id(episode_id: Any, *, task_name: str | None = None) -> tuple[str, str, str, str]:
    """Split ``<benchmark>/<run_id>/<task_name>/<seed>`` into its four parts.

    Task names contain ``/`` and start with the benchmark id (``ebench/...``), which is how a
    run id containing ``/`` is told apart; pass ``task_name`` (e.g. from ``episode_result``) to
    split exactly. Raises ``ValidationError`` naming ``episode_id`` for unsafe or short ids.
    """
    parts = safe_relative_path(episode_id).parts
    if len(parts) < 4:
        raise ValidationError(
            Violation(
                "episode_id",
                "<benchmark>/<run_id>/<task_name>/<seed> (at least 4 segments)",
                f"{_short(episode_id)} ({len(parts)} segments)",
            )
        )
    bench, seed = parts[0], parts[-1]
    middle = parts[1:-1]
    if task_name is not None:
        tparts = tuple(task_name.split("/"))
        n = len(tparts)
        if n >= len(middle) or middle[-n:] != tparts:
            raise ValidationError(
                Violation(
                    "episode_id", f"<benchmark>/<run_id>/{task_name}/<seed>", _short(episode_id)
                )
            )
        return bench, "/".join(middle[:-n]), task_name, seed
    split = 1
    for i in range(1, len(middle)):
        if middle[i] == bench:
            split = i
            break
    return bench, "/".join(middle[:split]), "/".join(middle[split:]), seed
