"""The base exception of genmanip-results.

Tree (every class carries an ``exit_code``)::

    GenmanipError (genmanip_protocol)
      GenmanipResultsError
        VideoError                   1  writing, transcoding or reading a video failed
          FfmpegNotFoundError        3  no ffmpeg binary (install the ``video`` extra)
          FfmpegError                1  ffmpeg exited with an error (``stderr`` tail)
        SeriesError                  4  an episode's recording cannot be read as a whole (series)
          SeriesNotFoundError        4  the episode has no recording file
        UnsafePathError              9  a name from the wire would leave its root (paths)
        RunNotFound                  4  RUN names no run directory or run id (compare.resolve_run)
          AmbiguousRun               4  a run id several runs share; lists their <benchmark>/<run_id>
"""

from __future__ import annotations

from genmanip_protocol.errors import GenmanipError

__all__ = ["GenmanipResultsError"]


class GenmanipResultsError(GenmanipError):
    """Base exception of genmanip-results."""
