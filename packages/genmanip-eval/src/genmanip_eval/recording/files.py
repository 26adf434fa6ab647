"""The recording's files: the frame-file format, camera names, the episode directory's rules, and
the one place where names from the wire become paths (:class:`SafePaths`).

Internal to :mod:`genmanip_eval.recording` (``camera_name``, ``iter_frame_file`` and
``RAW_JPEG_QUALITY`` are re-exported there). Every thread of a recorder uses these; none of them
holds state besides :class:`SafePaths`' two immutable paths.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from genmanip_results.layout import (
    AWAITING_NOTE_GLOB,
    FRAME_SPOOL_SUFFIX,
    FRAME_STORE_SUFFIX,
    FRAMES_DIR,
    INCOMPLETE,
    PENDING_NOTE_GLOB,
    RESULT_JSON,
    STEPS_JSONL,
)
from genmanip_results.paths import UnsafePathError, is_within, safe_file

from ..errors import EpisodeIdError

__all__ = [
    "FRAME_LEN",
    "NOTHING_OUTSIDE",
    "RAW_JPEG_QUALITY",
    "RECORDING_FILES",
    "SafePaths",
    "camera_name",
    "fresh_dir",
    "is_gmp_episode_dir",
    "iter_frame_file",
    "truncate_rows",
    "unlink_markers",
]

#: The length prefix of each JPEG in a frame file (spool or store).
FRAME_LEN = struct.Struct(">I")
#: Raw frames (msgpack ``--frames raw``) are stored as JPEG at this quality, once, in the writer
#: thread: bench/recording_cost.py measures the cost and the error (docs/eval.md).
RAW_JPEG_QUALITY = 95
# The recovery notes (names in genmanip_results.layout; the owner's pid is in the name, so claiming
# an abandoned note is one atomic rename):
# * pending (``pending_note_name``): written (fsynced) when an episode's last step is recorded,
#   before its videos are transcoded: with the frame spool and steps.jsonl it is everything needed
#   to finish the episode, so a recorder started after a crash completes it
#   (``Recorder.recover``). Removed after result.json.
# * awaiting (``awaiting_note_name``): written when the server ends an episode (its last step
#   recorded, the result not yet here): everything but the result is on disk. A client resuming
#   on the same worker collects the result from the server (``EvalClient(adopt_on_start=True)``)
#   and finishes the episode from this file.
_MARKER_GLOBS = (PENDING_NOTE_GLOB, AWAITING_NOTE_GLOB)
RECORDING_FILES = (STEPS_JSONL, RESULT_JSON, INCOMPLETE)
# What makes an existing directory one of gmp's episode directories (any one of them).
_EPISODE_MARKS = (*RECORDING_FILES, FRAMES_DIR)
NOTHING_OUTSIDE = "nothing was written outside the results root"


def camera_name(key: str) -> str:
    """``video.left_camera_view`` -> ``left_camera`` (the mp4 file stem)."""
    name = key[len("video.") :] if key.startswith("video.") else key
    return name[: -len("_view")] if name.endswith("_view") else name


def iter_frame_file(path: Path) -> Iterator[bytes]:
    """Yield the JPEGs of a length-prefixed frame file (a truncated tail is ignored)."""
    with open(path, "rb") as fh:
        while True:
            head = fh.read(FRAME_LEN.size)
            if len(head) < FRAME_LEN.size:
                return
            (n,) = FRAME_LEN.unpack(head)
            data = fh.read(n)
            if len(data) < n:
                return
            yield data


def is_gmp_episode_dir(directory: Path) -> bool:
    """An episode directory gmp may (re)write: empty, or holding one of its recording files."""
    try:
        names = {e.name for e in os.scandir(directory)}
    except FileNotFoundError:
        return True
    if not names or names & set(_EPISODE_MARKS):
        return True
    return any(directory.glob(AWAITING_NOTE_GLOB)) or any(directory.glob(PENDING_NOTE_GLOB))


def fresh_dir(path: Path) -> None:
    """Replace ``path`` by a new empty directory; a symlink there is removed, never followed
    (``shutil.rmtree`` refuses symlinks, and ``ignore_errors`` would hide that)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir()


def unlink_markers(directory: Path) -> None:
    for pattern in _MARKER_GLOBS:
        for marker in directory.glob(pattern):
            marker.unlink(missing_ok=True)


def truncate_rows(path: Path, n: int) -> None:
    """Keep exactly the first ``n`` complete rows of ``steps.jsonl`` (a killed writer may have
    left a torn line after them); raise ValueError if it has fewer."""
    data = path.read_bytes()
    end = 0
    for _ in range(n):
        nl = data.find(b"\n", end)
        if nl < 0:
            raise ValueError(f"{path.name} has fewer than {n} rows")
        end = nl + 1
    if end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)


@dataclass(frozen=True)
class SafePaths:
    """The results root a recorder writes under, and the checks that keep its paths inside it."""

    #: the root, absolute (``Recorder.root``)
    root: Path
    #: the root with symlinks resolved: what every path is checked against
    resolved: Path

    def camera_file(self, directory: Path, cam: str, suffix: str) -> Path:
        """The one place a camera name from the wire becomes a path: ``<directory>/<cam><suffix>``
        when ``cam`` passes :func:`genmanip_results.paths.safe_file` (one plain name, nothing that
        resolves out of ``directory`` or the results root); else :class:`UnsafePathError`."""
        path = safe_file(directory, cam, suffix=suffix, field="camera")
        if not is_within(path, self.resolved):
            raise UnsafePathError(f"camera: {cam[:80]!r}: {directory.name} resolves outside the results root")
        return path

    def has_frames(self, directory: Path, cam: str) -> bool:
        """Are ``cam``'s frames there to finish the episode with: its spool, or (a completion cut
        short after moving it) its frame store?"""
        return (self.camera_file(directory / FRAMES_DIR, cam, FRAME_SPOOL_SUFFIX).is_file()
                or self.camera_file(directory, cam, FRAME_STORE_SUFFIX).is_file())

    def safe_dir(self, directory: Path) -> Path:
        # Checked after mkdir too: the directories just made may have been reached through a
        # symlink (or one swapped in meanwhile).
        for made in (False, True):
            if made:
                directory.mkdir(parents=True, exist_ok=True)
            if not is_within(directory, self.resolved):
                raise EpisodeIdError(
                    f"episode directory {directory} resolves outside the results root (symlink?); "
                    "refusing to write there"
                )
        return directory
