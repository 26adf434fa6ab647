"""Exceptions of genmanip-artifacts (one base class, a small tree below it)."""

from __future__ import annotations

from pathlib import Path

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_results.layout import CACHE_DIR_TAG

__all__ = [
    "AlignmentError",
    "ArtifactsUsageError",
    "CacheDirNotGmpError",
    "EpisodeDataError",
    "GenmanipArtifactsError",
    "PlotFailures",
]


class GenmanipArtifactsError(GenmanipError):
    """Base exception of genmanip-artifacts."""


class EpisodeDataError(GenmanipArtifactsError):
    """An episode's inputs are missing or corrupt (no steps, ragged rows, unreadable video, ...).

    ``path`` is the episode directory (or the file) the problem was found in. The message is one line
    that names the file and, where there is one, the line and the field.
    """

    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, message: str, *, path: Path | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class AlignmentError(EpisodeDataError):
    """Camera videos and recorded steps cannot be aligned frame by frame.

    Raised instead of guessing: cameras with different frame counts, or steps that reference more
    frames than a video has.
    """


class PlotFailures(GenmanipArtifactsError):
    """Some episodes of a batch could not be plotted (each was reported on its own line)."""

    def __init__(self, failed: int, total: int) -> None:
        super().__init__(f"{failed} of {total} episodes could not be plotted")
        self.failed = failed
        self.total = total


class ArtifactsUsageError(GenmanipArtifactsError):
    """A command was called wrongly: no episode given, a root or run that does not exist, ..."""

    exit_code = ExitCode.USAGE


class CacheDirNotGmpError(GenmanipArtifactsError):
    """``gmp clean --cache-dir DIR`` named a directory that is not provably gmp's cache: it has no
    gmp Cache Directory Tag (written when gmp creates its cache), so its ``logs/``, ``meshes/``
    and ``downloads/`` may be anybody's. Nothing was deleted. ``path`` is the directory."""

    exit_code = ExitCode.REFUSED

    def __init__(self, path: Path, *, hint: str | None = None) -> None:
        super().__init__(
            f"--cache-dir {path}: not gmp's cache directory (no gmp {CACHE_DIR_TAG}); nothing deleted",
            hint=hint
            or "name gmp's own cache (default ~/.cache/genmanip); to empty this directory, "
            "delete its contents by hand",
        )
        self.path = path
