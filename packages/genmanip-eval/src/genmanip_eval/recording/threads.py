"""What the step loop and a recorder's two threads share: the typed items of the writer's queue
and of the transcoder's, the one failure slot (:class:`Failure`) and the threads' body
(:func:`until_done`).

Internal to :mod:`genmanip_eval.recording`. The writer's items are made per observation on the
step loop's hot path: small frozen, slotted dataclasses (a few hundred nanoseconds each, no
per-step work besides building one), handled in order by :class:`.writer.Writer`, one handler
(``Writer._w_<kind>``) each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genmanip_protocol.schema import EpisodeResult

from ..errors import RecordingError
from .episode import Episode

__all__ = [
    "Abort",
    "Begin",
    "Ended",
    "Failure",
    "Finish",
    "Frame",
    "Live",
    "Orphans",
    "Park",
    "Rows",
    "Stop",
    "Sync",
    "TranscodeJob",
    "WriterItem",
    "until_done",
]

log = logging.getLogger("genmanip_eval.recording")


@dataclass(frozen=True, slots=True)
class Begin:
    """An episode's first observation: take its directory for this attempt (``_w_begin``)."""

    ep: Episode


@dataclass(frozen=True, slots=True)
class Frame:
    """One observation's frames (camera -> JPEG bytes or a raw array), frame ``index``."""

    ep: Episode
    frames: dict[str, Any]
    index: int


@dataclass(frozen=True, slots=True)
class Rows:
    """The ``steps.jsonl`` rows of one request's executed actions."""

    ep: Episode
    rows: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Live:
    """A worker's newest frames and ``live.json`` for the live view."""

    run_dir: Path
    worker_id: str
    frames: dict[str, Any]
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ended:
    """The server ended the episode: flush it and leave its ``.awaiting_result`` note."""

    ep: Episode


@dataclass(frozen=True, slots=True)
class Finish:
    """The episode's result arrived (its pending note is saved): close it, queue its transcode."""

    ep: Episode
    result: EpisodeResult
    finished: str


@dataclass(frozen=True, slots=True)
class Abort:
    """The episode will not be completed by this recorder: keep it ``INCOMPLETE``, ``reason``."""

    ep: Episode
    reason: str


@dataclass(frozen=True, slots=True)
class Park:
    """``close()`` with the episode's result still awaited: keep what finishing it needs."""

    ep: Episode


@dataclass(frozen=True, slots=True)
class Orphans:
    """Mark the episodes a dead recorder left awaiting a result the server no longer holds."""


@dataclass(frozen=True, slots=True)
class Sync:
    """Set ``done`` once everything queued before is handled (even after a failure)."""

    done: threading.Event


@dataclass(frozen=True, slots=True)
class Stop:
    """The last item: the writer stops, and stops the transcoder after what it has queued."""


#: Everything the writer's queue carries.
WriterItem = Begin | Frame | Rows | Live | Ended | Finish | Abort | Park | Orphans | Sync | Stop


@dataclass(frozen=True, slots=True)
class TranscodeJob:
    """An episode whose result is saved: finish its frames (``cams``), then write its result."""

    ep: Episode
    result: EpisodeResult
    cams: list[str]
    finished: str


class Failure:
    """The first failure of the writer or the transcoder thread (set once, by either): both then
    stop working but keep draining their queues, and the step loop raises it at its next call."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def fail(self, exc: BaseException, note: str = "") -> None:
        if self.error is None:
            self.error = exc
            log.error("recording failed: %s%s", exc, f"; {note}" if note else "")

    def check(self) -> None:
        """Raise :class:`RecordingError` if the writer or transcoder failed."""
        if isinstance(self.error, RecordingError):
            # A refusal (a hostile camera name, a foreign directory) says itself what happened.
            raise RecordingError(str(self.error), hint=self.error.hint) from self.error
        if self.error is not None:
            raise RecordingError(
                f"recording failed: {self.error}",
                hint="check free disk space and that ffmpeg works (or run with --no-record)",
            ) from self.error


def until_done(loop: Callable[[], None], done: threading.Event) -> None:
    """A recorder thread's body: ``loop``, then ``done`` set, however the loop ended.

    ``Recorder.close()`` waits on ``done``, not on ``Thread.join``, which a Ctrl-C arriving inside
    it can leave reporting a running thread as stopped (CPython 3.11, bpo-45274's fix releases the
    thread's state lock when the wait is interrupted).
    """
    try:
        loop()
    finally:
        done.set()
