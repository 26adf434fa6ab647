"""Exceptions of genmanip-artifacts (one base class, a small tree below it)."""

from __future__ import annotations

from pathlib import Path

from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "AlignmentError",
    "ArtifactsUsageError",
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
