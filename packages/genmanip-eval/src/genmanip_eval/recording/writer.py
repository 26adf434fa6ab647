"""The writer thread (:class:`Writer`): everything the step loop queues reaches the disk here, in
order: an episode's directory is taken (``_w_begin``), its rows appended to ``steps.jsonl`` and its
JPEG frames to the per-camera spool (length-prefixed, bytes as received: nothing is decoded to be
recorded), its end noted (``.awaiting_result``), and a finished episode handed to the transcoder.

Internal to :mod:`genmanip_eval.recording`. The queue is bounded (back-pressure, bounded memory);
:meth:`Writer.put` and :meth:`Writer.sync` are the step loop's side of it, every ``_w_*`` handler
runs on the ``gmp-recorder`` thread, which alone holds the episodes' open files. A handler that
fails records the :class:`.threads.Failure`; the writer then drains its queue without writing, so
the step loop never blocks on it, and raises the failure at its next call.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

from genmanip_protocol.schema import EpisodeResult
from genmanip_results.layout import (
    AWAITING_NOTE_GLOB,
    EPISODE_RESULT,
    FRAME_SPOOL_SUFFIX,
    FRAME_STORE_SUFFIX,
    FRAMES_DIR,
    INCOMPLETE,
    RESULT_JSON,
    STEPS_JSONL,
    VIDEO_PART_SUFFIX,
    VIDEO_SUFFIX,
    awaiting_note_name,
)
from genmanip_results.live import write_live_view
from genmanip_results.paths import UnsafePathError, create_exclusive
from genmanip_runtime.atomic import FileLock, atomic_write_json, json_default, merge_json

from ..errors import RecordingError
from .episode import Episode
from .files import (
    FRAME_LEN,
    NOTHING_OUTSIDE,
    RAW_JPEG_QUALITY,
    RECORDING_FILES,
    SafePaths,
    fresh_dir,
    unlink_markers,
)
from .recovery import Recovery
from .runs import Runs, run_lock
from .threads import (
    Abort,
    Begin,
    Ended,
    Failure,
    Finish,
    Frame,
    Live,
    Orphans,
    Park,
    Rows,
    Stop,
    Sync,
    WriterItem,
    until_done,
)
from .transcoder import Transcoder

__all__ = ["Writer"]

log = logging.getLogger("genmanip_eval.recording")


class Writer:
    """The ``gmp-recorder`` thread of a recorder, its bounded queue and its open files."""

    def __init__(
        self,
        paths: SafePaths,
        runs: Runs,
        recovery: Recovery,
        transcoder: Transcoder,
        failure: Failure,
        *,
        queue_size: int,
    ) -> None:
        self._paths = paths
        self._runs = runs
        self._recovery = recovery
        self._transcoder = transcoder
        self._failure = failure
        self._q: queue.Queue[WriterItem] = queue.Queue(maxsize=max(1, queue_size))
        self._open: dict[int, dict[str, Any]] = {}  # writer-thread state per episode object id
        self.aborts_queued: set[Path] = set()  # episode directories with an abort in the queue
        self.refused: set[Path] = set()  # episode directories whose recording the writer refused
        self.done = threading.Event()  # the loop has ended (see until_done)
        self.thread = threading.Thread(target=until_done, args=(self._writer_loop, self.done),
                                       name="gmp-recorder", daemon=True)

    # ------------------------------------------------------------ the step loop's side

    def put(self, item: WriterItem) -> None:
        while True:
            self._failure.check()
            if not self.thread.is_alive():
                raise RecordingError("the recording writer thread stopped unexpectedly")
            try:
                self._q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def sync(self) -> None:
        """Wait until the writer has handled everything queued so far."""
        done = threading.Event()
        self.put(Sync(done))
        while not done.wait(0.2):
            self._failure.check()
            if not self.thread.is_alive():
                raise RecordingError("the recording writer thread stopped unexpectedly")

    def request_stop(self, timeout: float) -> None:
        """Queue the writer's stop (``queue.Full`` after ``timeout`` seconds), for ``close()``."""
        self._q.put(Stop(), timeout=timeout)

    # ------------------------------------------------------------ the writer thread

    def _writer_loop(self) -> None:
        while True:
            item = self._q.get()
            if isinstance(item, Stop):
                self._transcoder.stop()
                return
            if isinstance(item, Sync):
                item.done.set()
                continue
            if self._failure.error is not None:
                continue  # keep draining so producers never block; the loop raises at next put
            try:
                # (the most frequent first)
                match item:
                    case Frame(ep, frames, index):
                        self._w_frame(ep, frames, index)
                    case Rows(ep, rows):
                        self._w_rows(ep, rows)
                    case Live(run_dir, worker_id, frames, info):
                        self._w_live(run_dir, worker_id, frames, info)
                    case Begin(ep):
                        self._w_begin(ep)
                    case Ended(ep):
                        self._w_ended(ep)
                    case Finish(ep, result, finished):
                        self._w_finish(ep, result, finished)
                    case Abort(ep, reason):
                        self._w_abort(ep, reason)
                    case Park(ep):
                        self._w_park(ep)
                    case Orphans():
                        self._w_orphans()
            except BaseException as exc:
                self._failure.fail(exc)

    def _open_spool(self, ep: Episode, cam: str) -> Any:
        """Create the frame spool of ``cam`` (a new file: never one that is there already); a
        camera name that cannot be a file name refuses the episode's recording."""
        try:
            path = self._paths.camera_file(ep.directory / FRAMES_DIR, cam, FRAME_SPOOL_SUFFIX)
            return create_exclusive(path, within=self._paths.resolved, field="camera")
        except (UnsafePathError, FileExistsError) as exc:
            what = (f"camera: the server's camera name {cam[:80]!r} (from its video.<camera>_view key) "
                    f"cannot be a file name ({exc})")
            self.refused.add(ep.directory)  # (before _w_abort removes the notes: see write_pending)
            self._w_abort(ep, f"recording refused: {what}")
            raise RecordingError(
                f"{what}; refusing to record episode {ep.episode_id!r}; {NOTHING_OUTSIDE}",
                hint="camera names must be plain names (letters, digits, _ . @ + = -); "
                "or run with --no-record",
            ) from exc

    def _w_begin(self, ep: Episode) -> None:
        if ep.run_dir not in self._runs.dirs:
            self._paths.safe_dir(ep.run_dir)
            self._runs.dirs.add(ep.run_dir)
            self._runs.merge_run_json(ep.run_dir)
            self._recovery.recover(ep.run_dir)
        # (after recover: an interrupted attempt of this very episode finishes before it is replaced)
        self._transcoder.wait_idle(ep.directory)
        d = self._paths.safe_dir(ep.directory)
        # A re-run replaces the previous attempt: rows of different attempts never mix.
        if (d / RESULT_JSON).exists():
            # ... and the task's episode_result.json must not keep claiming the replaced attempt
            # (found by tests/reliability/test_hostile_server.py).
            seed_key = ep.seed

            def drop(cur: dict[str, Any]) -> None:
                cur.pop(seed_key, None)

            merge_json(d.parent / EPISODE_RESULT, drop, run_lock(ep.run_dir))
        with self._attempt_lock(ep):
            for name in RECORDING_FILES:
                (d / name).unlink(missing_ok=True)
            unlink_markers(d)
            for pattern in (f"*{VIDEO_SUFFIX}", f"*{VIDEO_PART_SUFFIX}", f"*{FRAME_STORE_SUFFIX}"):
                for old in d.glob(pattern):
                    old.unlink()  # (a symlink: the link only)
            atomic_write_json(
                d / INCOMPLETE,
                {"episode_id": ep.episode_id, "worker_id": ep.worker_id, "started": ep.started,
                 "reason": None, "attempt": ep.attempt},
                fsync=False,
            )
            fresh_dir(d / FRAMES_DIR)
            self._open[id(ep)] = {
                "steps": create_exclusive(d / STEPS_JSONL, within=self._paths.resolved, field=STEPS_JSONL),
                "frames": {},
                "last": {},
            }

    def _attempt_lock(self, ep: Episode) -> FileLock:
        """The lock under which an attempt takes an episode directory (begin) or gives it up
        (abort): the run's one lock (:func:`.runs.run_lock`), so two recorders (processes, hosts
        on a shared root) never interleave the two on one directory."""
        return FileLock(run_lock(ep.run_dir), timeout=30.0)

    @staticmethod
    def _owns(ep: Episode) -> bool:
        """Is the directory's INCOMPLETE marker still this attempt's (nobody has begun it since)?"""
        try:
            info = json.loads((ep.directory / INCOMPLETE).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(info, dict) and info.get("attempt") == ep.attempt

    def _w_frame(self, ep: Episode, frames: dict[str, Any], index: int) -> None:
        st = self._open.get(id(ep))
        if st is None:
            return
        files: dict[str, Any] = st["frames"]
        last: dict[str, bytes] = st["last"]
        for cam in ep.cameras:
            value = frames.get(cam)
            if value is None:
                data = last.get(cam)  # a missing frame repeats the previous one: indices stay aligned
                if data is None:
                    continue
            elif isinstance(value, (bytes, bytearray, memoryview)):
                data = bytes(value)
            else:
                from genmanip_protocol.codec import encode_jpeg

                data = encode_jpeg(value, quality=RAW_JPEG_QUALITY)
            fh = files.get(cam)
            if fh is None:
                fh = files[cam] = self._open_spool(ep, cam)
            fh.write(FRAME_LEN.pack(len(data)))
            fh.write(data)
            last[cam] = data

    def _w_rows(self, ep: Episode, rows: list[dict[str, Any]]) -> None:
        st = self._open.get(id(ep))
        if st is None:
            return
        fh = st["steps"]
        for row in rows:
            fh.write(json.dumps(row, default=json_default, allow_nan=True).encode() + b"\n")

    def _close_files(self, ep: Episode) -> list[str]:
        st = self._open.pop(id(ep), None)
        if st is None:
            return []
        st["steps"].close()
        for fh in st["frames"].values():
            fh.close()
        return list(st["frames"])

    def _w_orphans(self) -> None:
        for run_dir in sorted(self._recovery.recovered.copy()):
            self._recovery.mark_orphans(run_dir)

    def _w_ended(self, ep: Episode) -> None:
        st = self._open.get(id(ep))
        if st is None:
            return
        st["steps"].flush()
        for fh in st["frames"].values():
            fh.flush()
        # After the flushes: once this file exists, every row and frame of the episode is on disk
        # (in the OS: enough to survive the process being killed).
        atomic_write_json(
            ep.directory / awaiting_note_name(os.getpid()),
            {"episode": ep.describe(), "cameras": list(st["frames"]), "host": socket.gethostname()},
            fsync=False,
        )

    def _w_park(self, ep: Episode) -> None:
        """Close an episode whose result is still awaited, keeping what finishing it needs."""
        self._close_files(ep)
        if ep.directory.is_dir():
            marker = ep.directory / awaiting_note_name(os.getpid())
            try:
                # Released: this recorder never touches the episode again, so the next client on
                # the worker may finish it even from this same (still running) process.
                info = json.loads(marker.read_text())
                atomic_write_json(marker, {**info, "parked": True}, fsync=False)
            except (OSError, ValueError) as exc:
                log.debug("cannot release %s: %s", marker, exc)
            atomic_write_json(
                ep.directory / INCOMPLETE,
                {
                    "episode_id": ep.episode_id, "worker_id": ep.worker_id, "started": ep.started,
                    "reason": "the run stopped while the server was scoring this episode; the next "
                    "run on the same worker id collects its result and finishes it",
                },
                fsync=False,
            )

    def _w_abort(self, ep: Episode, reason: str) -> None:
        self.aborts_queued.discard(ep.directory)
        self._close_files(ep)
        if not ep.directory.is_dir():
            return
        with self._attempt_lock(ep):
            if not self._owns(ep):
                # A later attempt has the directory (the server re-queued the seed and another
                # recorder began it before this abort reached the writer): its files are not ours.
                log.debug("episode %s: a later attempt records it; abort leaves it alone", ep.episode_id)
                return
            shutil.rmtree(ep.directory / FRAMES_DIR, ignore_errors=True)
            unlink_markers(ep.directory)
            atomic_write_json(
                ep.directory / INCOMPLETE,
                {"episode_id": ep.episode_id, "worker_id": ep.worker_id, "started": ep.started,
                 "reason": reason, "attempt": ep.attempt},
                fsync=False,
            )

    def _w_finish(self, ep: Episode, result: EpisodeResult, finished: str) -> None:
        cams = self._close_files(ep)
        for marker in ep.directory.glob(AWAITING_NOTE_GLOB):
            marker.unlink(missing_ok=True)
        self._transcoder.submit(ep, result, cams, finished)

    def _w_live(self, run_dir: Path, worker_id: str, frames: dict[str, Any], info: dict[str, Any]) -> None:
        # The live-view contract (file names, the name rule for wire-supplied worker ids and
        # cameras, nothing written out of the run or the results root) is genmanip_results.live,
        # the one viz reads with. Only JPEG bytes are published: frames never get decoded here.
        jpegs = {c: v for c, v in frames.items() if isinstance(v, (bytes, bytearray, memoryview))}
        try:
            write_live_view(run_dir, worker_id, jpegs, info, within=self._paths.root)
        except UnsafePathError as exc:
            # A live view is a convenience: a hostile or odd worker id costs it, not the run.
            log.warning("no live view for worker id %r: %s", worker_id, exc)
