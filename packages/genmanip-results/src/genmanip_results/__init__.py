"""genmanip-results: the one owner of gmp's results trees.

Everything that knows where results live and how they are laid out: the names (``layout``), where
trees are (``roots``), the one path-safety check for names from the wire (``paths``), discovery of
runs, tasks and episodes in both on-disk layouts (``discovery``), per-episode series with one
ragged-row policy (``series``), the live-view files of a running ``gmp eval`` (``live``), the
recorded videos (``video``, extra ``[video]``: a static ffmpeg), success-rate statistics
(``stats``) and synthetic trees for tests (``testing``, not re-exported here).

The names below are loaded on first use (PEP 562), so ``import genmanip_results.layout`` — which
the stdlib-only ``gmp`` parser does for its defaults — costs no numpy import.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

from .__about__ import __version__

if TYPE_CHECKING:
    from .discovery import (
        EpisodeInfo,
        LockInfo,
        RunInfo,
        RunScanner,
        find_episode_dirs,
        find_runs,
        is_episode_dir,
        is_run_dir,
        load_episode,
        load_run,
        read_locks,
    )
    from .errors import GenmanipResultsError
    from .paths import UnsafePathError, is_within, safe_join
    from .roots import resolve_results_root, search_roots
    from .series import EpisodeSeries, SeriesError, SeriesIssue, load_series
    from .stats import wilson_interval
    from .video import (
        FfmpegError,
        FfmpegNotFoundError,
        VideoError,
        VideoInfo,
        VideoWriter,
        ffmpeg_executable,
        probe_video,
        read_video_frames,
        transcode_jpegs,
        video_info,
    )

#: Public name -> the submodule that defines it.
_WHERE: dict[str, str] = {
    **dict.fromkeys(
        ("EpisodeInfo", "LockInfo", "RunInfo", "RunScanner", "find_episode_dirs", "find_runs",
         "is_episode_dir", "is_run_dir", "load_episode", "load_run", "read_locks"),
        "discovery",
    ),
    "GenmanipResultsError": "errors",
    **dict.fromkeys(("UnsafePathError", "is_within", "safe_join"), "paths"),
    **dict.fromkeys(("resolve_results_root", "search_roots"), "roots"),
    **dict.fromkeys(("EpisodeSeries", "SeriesError", "SeriesIssue", "load_series"), "series"),
    "wilson_interval": "stats",
    **dict.fromkeys(
        ("FfmpegError", "FfmpegNotFoundError", "VideoError", "VideoInfo", "VideoWriter",
         "ffmpeg_executable", "probe_video", "read_video_frames", "transcode_jpegs", "video_info"),
        "video",
    ),
}

__all__ = [
    "EpisodeInfo",
    "EpisodeSeries",
    "FfmpegError",
    "FfmpegNotFoundError",
    "GenmanipResultsError",
    "LockInfo",
    "RunInfo",
    "RunScanner",
    "SeriesError",
    "SeriesIssue",
    "UnsafePathError",
    "VideoError",
    "VideoInfo",
    "VideoWriter",
    "__version__",
    "ffmpeg_executable",
    "find_episode_dirs",
    "find_runs",
    "is_episode_dir",
    "is_run_dir",
    "is_within",
    "load_episode",
    "load_run",
    "load_series",
    "probe_video",
    "read_locks",
    "read_video_frames",
    "resolve_results_root",
    "safe_join",
    "search_roots",
    "transcode_jpegs",
    "video_info",
    "wilson_interval",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'genmanip_results' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
