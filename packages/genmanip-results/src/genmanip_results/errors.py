"""The base exception of genmanip-results.

Tree (every class carries an ``exit_code``)::

    GenmanipError (genmanip_protocol)
      GenmanipResultsError
        VideoError                   1  writing, transcoding or reading a video failed
          FfmpegNotFoundError        3  no ffmpeg binary (install the ``video`` extra)
          FfmpegError                1  ffmpeg exited with an error (``stderr`` tail)
"""

from __future__ import annotations

from genmanip_protocol.errors import GenmanipError

__all__ = ["GenmanipResultsError"]


class GenmanipResultsError(GenmanipError):
    """Base exception of genmanip-results."""
