"""genmanip-viz: browse GenManip/EBench results locally and replay episodes in the Rerun web viewer.

``gmp viz`` serves the pages (:class:`VizServer` / :func:`create_app`); episode recordings are built
on first view (:func:`build_recording`) or ahead of time with ``gmp viz build``. The only package of
the workspace that imports ``rerun``.
"""

from __future__ import annotations

from .__about__ import __version__
from .assets import ensure_viewer_assets
from .errors import (
    GenmanipVizError,
    NoRunError,
    PortInUseError,
    RecordingBuildError,
    UnsafePathError,
    ViewerAssetsError,
    VizDependencyError,
)
from .index import Comparison, GroupStats, ResultsIndex, compare_runs, group_stats
from .recording import RRD_NAME, SIDECAR_NAME, build_recording, recording_is_fresh
from .server import VizServer, create_app

__all__ = [
    "RRD_NAME",
    "SIDECAR_NAME",
    "Comparison",
    "GenmanipVizError",
    "GroupStats",
    "NoRunError",
    "PortInUseError",
    "RecordingBuildError",
    "ResultsIndex",
    "UnsafePathError",
    "ViewerAssetsError",
    "VizDependencyError",
    "VizServer",
    "__version__",
    "build_recording",
    "compare_runs",
    "create_app",
    "ensure_viewer_assets",
    "group_stats",
    "recording_is_fresh",
]
