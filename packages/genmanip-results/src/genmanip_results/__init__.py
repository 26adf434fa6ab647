"""genmanip-results: the one owner of gmp's results trees.

Discovery of runs, tasks and episodes in both on-disk layouts (the server's ``saved/eval_results``
and gmp's client recording), success-rate statistics, and the video helpers that make and read
the recorded ``<camera>.mp4`` files (extra ``[video]``: a static ffmpeg from imageio-ffmpeg).
"""

from __future__ import annotations

from .__about__ import __version__
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

__all__ = [
    "EpisodeInfo",
    "FfmpegError",
    "FfmpegNotFoundError",
    "GenmanipResultsError",
    "LockInfo",
    "RunInfo",
    "RunScanner",
    "VideoError",
    "VideoInfo",
    "VideoWriter",
    "__version__",
    "ffmpeg_executable",
    "find_episode_dirs",
    "find_runs",
    "is_episode_dir",
    "is_run_dir",
    "load_episode",
    "load_run",
    "probe_video",
    "read_locks",
    "read_video_frames",
    "transcode_jpegs",
    "video_info",
    "wilson_interval",
]
