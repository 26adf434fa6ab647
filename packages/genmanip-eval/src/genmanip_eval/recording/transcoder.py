"""The transcoder thread (:class:`Transcoder`): each finished episode's frames become its frame
store (``transcode="deferred"``: fsync + rename) or its ``<camera>.mp4`` files (``"inline"``:
ffmpeg, niced), then ``result.json`` is written last, atomically, and ``INCOMPLETE`` removed.

Internal to :mod:`genmanip_eval.recording`. Jobs come from the writer thread (an episode's
result arrived) and from recovery (on whichever thread finds an interrupted episode). The
transcoder owns which episode directories are being finished (a re-run of the same episode waits
for them: files of two attempts never mix) and whether a stop cut the completions short (a
Ctrl-C or SIGTERM that ended ffmpeg, or ``Recorder.close(interrupted=True)``).
"""

from __future__ import annotations

import queue
import shutil
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from genmanip_protocol.schema import EpisodeResult
from genmanip_results.layout import (
    EPISODE_RESULT,
    FRAME_SPOOL_SUFFIX,
    FRAME_STORE_SUFFIX,
    FRAMES_DIR,
    INCOMPLETE,
    RESULT_JSON,
    VIDEO_SUFFIX,
)
from genmanip_runtime.atomic import atomic_write_json, merge_json

from .episode import Episode
from .files import SafePaths, iter_frame_file, unlink_markers
from .runs import run_lock
from .threads import Failure, TranscodeJob, until_done

__all__ = ["Transcoder"]

#: ffmpeg's exit status when SIGINT or SIGTERM stopped it (its own handler), and the statuses of an
#: ffmpeg killed by a stop signal outright.
_FFMPEG_SIGNALLED = (255, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP)


class Transcoder:
    """The ``gmp-transcoder`` thread of a recorder and what it shares with the others."""

    def __init__(
        self,
        paths: SafePaths,
        failure: Failure,
        *,
        mode: str,
        fps: int,
        nice: int,
        on_episode_complete: Callable[[Path], Any] | None,
    ) -> None:
        self._paths = paths
        self._failure = failure
        self.mode = mode
        self.fps = fps
        self.nice = nice
        self.on_episode_complete = on_episode_complete
        self._tq: queue.Queue[TranscodeJob | None] = queue.Queue()
        # Episode directories with a transcode queued or running: a re-run of the same episode
        # waits for it, so files of two attempts never mix.
        self._busy: dict[Path, int] = {}
        self._busy_cv = threading.Condition()
        # A stop (Ctrl-C, SIGTERM) cut the completions short: set by an ffmpeg the signal stopped,
        # or by close(interrupted=True). Inline transcodes still queued are then left to the resume.
        self.cut = threading.Event()
        self.cut_signalled = False  # ... by a stop signal that ended an ffmpeg
        self.cut_detail = ""
        self.left: set[Path] = set()  # episode directories whose videos the resume makes
        self.done = threading.Event()  # the loop has ended (see until_done)
        self.thread = threading.Thread(target=until_done, args=(self._transcode_loop, self.done),
                                       name="gmp-transcoder", daemon=True)

    def submit(self, ep: Episode, result: EpisodeResult, cams: list[str], finished: str) -> None:
        """Queue the finishing of ``ep`` (its directory is busy until it is done)."""
        with self._busy_cv:
            self._busy[ep.directory] = self._busy.get(ep.directory, 0) + 1
        self._tq.put(TranscodeJob(ep, result, cams, finished))

    def stop(self) -> None:
        """Stop after the jobs queued so far (the writer's last act)."""
        self._tq.put(None)

    def is_busy(self, directory: Path) -> bool:
        """Is a finishing of ``directory`` queued or running?"""
        with self._busy_cv:
            return directory in self._busy

    def wait_idle(self, directory: Path) -> None:
        """Wait until no finishing of ``directory`` is queued or running (or a thread failed)."""
        with self._busy_cv:
            while self._busy.get(directory, 0) > 0 and self._failure.error is None:
                self._busy_cv.wait(0.2)

    def _transcode_loop(self) -> None:
        while True:
            item = self._tq.get()
            if item is None:
                return
            try:
                if self._failure.error is not None:
                    continue
                if self.cut.is_set() and self.mode == "inline":
                    # Stopped: no new encoder; the saved result and the spool wait for the resume.
                    self.left.add(item.ep.directory)
                    continue
                self._transcode(item.ep, item.result, item.cams, item.finished)
            except BaseException as exc:
                status = _signalled_status(exc)
                if status is not None:
                    # A Ctrl-C or SIGTERM reaches the whole process group, ffmpeg included: a stop,
                    # not a failure. The episode keeps its saved result; the resume makes its videos.
                    self.left.add(item.ep.directory)
                    if not self.cut_signalled:
                        self.cut_detail = f"a stop signal ended the recording's ffmpeg (exit {status})"
                        self.cut_signalled = True
                    self.cut.set()
                else:
                    self._failure.fail(exc, f"the result of {item.ep.episode_id} is kept: its videos are made "
                                            "when the run is resumed with the same run id")
            finally:
                with self._busy_cv:
                    d = item.ep.directory
                    self._busy[d] -= 1
                    if not self._busy[d]:
                        del self._busy[d]
                    self._busy_cv.notify_all()

    def _transcode(self, ep: Episode, result: EpisodeResult, cams: list[str], finished: str) -> None:
        from genmanip_results.frames import finish_spool
        from genmanip_results.video import transcode_jpegs

        d = ep.directory

        def one(cam: str) -> int:
            src = self._paths.camera_file(d / FRAMES_DIR, cam, FRAME_SPOOL_SUFFIX)
            if self.mode == "deferred":
                # The spool becomes the finished frame store: fsync + rename, no copy, no
                # encoder (an H.264 copy is made when someone needs one: genmanip_results.frames).
                return finish_spool(src, self._paths.camera_file(d, cam, FRAME_STORE_SUFFIX))
            dst = self._paths.camera_file(d, cam, VIDEO_SUFFIX)
            if not src.is_file() and self._paths.camera_file(d, cam, FRAME_STORE_SUFFIX).is_file():
                src = self._paths.camera_file(d, cam, FRAME_STORE_SUFFIX)  # a deferred run resumed inline
            n = transcode_jpegs(iter_frame_file(src), dst, fps=self.fps, nice=self.nice, threads=1)
            if src.name.endswith(FRAME_STORE_SUFFIX) and src.parent == d:
                src.unlink(missing_ok=True)
            return n

        if self.mode == "deferred":
            for cam in cams:
                one(cam)
        # The cameras of one episode transcode concurrently (ffmpeg start-up dominates short
        # episodes); niced, so the step loop keeps priority.
        elif len(cams) > 1:
            with ThreadPoolExecutor(max_workers=min(2, len(cams)), thread_name_prefix="gmp-ffmpeg") as pool:
                list(pool.map(one, cams))
        else:
            for cam in cams:
                one(cam)
        seed_key = ep.seed

        def update(cur: dict[str, Any]) -> None:
            cur[seed_key] = {"score": result.score, "sr": result.sr}

        merge_json(d.parent / EPISODE_RESULT, update, run_lock(ep.run_dir))
        atomic_write_json(
            d / RESULT_JSON,
            {
                "episode_id": ep.episode_id,
                "task_name": ep.task_name,
                "seed": ep.seed,
                "score": result.score,
                "sr": result.sr,
                "steps": ep.steps,
                "robot_id": ep.robot_id,
                "worker_id": ep.worker_id,
                "instruction": ep.instruction,
                "started": ep.started,
                "finished": finished,
            },
        )
        (d / INCOMPLETE).unlink(missing_ok=True)
        unlink_markers(d)
        shutil.rmtree(d / FRAMES_DIR, ignore_errors=True)
        if self.on_episode_complete is not None:
            self.on_episode_complete(d)


def _signalled_status(exc: BaseException) -> int | None:
    """The exit status of the ffmpeg ``exc`` comes from when a stop signal (Ctrl-C, SIGTERM,
    hang-up) ended it, else None."""
    from genmanip_results.video import FfmpegError

    if isinstance(exc, FfmpegError) and exc.returncode in _FFMPEG_SIGNALLED:
        return exc.returncode
    return None
