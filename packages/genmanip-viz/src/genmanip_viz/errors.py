"""Exception tree of genmanip-viz (rooted in :class:`genmanip_protocol.errors.GenmanipError`)."""

from __future__ import annotations

from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "GenmanipVizError",
    "NoRunError",
    "PortInUseError",
    "RecordingBuildError",
    "UnsafePathError",
    "ViewerAssetsError",
    "VizDependencyError",
]


class GenmanipVizError(GenmanipError):
    """Base exception of genmanip-viz."""


class VizDependencyError(GenmanipVizError):
    """An optional third-party package the viewer needs (rerun-sdk, cryptography) is missing."""

    exit_code = ExitCode.NOT_INSTALLED


class UnsafePathError(GenmanipVizError):
    """A requested path would leave the results root (``..``, absolute, NUL, symlink out, ...)."""

    exit_code = ExitCode.REFUSED


class RecordingBuildError(GenmanipVizError):
    """An episode's ``.genmanip_vis.rrd`` could not be built (missing or unreadable inputs)."""

    exit_code = ExitCode.FAILURE


class ViewerAssetsError(GenmanipVizError):
    """The Rerun web viewer files could not be extracted from the installed rerun-sdk."""

    exit_code = ExitCode.NOT_INSTALLED


class PortInUseError(GenmanipVizError):
    """No free port was found among the requested one and the next few."""

    exit_code = ExitCode.UNREACHABLE


class NoRunError(GenmanipVizError):
    """The directory given is not a run directory (neither layout)."""

    exit_code = ExitCode.INVALID_INPUT
