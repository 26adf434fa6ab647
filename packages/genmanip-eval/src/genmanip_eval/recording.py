"""Episode recording off the hot path: ``steps.jsonl``, per-camera frames, results, live view.

Frames are stored as they arrive: ``transcode="deferred"`` (the default) makes each camera's spool
its finished frame store ``<camera>.jpegs`` (fsync + rename; the H.264 mp4 is made on demand by
:func:`genmanip_results.frames.ensure_video` or ``gmp transcode``); ``transcode="inline"`` runs
x264 after each episode as before. What follows calls the finishing step "transcoding" for both.

Layout (docs/architecture.md, client layout)::

    <root>/<benchmark>/<run_id>/run.json
    <root>/<benchmark>/<run_id>/<task_name>/episode_result.json      merged under a file lock
    <root>/<episode_id>/steps.jsonl, <camera>.jpegs | <camera>.mp4, result.json, INCOMPLETE

The step loop only classifies and enqueues (cheap); a writer thread appends rows and JPEG frames
(length-prefixed, bytes as received: nothing is decoded to be recorded) and a transcoder thread
turns each finished episode's frames into ``<camera>.mp4`` with ffmpeg at low priority, then writes
``result.json`` last (atomically) and removes ``INCOMPLETE``. The queue is bounded (back-pressure,
bounded memory); a failure of either thread is raised in the step loop at the next call and never
blocks it forever.

Nothing the server hands out once is lost to a crash: when the server ends an episode the writer
catches up and leaves ``.awaiting_result.<pid>.json`` (all but the result is on disk); a received
result is saved at once as ``.pending_result.<pid>.json``. The next recorder on the run finishes
such episodes (``recover``, ``adopt_result``) or, when that cannot be done exactly, keeps them
``INCOMPLETE`` with the reason.

Names from the wire never become paths unchecked: the episode id goes through the wire rule
(:func:`genmanip_protocol.schema.safe_relative_path`) and every directory is checked to resolve
inside the results root (``_safe_dir``); a camera name (``video.<camera>_view``) becomes a file
name only through :func:`genmanip_results.paths.safe_file`, where the path is built
(``_camera_file``: the frame spool, the mp4, the recovery notes' camera lists). A camera name that
fails it refuses the episode's recording with a :class:`RecordingError` naming the field, and
nothing is written outside the results root. Files created next to files gmp may not own
(``steps.jsonl``, the spool) are created with ``O_EXCL | O_NOFOLLOW``
(:func:`genmanip_results.paths.create_exclusive`), and an existing directory that holds files gmp
did not write is never taken over as an episode directory.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from genmanip_protocol.errors import ValidationError
from genmanip_protocol.schema import EpisodeResult, safe_relative_path, split_episode_id
from genmanip_results.layout import (
    AWAITING_NOTE_GLOB,
    EPISODE_RESULT,
    FRAME_SPOOL_SUFFIX,
    FRAME_STORE_SUFFIX,
    FRAMES_DIR,
    INCOMPLETE,
    PENDING_NOTE_GLOB,
    RESULT_JSON,
    RESULTS_DIR_ENV,
    RUN_JSON,
    RUN_JSON_LOCK,
    STEPS_JSONL,
    VIDEO_PART_SUFFIX,
    VIDEO_SUFFIX,
    awaiting_note_name,
    note_pid,
    pending_note_name,
)
from genmanip_results.live import owner_alive, parse_pid, write_live_view
from genmanip_results.paths import UnsafePathError, create_exclusive, is_within, safe_file
from genmanip_results.roots import resolve_results_root
from genmanip_results.stats import wilson_interval
from genmanip_runtime.atomic import FileLock, atomic_write_json, json_default, merge_json
from genmanip_runtime.text import safe_text

from .errors import EpisodeIdError, RecordingError

__all__ = [
    "RAW_JPEG_QUALITY",
    "RESULTS_DIR_ENV",
    "TRANSCODE_MODES",
    "Recorder",
    "camera_name",
    "finish_segment",
    "iter_frame_file",
    "resolve_results_root",
]

log = logging.getLogger("genmanip_eval.recording")

_LEN = struct.Struct(">I")
#: ``Recorder(transcode=...)``: when an episode's H.264 videos are made (docs/eval.md).
TRANSCODE_MODES = ("deferred", "inline")
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
_RECORDING_FILES = (STEPS_JSONL, RESULT_JSON, INCOMPLETE)
# What makes an existing directory one of gmp's episode directories (any one of them).
_EPISODE_MARKS = (*_RECORDING_FILES, FRAMES_DIR)
_NOTHING_OUTSIDE = "nothing was written outside the results root"


def camera_name(key: str) -> str:
    """``video.left_camera_view`` -> ``left_camera`` (the mp4 file stem)."""
    name = key[len("video.") :] if key.startswith("video.") else key
    return name[: -len("_view")] if name.endswith("_view") else name


def iter_frame_file(path: Path) -> Iterator[bytes]:
    """Yield the JPEGs of a length-prefixed frame file (a truncated tail is ignored)."""
    with open(path, "rb") as fh:
        while True:
            head = fh.read(_LEN.size)
            if len(head) < _LEN.size:
                return
            (n,) = _LEN.unpack(head)
            data = fh.read(n)
            if len(data) < n:
                return
            yield data


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _is_gmp_episode_dir(directory: Path) -> bool:
    """An episode directory gmp may (re)write: empty, or holding one of its recording files."""
    try:
        names = {e.name for e in os.scandir(directory)}
    except FileNotFoundError:
        return True
    if not names or names & set(_EPISODE_MARKS):
        return True
    return any(directory.glob(AWAITING_NOTE_GLOB)) or any(directory.glob(PENDING_NOTE_GLOB))


def _fresh_dir(path: Path) -> None:
    """Replace ``path`` by a new empty directory; a symlink there is removed, never followed
    (``shutil.rmtree`` refuses symlinks, and ``ignore_errors`` would hide that)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir()


@dataclass
class _Episode:
    """Main-thread bookkeeping of one episode being recorded."""

    episode_id: str
    directory: Path
    run_dir: Path
    task_name: str
    seed: str
    worker_id: str
    robot_id: str | None
    instruction: str | None
    started: str
    cameras: list[str] = field(default_factory=list)
    frames: int = 0
    steps: int = 0
    ts_frame: dict[int, int] = field(default_factory=dict)
    states: dict[int, Any] = field(default_factory=dict)
    state_used: set[int] = field(default_factory=set)
    last_ts: int | None = None
    #: the server ended it; its result is awaited
    awaiting: bool = False
    #: Which attempt at the episode directory this is (host, pid, a random part): written into its
    #: INCOMPLETE marker, so an abort that reaches the writer late never touches the files of a
    #: later attempt. The server re-queues an aborted seed at once; another process (or host)
    #: may already be recording it in the same directory.
    attempt: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}")

    def describe(self) -> dict[str, Any]:
        """What a later recorder needs to finish this episode (pending/awaiting result files)."""
        return {
            k: getattr(self, k)
            for k in ("episode_id", "task_name", "seed", "worker_id", "robot_id", "instruction", "started", "steps")
        }

    @classmethod
    def from_note(cls, note: Mapping[str, Any], directory: Path, run_dir: Path) -> _Episode:
        """The inverse of :meth:`describe` (KeyError/TypeError/ValueError on a damaged note)."""
        return cls(
            episode_id=str(note["episode_id"]), directory=directory, run_dir=run_dir,
            task_name=str(note["task_name"]), seed=str(note["seed"]), worker_id=str(note["worker_id"]),
            robot_id=note.get("robot_id"), instruction=note.get("instruction"),
            started=str(note["started"]), steps=int(note["steps"]),
        )


def _state_of(obs: Any) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for key, name in (("state.joints", "joints"), ("state.gripper", "gripper"), ("state.base", "base")):
        v = obs.get(key)
        if v is not None:
            out[name] = v
    return out or None


class Recorder:
    """Records episodes under ``root``; implements :class:`genmanip_eval.client.StepListener`.

    Args:
        root: the results root (see :func:`resolve_results_root`).
        manifest: fields for ``run.json`` (versions, server URL without token, policy, ...).
        live_every: every N observations of a worker, write its newest frames + ``live.json``
            into ``<run_dir>/.live/<worker_id>/`` (0 = off).
        queue_size: bound of the writer queue (items are one observation's frames or one
            request's rows).
        fps: frame rate of the mp4 files.
        nice: niceness added to the ffmpeg transcoder (keeps the step loop responsive).
        transcode: ``"deferred"`` (the default): an episode's JPEG frames become its frame store
            ``<camera>.jpegs`` (a rename, no encoding) and the H.264 mp4 is made when something
            needs it (:func:`genmanip_results.frames.ensure_video`, ``gmp transcode``);
            ``"inline"``: the recorder makes ``<camera>.mp4`` after each episode (x264, niced)
            and keeps no store; it looks ffmpeg up at once (``FfmpegNotFoundError`` when there is
            none).
        on_episode_complete: called with the episode directory once it is complete
            (``result.json`` written), from the transcoder thread; must return quickly.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        manifest: Mapping[str, Any] | None = None,
        live_every: int = 0,
        queue_size: int = 64,
        fps: int = 30,
        nice: int = 19,
        on_episode_complete: Callable[[Path], Any] | None = None,
        transcode: str = "deferred",
    ) -> None:
        if transcode not in TRANSCODE_MODES:
            raise ValueError(f"transcode: expected one of {', '.join(TRANSCODE_MODES)}, got {transcode!r}")
        if transcode == "inline":
            from genmanip_results.video import ffmpeg_executable

            # Found now, not at the first episode's end: a missing ffmpeg stops the run before it
            # starts (FfmpegNotFoundError, with the install hint), and the one lookup (it runs the
            # binary) is over before a Ctrl-C could cut it short mid-run.
            ffmpeg_executable()
        self.transcode = transcode
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self._root_resolved = self.root.resolve()
        self.manifest = dict(manifest or {})
        self.manifest.setdefault("started", _now())
        self.live_every = max(0, int(live_every))
        self.fps = fps
        self.nice = nice
        self.on_episode_complete = on_episode_complete
        self._q: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=max(1, queue_size))
        self._tq: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._episodes: dict[str, _Episode] = {}
        self._obs_count: dict[str, int] = {}
        self._open: dict[int, dict[str, Any]] = {}  # writer-thread state per episode object id
        self._run_dirs: set[Path] = set()
        self._run_ids: dict[Path, tuple[str, str]] = {}
        self._recovered: set[Path] = set()
        self._orphan_workers: set[str] = set()
        self._aborts_queued: set[Path] = set()  # episode directories with an abort in the queue
        self._own_dirs: set[Path] = set()  # episode directories this recorder has begun
        self._refused: set[Path] = set()  # episode directories whose recording the writer refused
        # Episode directories with a transcode queued or running: a re-run of the same episode
        # waits for it, so files of two attempts never mix.
        self._busy: dict[Path, int] = {}
        self._busy_cv = threading.Condition()
        self._closed = False
        # A stop (Ctrl-C, SIGTERM) cut the completions short: set by an ffmpeg the signal stopped,
        # or by close(interrupted=True). Inline transcodes still queued are then left to the resume.
        self._cut = threading.Event()
        self._cut_signalled = False  # ... by a stop signal that ended an ffmpeg
        self._cut_detail = ""
        self._left: set[Path] = set()  # episode directories whose videos the resume makes
        self._reported_left = False
        #: Finished episodes seen by this recorder: (success, score) — for the live running SR.
        self.finished: list[tuple[bool, float]] = []
        #: The server's final metric (progress-prefixed task name -> score/sr), merged over workers.
        self.final_metric: dict[str, Any] = {}
        # Set when each thread's loop has ended: close() waits on these, not on Thread.join, which
        # a Ctrl-C arriving inside it can leave reporting a running thread as stopped (CPython 3.11,
        # bpo-45274's fix releases the thread's state lock when the wait is interrupted).
        self._writer_done = threading.Event()
        self._transcoder_done = threading.Event()
        self._writer = threading.Thread(target=_until_done, args=(self._writer_loop, self._writer_done),
                                        name="gmp-recorder", daemon=True)
        self._transcoder = threading.Thread(target=_until_done, args=(self._transcode_loop, self._transcoder_done),
                                            name="gmp-transcoder", daemon=True)
        self._writer.start()
        self._transcoder.start()

    # ------------------------------------------------------------ producer side (step loop)

    @property
    def run_dirs(self) -> list[Path]:
        """Run directories this recorder has written to."""
        return sorted(self._run_dirs.copy())  # (the writer thread adds to it)

    def check(self) -> None:
        """Raise :class:`RecordingError` if the writer or transcoder failed, and
        ``KeyboardInterrupt`` once a stop signal ended the recorder's ffmpeg.

        That signal was meant for the run as well (a terminal's Ctrl-C, a SIGTERM of the process
        group), whose own ``KeyboardInterrupt`` may still be on its way, or lost: CPython drops one
        raised inside a finalizer or weakref callback. The run stops as on Ctrl-C either way.
        """
        self._check_failed()
        if self._cut_signalled and not self._closed:
            raise KeyboardInterrupt(self._cut_detail)

    def _check_failed(self) -> None:
        """Raise :class:`RecordingError` if the writer or transcoder failed.

        The producer side checks only this: a stop that ended ffmpeg must not cut the recording of
        what is already on its way (a result the server handed out once, an episode's last rows);
        the step loop's :meth:`check` stops the run.
        """
        if isinstance(self._error, RecordingError):
            # A refusal (a hostile camera name, a foreign directory) says itself what happened.
            raise RecordingError(str(self._error), hint=self._error.hint) from self._error
        if self._error is not None:
            raise RecordingError(
                f"recording failed: {self._error}",
                hint="check free disk space and that ffmpeg works (or run with --no-record)",
            ) from self._error

    def _put(self, item: tuple[Any, ...]) -> None:
        while True:
            self._check_failed()
            if not self._writer.is_alive():
                raise RecordingError("the recording writer thread stopped unexpectedly")
            try:
                self._q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _sync(self) -> None:
        """Wait until the writer has handled everything queued so far."""
        done = threading.Event()
        self._put(("sync", done))
        while not done.wait(0.2):
            self._check_failed()
            if not self._writer.is_alive():
                raise RecordingError("the recording writer thread stopped unexpectedly")

    def _split(self, episode_id: Any) -> tuple[Path, Path, str, str, str, str]:
        try:
            rel = safe_relative_path(episode_id)
            bench, run_id, task, seed = split_episode_id(episode_id)
        except ValidationError as exc:
            raise EpisodeIdError(
                # The id is the server's text: scrubbed and cut after quoting (no token prefix).
                f"refusing to record episode id {safe_text(repr(str(episode_id)), limit=120)} "
                f"from the server: {exc}; "
                "nothing was written",
            ) from exc
        directory = self.root / rel
        run_dir = self.root / bench / run_id
        return directory, run_dir, task, seed, bench, run_id

    def observation(self, worker_id: str, obs: Any) -> None:
        """A real observation arrived for ``worker_id`` (the first of an episode has reset=True)."""
        ep = self._episodes.get(worker_id)
        if ep is None or obs.get("reset"):
            if ep is not None:
                self._put(("abort", ep, "restarted before the episode ended"))
            ep = self._begin(worker_id, obs)
        ts_raw = obs.get("timestep")
        ts = int(ts_raw) if ts_raw is not None else (ep.last_ts + 1 if ep.last_ts is not None else 0)
        frames: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        for key in obs.cameras if hasattr(obs, "cameras") else [k for k in obs if str(k).startswith("video.")]:
            data = obs.frame_bytes(key) if hasattr(obs, "frame_bytes") else None
            cam = camera_name(str(key))
            if cam in keys:
                # ``video.a_view`` and ``video.a`` would share a.mp4: one camera silently lost.
                self._refuse(worker_id, ep, f"camera: the server's keys {str(keys[cam])[:80]!r} and "
                                            f"{str(key)[:80]!r} both name the camera {cam[:80]!r}")
            keys[cam] = key
            frames[cam] = data if data is not None else obs[key]
        if not ep.cameras:
            ep.cameras = list(frames)
        ep.ts_frame[ts] = ep.frames
        ep.states[ts] = _state_of(obs)
        # Bounded: only observations a (chunk-buffered) action may still refer to are kept.
        if len(ep.states) > 256:
            for old in sorted(ep.states)[:-128]:
                ep.states.pop(old, None)
        ep.last_ts = ts
        self._put(("frame", ep, frames, ep.frames))
        ep.frames += 1
        n = self._obs_count[worker_id] = self._obs_count.get(worker_id, 0) + 1
        if self.live_every and (n % self.live_every == 0 or n == 1):
            live = {
                "worker_id": worker_id,
                "step": ts,
                "episode_id": ep.episode_id,
                "instruction": ep.instruction,
                "task_name": ep.task_name,
                "updated": time.time(),
                **self._running_sr(),
            }
            self._put(("live", ep.run_dir, worker_id, frames, live))

    def _refuse(self, worker_id: str, ep: _Episode, what: str) -> None:
        """Refuse the recording of ``ep`` (step loop): it is left INCOMPLETE with the reason, and
        a :class:`RecordingError` starting with ``what`` (``"<field>: ..."``) is raised."""
        self._episodes.pop(worker_id, None)
        self._aborts_queued.add(ep.directory)
        self._put(("abort", ep, f"recording refused: {what}"))
        raise RecordingError(
            f"{what}; refusing to record episode {ep.episode_id!r}; {_NOTHING_OUTSIDE}",
            hint="the server sent observation keys this client cannot record (or run with --no-record)",
        )

    def _running_sr(self) -> dict[str, Any]:
        n = len(self.finished)
        k = sum(1 for s, _ in self.finished if s)
        lo, hi = wilson_interval(k, n)
        return {"episodes": n, "successes": k, "sr": (k / n) if n else None, "sr_ci95": [lo, hi]}

    def _begin(self, worker_id: str, obs: Any) -> _Episode:
        eid = obs.get("episode_id")
        directory, run_dir, task, seed, bench, run_id = self._split(eid)
        # Checked here, where the path was built and before anything is queued or written for
        # this episode (the writer clears the directory for the new attempt; the step loop writes
        # the pending result into it): a directory that exists and holds someone else's files is
        # never taken over.
        if directory not in self._own_dirs and not _is_gmp_episode_dir(directory):
            raise RecordingError(
                f"episode: refusing to record episode {str(eid)!r} into {directory}: that "
                f"directory exists and holds files gmp did not write; {_NOTHING_OUTSIDE}",
                hint="record into an empty --results-dir",
            )
        self._own_dirs.add(directory)  # (a later attempt may find it mid-rewrite: still ours)
        self._run_ids[run_dir] = (bench, run_id)
        rid = obs.get("robot_id")
        instr = obs.get("instruction")
        ep = _Episode(
            episode_id=str(eid),
            directory=directory,
            run_dir=run_dir,
            task_name=task,
            seed=seed,
            worker_id=worker_id,
            robot_id=None if rid is None else str(rid),
            instruction=None if instr is None else str(instr),
            started=_now(),
        )
        self._episodes[worker_id] = ep
        self._put(("begin", ep))
        return ep

    def executed(
        self,
        worker_id: str,
        actions: list[dict[str, Any]],
        *,
        obs_timesteps: list[int | None],
        chunk: list[dict[str, int] | None],
        latency: dict[str, float | None] | None,
        batch_size: int | None = None,
    ) -> None:
        """Actions the server executed for ``worker_id`` (in order). ``batch_size``: how many
        observations the policy call that chose them served (the async runner's batches)."""
        ep = self._episodes.get(worker_id)
        if ep is None:
            log.debug("worker %s: executed actions outside a recorded episode", worker_id)
            return
        rows = []
        for i, action in enumerate(actions):
            ots = obs_timesteps[i] if i < len(obs_timesteps) else ep.last_ts
            if ots is None:
                ots = ep.last_ts
            state = None
            if ots is not None and ots not in ep.state_used:
                ep.state_used.add(ots)
                state = ep.states.get(ots)
            rows.append(
                {
                    "episode_id": ep.episode_id,
                    "worker_id": worker_id,
                    "robot_id": ep.robot_id,
                    "step": ep.steps,
                    "obs_timestep": ots,
                    "frame": ep.ts_frame.get(ots) if ots is not None else None,
                    "state": state,
                    "action": action,
                    "chunk": chunk[i] if i < len(chunk) else None,
                    "latency_ms": latency if i == 0 else None,
                    **({"batch_size": batch_size} if i == 0 and batch_size is not None else {}),
                }
            )
            ep.steps += 1
        self._put(("rows", ep, rows))

    def episode_end(self, worker_id: str, result: EpisodeResult | None, *, lock_lost: bool) -> None:
        """The worker's current episode ended (result None: aborted / not scored)."""
        ep = self._episodes.pop(worker_id, None)
        if ep is None:
            return
        if lock_lost:
            self._put(("abort", ep, "lock_lost: the server aborted the episode and re-queued it"))
        elif result is None:
            self._put(("abort", ep, "the server sent no result for this episode (re-queued)"))
        elif result.episode_id != ep.episode_id:
            log.warning(
                "worker %s: result for %s arrived while recording %s", worker_id, result.episode_id, ep.episode_id
            )
            self._put(("abort", ep, f"result mismatch: server reported {result.episode_id}"))
        else:
            # A recorder that failed (or refused this episode) writes nothing more; one that a stop
            # signal cut still saves the result: the server hands it out once.
            self._check_failed()
            self._catch_up(ep)  # (a caller that did not say the episode ended: see episode_ended)
            self.finished.append((result.success, result.score))
            finished = _now()
            self._write_pending(ep, result, finished)
            self._put(("finish", ep, result, finished))

    def episode_ended(self, worker_id: str) -> None:
        """The server ended the worker's episode; its result follows (``episode_end``)."""
        ep = self._episodes.get(worker_id)
        if ep is not None:
            self._catch_up(ep)

    def _catch_up(self, ep: _Episode) -> None:
        """Once per episode, at its end: every row and frame on disk (the writer's ``ended``),
        before the result's note is written, which the writer's begin of the episode would wipe."""
        if not ep.awaiting:
            ep.awaiting = True
            self._put(("ended", ep))
            # The client now waits for the server anyway (scoring, the next reset): let the writer
            # catch up, so a kill from here on leaves the episode finishable.
            self._sync()

    def episode_aborted(self, worker_id: str, reason: str) -> None:
        """The worker's episode will not be completed by this client: mark it ``INCOMPLETE``."""
        ep = self._episodes.pop(worker_id, None)
        if ep is not None:
            self._aborts_queued.add(ep.directory)
            self._put(("abort", ep, reason))

    def adopt_result(self, worker_id: str, result: EpisodeResult) -> None:
        """A result for an episode not recorded to the end by this recorder: a previous client's
        (collected when resuming) or one whose recording was aborted. The episode is finished from
        disk when everything but the result is there (``.awaiting_result`` left by the recorder
        that ran it); otherwise its ``INCOMPLETE`` marker records the server's result."""
        try:
            self._split(result.episode_id)
        except EpisodeIdError as exc:
            log.warning("worker %s: %s", worker_id, exc)
            return
        # At once, on this thread: the server handed this result out once (see _write_pending).
        # If this very episode's abort is still queued, the writer must do it first.
        if self._split(result.episode_id)[0] in self._aborts_queued:
            self._sync()
        self._check_failed()  # (not the stop: see episode_end)
        try:
            self._adopt(result)
        except OSError as exc:
            raise RecordingError(
                f"recording failed: cannot save the collected result of {result.episode_id}: {exc}",
                hint="check free disk space (or run with --no-record)",
            ) from exc

    def results_not_held(self, worker_ids: list[str]) -> None:
        """The server holds no result for these workers (a resumed client asked): an episode a
        dead recorder left awaiting its result on one of them is marked lost, with the reason."""
        self._orphan_workers.update(str(w) for w in worker_ids)
        self._put(("orphans",))

    def worker_finished(self, worker_id: str, metric: Any) -> None:
        """The worker has no task left; ``metric`` is the server's final metric dict."""
        if isinstance(metric, Mapping):
            # run.json keeps it: the results reader derives the run's total episodes from it.
            self.final_metric.update(metric)
        ep = self._episodes.pop(worker_id, None)
        if ep is not None:
            self._put(("abort", ep, "the worker finished without a result for this episode"))

    def close(self, timeout: float | None = None, *, interrupted: bool = False) -> None:
        """Flush everything (waits for transcoding) and stamp ``run.json``; raise on failure.

        Episodes still open are left ``INCOMPLETE``. ``interrupted`` (the run was stopped by a
        Ctrl-C or SIGTERM; also when one arrives while this waits): inline transcodes still
        queued are not started, the episodes keep their saved results and the run's resume makes
        their videos. An ffmpeg that the signal stopped is that too, not a failure: either way,
        one warning says how many episodes' videos are left (:meth:`left_for_resume`), and a
        stop that reached only ffmpeg is raised here as ``KeyboardInterrupt`` (see :meth:`check`).
        """
        if self._closed:
            self.check()
            return
        self._closed = True
        if interrupted:
            self._cut.set()
        stopping: list[KeyboardInterrupt] = []

        def stop_once(exc: KeyboardInterrupt) -> None:
            # A Ctrl-C while this waits only cuts the completions short (what is left is the
            # resume's); a second one stops the waiting.
            if stopping:
                raise exc
            stopping.append(exc)
            self._cut.set()

        try:
            for wid, ep in list(self._episodes.items()):
                self._episodes.pop(wid, None)
                try:
                    if ep.awaiting:
                        self._put(("park", ep))
                    else:
                        self._put(("abort", ep, "the run ended before the episode finished"))
                except RecordingError:
                    break
        except KeyboardInterrupt as exc:
            stop_once(exc)  # (those episodes keep their INCOMPLETE marker)
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(2):  # the writer must get its stop, whatever cut the first try short
            try:
                self._q.put(("stop",), timeout=5.0)
                break
            except queue.Full:
                break
            except KeyboardInterrupt as exc:
                stop_once(exc)
        for done in (self._writer_done, self._transcoder_done):
            while True:
                try:
                    if done.wait(0.2):
                        break
                except KeyboardInterrupt as exc:
                    stop_once(exc)
                if deadline is not None and time.monotonic() > deadline:
                    raise RecordingError(f"recording did not finish within {timeout:g} s")
        self._report_left()
        if stopping:
            raise stopping[0]
        if self._cut_signalled and not interrupted:
            raise KeyboardInterrupt(self._cut_detail)  # (see check: the run's stop, maybe lost)
        self.check()

    def left_for_resume(self) -> list[Path]:
        """Episode directories whose completion a stop cut short (their results are saved; the
        resume of the run, ``gmp eval --run-id``, makes their videos)."""
        return sorted(self._left)

    def _report_left(self) -> None:
        if self._left and not self._reported_left:
            self._reported_left = True
            n = len(self._left)
            # (the resume command follows: gmp eval prints it after a stop)
            log.warning("interrupted; %d episode%s videos will be made on resume", n, "'s" if n == 1 else "s'")

    def update_manifest(self, **fields: Any) -> None:
        """Merge ``fields`` into ``run.json`` of every run dir written so far (e.g. ``finished``)."""
        self.manifest.update(fields)
        for run_dir in self.run_dirs:
            try:
                self._merge_run_json(run_dir)
            except OSError as exc:  # disk full, read-only: a typed error, not a crash (exit 70)
                raise RecordingError(
                    f"cannot update {run_dir / RUN_JSON}: {exc}",
                    hint="check free disk space (or run with --no-record)",
                ) from exc

    # ------------------------------------------------------------ writer thread

    def _fail(self, exc: BaseException, note: str = "") -> None:
        if self._error is None:
            self._error = exc
            log.error("recording failed: %s%s", exc, f"; {note}" if note else "")

    def _writer_loop(self) -> None:
        while True:
            item = self._q.get()
            kind = item[0]
            if kind == "stop":
                self._tq.put(None)
                return
            if kind == "sync":
                item[1].set()
                continue
            if self._error is not None:
                continue  # keep draining so producers never block; the loop raises at next put
            try:
                getattr(self, f"_w_{kind}")(*item[1:])
            except BaseException as exc:
                self._fail(exc)

    def _merge_run_json(self, run_dir: Path) -> None:
        manifest = dict(self.manifest)

        def update(cur: dict[str, Any]) -> None:
            workers = set(cur.get("workers") or []) | set(manifest.pop("workers", []) or [])
            started = cur.get("started")
            segment = manifest.pop("segment", None)
            for k, v in manifest.items():
                cur[k] = v
            if isinstance(segment, dict):
                _merge_segment(cur, segment, add=True)
            if run_dir in self._run_ids:
                cur["benchmark"], cur["run_id"] = self._run_ids[run_dir]
            if started and manifest.get("started"):
                cur["started"] = min(started, manifest["started"])
            cur["workers"] = sorted(workers)

        merge_json(run_dir / RUN_JSON, update, _run_lock(run_dir))

    def _camera_file(self, directory: Path, cam: str, suffix: str) -> Path:
        """The one place a camera name from the wire becomes a path: ``<directory>/<cam><suffix>``
        when ``cam`` passes :func:`genmanip_results.paths.safe_file` (one plain name, nothing that
        resolves out of ``directory`` or the results root); else :class:`UnsafePathError`."""
        path = safe_file(directory, cam, suffix=suffix, field="camera")
        if not is_within(path, self._root_resolved):
            raise UnsafePathError(f"camera: {cam[:80]!r}: {directory.name} resolves outside the results root")
        return path

    def _has_frames(self, directory: Path, cam: str) -> bool:
        """Are ``cam``'s frames there to finish the episode with: its spool, or (a completion cut
        short after moving it) its frame store?"""
        return (self._camera_file(directory / FRAMES_DIR, cam, FRAME_SPOOL_SUFFIX).is_file()
                or self._camera_file(directory, cam, FRAME_STORE_SUFFIX).is_file())

    def _open_spool(self, ep: _Episode, cam: str) -> Any:
        """Create the frame spool of ``cam`` (a new file: never one that is there already); a
        camera name that cannot be a file name refuses the episode's recording."""
        try:
            path = self._camera_file(ep.directory / FRAMES_DIR, cam, FRAME_SPOOL_SUFFIX)
            return create_exclusive(path, within=self._root_resolved, field="camera")
        except (UnsafePathError, FileExistsError) as exc:
            what = (f"camera: the server's camera name {cam[:80]!r} (from its video.<camera>_view key) "
                    f"cannot be a file name ({exc})")
            self._refused.add(ep.directory)  # (before _w_abort removes the notes: see _write_pending)
            self._w_abort(ep, f"recording refused: {what}")
            raise RecordingError(
                f"{what}; refusing to record episode {ep.episode_id!r}; {_NOTHING_OUTSIDE}",
                hint="camera names must be plain names (letters, digits, _ . @ + = -); "
                "or run with --no-record",
            ) from exc

    def _safe_dir(self, directory: Path) -> Path:
        # Checked after mkdir too: the directories just made may have been reached through a
        # symlink (or one swapped in meanwhile).
        for made in (False, True):
            if made:
                directory.mkdir(parents=True, exist_ok=True)
            if not is_within(directory, self._root_resolved):
                raise EpisodeIdError(
                    f"episode directory {directory} resolves outside the results root (symlink?); "
                    "refusing to write there"
                )
        return directory

    def _w_begin(self, ep: _Episode) -> None:
        if ep.run_dir not in self._run_dirs:
            self._safe_dir(ep.run_dir)
            self._run_dirs.add(ep.run_dir)
            self._merge_run_json(ep.run_dir)
            self.recover(ep.run_dir)
        # (after recover: an interrupted attempt of this very episode finishes before it is replaced)
        with self._busy_cv:
            while self._busy.get(ep.directory, 0) > 0 and self._error is None:
                self._busy_cv.wait(0.2)
        d = self._safe_dir(ep.directory)
        # A re-run replaces the previous attempt: rows of different attempts never mix.
        if (d / RESULT_JSON).exists():
            # ... and the task's episode_result.json must not keep claiming the replaced attempt
            # (found by tests/reliability/test_hostile_server.py).
            seed_key = ep.seed

            def drop(cur: dict[str, Any]) -> None:
                cur.pop(seed_key, None)

            merge_json(d.parent / EPISODE_RESULT, drop, _run_lock(ep.run_dir))
        with self._attempt_lock(ep):
            for name in _RECORDING_FILES:
                (d / name).unlink(missing_ok=True)
            _unlink_markers(d)
            for pattern in (f"*{VIDEO_SUFFIX}", f"*{VIDEO_PART_SUFFIX}", f"*{FRAME_STORE_SUFFIX}"):
                for old in d.glob(pattern):
                    old.unlink()  # (a symlink: the link only)
            atomic_write_json(
                d / INCOMPLETE,
                {"episode_id": ep.episode_id, "worker_id": ep.worker_id, "started": ep.started,
                 "reason": None, "attempt": ep.attempt},
                fsync=False,
            )
            _fresh_dir(d / FRAMES_DIR)
            self._open[id(ep)] = {
                "steps": create_exclusive(d / STEPS_JSONL, within=self._root_resolved, field=STEPS_JSONL),
                "frames": {},
                "last": {},
            }

    def _attempt_lock(self, ep: _Episode) -> FileLock:
        """The lock under which an attempt takes an episode directory (begin) or gives it up
        (abort): the run's one lock (:func:`_run_lock`), so two recorders (processes, hosts on a
        shared root) never interleave the two on one directory."""
        return FileLock(_run_lock(ep.run_dir), timeout=30.0)

    @staticmethod
    def _owns(ep: _Episode) -> bool:
        """Is the directory's INCOMPLETE marker still this attempt's (nobody has begun it since)?"""
        try:
            info = json.loads((ep.directory / INCOMPLETE).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(info, dict) and info.get("attempt") == ep.attempt

    def _w_frame(self, ep: _Episode, frames: dict[str, Any], index: int) -> None:
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
            fh.write(_LEN.pack(len(data)))
            fh.write(data)
            last[cam] = data

    def _w_rows(self, ep: _Episode, rows: list[dict[str, Any]]) -> None:
        st = self._open.get(id(ep))
        if st is None:
            return
        fh = st["steps"]
        for row in rows:
            fh.write(json.dumps(row, default=json_default, allow_nan=True).encode() + b"\n")

    def _close_files(self, ep: _Episode) -> list[str]:
        st = self._open.pop(id(ep), None)
        if st is None:
            return []
        st["steps"].close()
        for fh in st["frames"].values():
            fh.close()
        return list(st["frames"])

    def _w_orphans(self) -> None:
        for run_dir in sorted(self._recovered.copy()):
            self._mark_orphans(run_dir)

    def _mark_orphans(self, run_dir: Path) -> None:
        """Episodes of ``run_dir`` a dead recorder left awaiting a result that the server no longer
        holds for their worker (see :meth:`results_not_held`): keep them INCOMPLETE, say why."""
        if not self._orphan_workers:
            return
        for marker in sorted(run_dir.rglob(AWAITING_NOTE_GLOB)):
            try:
                info = json.loads(marker.read_text())
                pid = note_pid(marker.name)
                if str(info["episode"]["worker_id"]) not in self._orphan_workers:
                    continue
                # (this process's own notes count as alive: owner_alive says so for its pid)
                if not info.get("parked") and owner_alive(pid, info.get("host")):
                    continue
                eid = str(info["episode"]["episode_id"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            d = marker.parent
            with self._busy_cv:
                finishing = d in self._busy
            if finishing or any(d.glob(PENDING_NOTE_GLOB)):
                # Not lost: its result is saved (a recorder killed after saving it and before its
                # writer removed this note; recover() finishes it, or is finishing it now).
                marker.unlink(missing_ok=True)
                continue
            shutil.rmtree(d / FRAMES_DIR, ignore_errors=True)
            marker.unlink(missing_ok=True)
            atomic_write_json(
                d / INCOMPLETE,
                {
                    "episode_id": eid,
                    "worker_id": info["episode"]["worker_id"],
                    "started": info["episode"].get("started"),
                    "reason": "the server finished this episode, but its result was gone when the run "
                    "resumed: the reply carrying its result was lost (or the server restarted)",
                },
                fsync=False,
            )
            log.warning("episode %s: its result was lost on the way; kept INCOMPLETE", eid)

    def _w_ended(self, ep: _Episode) -> None:
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

    def _w_park(self, ep: _Episode) -> None:
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

    def _adopt(self, result: EpisodeResult) -> None:
        directory, run_dir, _task, _seed, bench, run_id = self._split(result.episode_id)
        if not (self._run_ids.get(run_dir) or run_dir.is_dir()):
            # Not a run recorded here (e.g. the previous client did not record): nothing to mark.
            log.info("result of %s collected from the server: its run is not recorded here", result.episode_id)
            return
        self._safe_dir(directory)
        if not (directory / RESULT_JSON).exists():
            self._finish_awaiting(directory, run_dir, result)
        # Housekeeping after the result is safe on disk.
        self._run_ids.setdefault(run_dir, (bench, run_id))
        if run_dir not in self._run_dirs:
            self._run_dirs.add(run_dir)
            self._merge_run_json(run_dir)
        self.recover(run_dir)

    def _finish_awaiting(self, directory: Path, run_dir: Path, result: EpisodeResult) -> None:
        """Finish ``directory`` from the ``.awaiting_result`` a dead recorder left, with ``result``;
        else keep it INCOMPLETE with the server's result."""
        for marker in sorted(directory.glob(AWAITING_NOTE_GLOB)):
            try:
                info = json.loads(marker.read_text())
                pid = note_pid(marker.name)
                e = info["episode"]
                if str(e["episode_id"]) != result.episode_id:
                    raise ValueError(f"it is for {e['episode_id']}")
                if info.get("parked"):
                    pass  # released by a recorder that closed
                elif parse_pid(pid) == os.getpid():
                    raise ValueError("it belongs to this process")
                elif owner_alive(pid, info.get("host")):
                    raise ValueError("the recorder that wrote it is still running")
                ep = _Episode.from_note(e, directory, run_dir)
                cams = [str(c) for c in info["cameras"]]
                if not all(self._has_frames(directory, c) for c in cams):
                    raise ValueError("its frame spool is missing")
            except (OSError, ValueError, KeyError, TypeError, UnsafePathError) as exc:
                log.warning("cannot finish %s with the collected result from %s: %s", result.episode_id, marker.name, exc)
                continue
            finished = _now()
            atomic_write_json(
                directory / pending_note_name(os.getpid()),
                {
                    "episode": ep.describe(),
                    "result": {"score": result.score, "sr": result.sr},
                    "cameras": cams,
                    "finished": finished,
                    "host": socket.gethostname(),
                },
                fsync=False,
            )
            marker.unlink(missing_ok=True)
            try:
                _truncate_rows(directory / STEPS_JSONL, ep.steps)
            except (OSError, ValueError) as exc:
                log.warning("cannot finish %s with the collected result: %s", result.episode_id, exc)
                _unlink_markers(directory)
                break
            log.info("finishing episode %s with its result collected from the server", result.episode_id)
            self.finished.append((result.success, result.score))
            self._queue_transcode(ep, result, cams, finished)
            return
        # Not finishable (its last steps may not have been recorded): keep it INCOMPLETE, but say
        # what the server made of it.
        self._mark_unfinishable(directory, result)

    def _mark_unfinishable(self, directory: Path, result: EpisodeResult) -> None:
        """Keep an episode the server scored but whose recording is not whole ``INCOMPLETE``, saying
        what the server made of it."""
        marker_path = directory / INCOMPLETE
        try:
            info = json.loads(marker_path.read_text())
            if not isinstance(info, dict):
                info = {}
        except (OSError, ValueError):
            # The client that ran it stopped before any of it reached the disk (its writer was
            # behind: the queue is bounded, not empty).
            info = {"episode_id": result.episode_id, "reason": "the client stopped before its recording began"}
        info["server_result"] = {"score": result.score, "sr": result.sr}
        info["server_note"] = (
            "the server finished this episode after its recording stopped; its last steps may be "
            "missing here, so it is not counted as recorded"
        )
        atomic_write_json(marker_path, info, fsync=False)
        log.warning(
            "episode %s: finished on the server (score %g) but not fully recorded here; kept INCOMPLETE",
            result.episode_id, result.score,
        )

    def _w_abort(self, ep: _Episode, reason: str) -> None:
        self._aborts_queued.discard(ep.directory)
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
            _unlink_markers(ep.directory)
            atomic_write_json(
                ep.directory / INCOMPLETE,
                {"episode_id": ep.episode_id, "worker_id": ep.worker_id, "started": ep.started,
                 "reason": reason, "attempt": ep.attempt},
                fsync=False,
            )

    def _write_pending(self, ep: _Episode, result: EpisodeResult, finished: str) -> None:
        """Persist a just-received result at once, from the step loop's thread.

        The server hands a result out once and will not run that seed again, so it must not wait
        in the writer's queue: a kill would lose it. The episode's rows and frames are already on
        disk (the writer caught up when the server ended the episode, see ``episode_ended``);
        with this file, a recorder resuming the run finishes the episode (``recover``).
        """
        try:
            self._safe_dir(ep.directory)
            atomic_write_json(
                ep.directory / pending_note_name(os.getpid()),
                {
                    "episode": ep.describe(),
                    "result": {"score": result.score, "sr": result.sr},
                    "cameras": list(ep.cameras),
                    "finished": finished,
                    # recovery leaves episodes of live recorders (pid in the file name) alone
                    "host": socket.gethostname(),
                },
                fsync=False,
            )
            if ep.directory in self._refused:
                # The writer refused this episode meanwhile (a hostile camera name): its notes
                # are removed, this one included (whichever of the two threads came last).
                (ep.directory / pending_note_name(os.getpid())).unlink(missing_ok=True)
        except OSError as exc:
            raise RecordingError(
                f"recording failed: cannot save the result of {ep.episode_id}: {exc}",
                hint="check free disk space (or run with --no-record)",
            ) from exc

    def _w_finish(self, ep: _Episode, result: EpisodeResult, finished: str) -> None:
        cams = self._close_files(ep)
        for marker in ep.directory.glob(AWAITING_NOTE_GLOB):
            marker.unlink(missing_ok=True)
        self._queue_transcode(ep, result, cams, finished)

    def _queue_transcode(self, ep: _Episode, result: EpisodeResult, cams: list[str], finished: str) -> None:
        with self._busy_cv:
            self._busy[ep.directory] = self._busy.get(ep.directory, 0) + 1
        self._tq.put((ep, result, cams, finished))

    def _run_dirs_of(self, run_id: str) -> list[Path]:
        """Every ``<root>/<benchmark>/<run_id>`` there is (none for an unsafe run id)."""
        try:
            safe_relative_path(run_id, field="run_id")
        except ValidationError:
            return []
        return [bench / run_id for bench in (sorted(self.root.iterdir()) if self.root.is_dir() else [])
                if bench.is_dir() and not bench.is_symlink() and (bench / run_id).is_dir()]

    def recover_run_id(self, run_id: str) -> int:
        """:meth:`recover` every ``<root>/<benchmark>/<run_id>`` (a resumed run)."""
        return sum(self.recover(run_dir) for run_dir in self._run_dirs_of(run_id))

    def awaiting_workers(self, run_id: str) -> list[str]:
        """The worker ids on which a stopped recorder left an episode of run ``run_id`` awaiting
        its result (``.awaiting_result``: the server ended the episode, the result had not come):
        a client on them collects the results the server holds (``EvalClient`` ``adopt_on_start``)
        and this recorder finishes the episodes from disk. Notes of a recorder still running (in
        another process) are not counted."""
        out: set[str] = set()
        for run_dir in self._run_dirs_of(run_id):
            for marker in run_dir.rglob(AWAITING_NOTE_GLOB):
                try:
                    info = json.loads(marker.read_text())
                    pid = note_pid(marker.name)
                    if not info.get("parked") and owner_alive(pid, info.get("host")):
                        continue
                    out.add(str(info["episode"]["worker_id"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # damaged: the resume's reset marks such an episode lost
        return sorted(out)

    def recover(self, run_dir: Path) -> int:
        """Finish episodes of ``run_dir`` whose last step was recorded but whose transcoding was
        cut short (the process died): queue their transcodes; return how many were found.

        Safe to call on any run directory: episodes without a pending result are untouched.
        """
        run_dir = Path(run_dir)
        if run_dir in self._recovered or not run_dir.is_dir():
            return 0
        self._recovered.add(run_dir)
        # result.json is written before INCOMPLETE is removed: a kill between the two leaves a
        # finished episode (result.json decides) with a stale marker. Tidy it.
        for stale in run_dir.rglob(INCOMPLETE):
            d = stale.parent
            if (d / RESULT_JSON).is_file() and not d.is_symlink():
                stale.unlink(missing_ok=True)
                _unlink_markers(d)
                shutil.rmtree(d / FRAMES_DIR, ignore_errors=True)
        found = 0
        for pending in sorted(run_dir.rglob(PENDING_NOTE_GLOB)):
            d = pending.parent
            result: EpisodeResult | None = None
            try:
                self._safe_dir(d)
                info = json.loads(pending.read_text())
                pid = note_pid(pending.name)
                if owner_alive(pid, info.get("host")):
                    continue
                try:
                    # Claim it: of several recorders resuming this run, exactly one wins.
                    mine = d / pending_note_name(os.getpid())
                    os.rename(pending, mine)
                except FileNotFoundError:
                    continue
                ep = _Episode.from_note(info["episode"], d, run_dir)
                result = EpisodeResult(
                    episode_id=ep.episode_id, task_name=ep.task_name, seed=ep.seed,
                    score=float(info["result"]["score"]), sr=float(info["result"]["sr"]),
                )
                # (a camera that never sent a frame has no spool file)
                cams = [str(c) for c in info["cameras"] if self._has_frames(d, str(c))]
                if info["cameras"] and not cams:
                    raise ValueError("frame spool missing")
                _truncate_rows(d / STEPS_JSONL, ep.steps)
            except (OSError, ValueError, KeyError, TypeError, UnsafePathError) as exc:
                log.warning("cannot finish the interrupted episode in %s: %s", d, exc)
                if result is not None:
                    mine.unlink(missing_ok=True)
                    self._mark_unfinishable(d, result)
                continue
            log.info("finishing episode %s, interrupted while transcoding", ep.episode_id)
            self._queue_transcode(ep, result, cams, str(info.get("finished") or _now()))
            found += 1
        self._mark_orphans(run_dir)
        return found

    def _w_live(self, run_dir: Path, worker_id: str, frames: dict[str, Any], info: dict[str, Any]) -> None:
        # The live-view contract (file names, the name rule for wire-supplied worker ids and
        # cameras, nothing written out of the run or the results root) is genmanip_results.live,
        # the one viz reads with. Only JPEG bytes are published: frames never get decoded here.
        jpegs = {c: v for c, v in frames.items() if isinstance(v, (bytes, bytearray, memoryview))}
        try:
            write_live_view(run_dir, worker_id, jpegs, info, within=self.root)
        except UnsafePathError as exc:
            # A live view is a convenience: a hostile or odd worker id costs it, not the run.
            log.warning("no live view for worker id %r: %s", worker_id, exc)

    # ------------------------------------------------------------ transcoder thread

    def _transcode_loop(self) -> None:
        while True:
            item = self._tq.get()
            if item is None:
                return
            try:
                if self._error is not None:
                    continue
                if self._cut.is_set() and self.transcode == "inline":
                    # Stopped: no new encoder; the saved result and the spool wait for the resume.
                    self._left.add(item[0].directory)
                    continue
                self._transcode(*item)
            except BaseException as exc:
                status = _signalled_status(exc)
                if status is not None:
                    # A Ctrl-C or SIGTERM reaches the whole process group, ffmpeg included: a stop,
                    # not a failure. The episode keeps its saved result; the resume makes its videos.
                    self._left.add(item[0].directory)
                    if not self._cut_signalled:
                        self._cut_detail = f"a stop signal ended the recording's ffmpeg (exit {status})"
                        self._cut_signalled = True
                    self._cut.set()
                else:
                    self._fail(exc, f"the result of {item[0].episode_id} is kept: its videos are made "
                                    "when the run is resumed with the same run id")
            finally:
                with self._busy_cv:
                    d = item[0].directory
                    self._busy[d] -= 1
                    if not self._busy[d]:
                        del self._busy[d]
                    self._busy_cv.notify_all()

    def _transcode(self, ep: _Episode, result: EpisodeResult, cams: list[str], finished: str) -> None:
        from genmanip_results.frames import finish_spool
        from genmanip_results.video import transcode_jpegs

        d = ep.directory

        def one(cam: str) -> int:
            src = self._camera_file(d / FRAMES_DIR, cam, FRAME_SPOOL_SUFFIX)
            if self.transcode == "deferred":
                # The spool becomes the finished frame store: fsync + rename, no copy, no
                # encoder (an H.264 copy is made when someone needs one: genmanip_results.frames).
                return finish_spool(src, self._camera_file(d, cam, FRAME_STORE_SUFFIX))
            dst = self._camera_file(d, cam, VIDEO_SUFFIX)
            if not src.is_file() and self._camera_file(d, cam, FRAME_STORE_SUFFIX).is_file():
                src = self._camera_file(d, cam, FRAME_STORE_SUFFIX)  # a deferred run resumed inline
            n = transcode_jpegs(iter_frame_file(src), dst, fps=self.fps, nice=self.nice, threads=1)
            if src.name.endswith(FRAME_STORE_SUFFIX) and src.parent == d:
                src.unlink(missing_ok=True)
            return n

        if self.transcode == "deferred":
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

        merge_json(d.parent / EPISODE_RESULT, update, _run_lock(ep.run_dir))
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
        _unlink_markers(d)
        shutil.rmtree(d / FRAMES_DIR, ignore_errors=True)
        if self.on_episode_complete is not None:
            self.on_episode_complete(d)


def _until_done(loop: Callable[[], None], done: threading.Event) -> None:
    """A recorder thread's body: ``loop``, then ``done`` set, however the loop ended."""
    try:
        loop()
    finally:
        done.set()


#: ffmpeg's exit status when SIGINT or SIGTERM stopped it (its own handler), and the statuses of an
#: ffmpeg killed by a stop signal outright.
_FFMPEG_SIGNALLED = (255, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP)


def _signalled_status(exc: BaseException) -> int | None:
    """The exit status of the ffmpeg ``exc`` comes from when a stop signal (Ctrl-C, SIGTERM,
    hang-up) ended it, else None."""
    from genmanip_results.video import FfmpegError

    if isinstance(exc, FfmpegError) and exc.returncode in _FFMPEG_SIGNALLED:
        return exc.returncode
    return None


def _merge_segment(cur: dict[str, Any], segment: Mapping[str, Any], *, add: bool) -> None:
    """Merge ``segment`` into the entry of ``run.json`` ``cur`` with its id: one entry per
    invocation (its processes share the id), so a resumed run keeps the story of every
    invocation, with its policy, versions and time range. Without ``add``, a segment the run
    does not have yet is not added."""
    segs = [x for x in cur.get("segments") or [] if isinstance(x, dict)]
    mine = next((x for x in segs if x.get("id") == segment.get("id")), None)
    if mine is None:
        if not add:
            return
        segs.append(dict(segment))
    else:
        seg_workers = set(mine.get("workers") or []) | set(segment.get("workers") or [])
        # The invocation started when its first process did: an eval actor that replaces a dead
        # one (--launcher ray) joins the segment later. (ISO times in UTC: compared as text.)
        starts = [x for x in (mine.get("started"), segment.get("started")) if isinstance(x, str)]
        mine.update(segment)
        mine["workers"] = sorted(seg_workers)
        if starts:
            mine["started"] = min(starts)
    cur["segments"] = segs


def finish_segment(run_dir: str | os.PathLike[str], segment_id: str, **fields: Any) -> None:
    """Merge ``fields`` (``finished``, ``outcome``, ``episodes``, ``steps``) into segment
    ``segment_id`` of ``run_dir``'s ``run.json``, under the run's lock; a run without that
    segment is left alone.

    For the invocation that ran its workers in several processes (``gmp eval --processes``):
    each process recorded the segment as running, and the invocation ends it once, with the
    whole run's outcome and totals (a process's own are only its share).

    Raises:
        RecordingError: ``run.json`` cannot be updated (disk full, read-only).
    """
    d = Path(run_dir)
    if not (d / RUN_JSON).is_file():
        return  # (merge_json would make one: a run directory is the recorder's to make)
    try:
        merge_json(d / RUN_JSON, lambda cur: _merge_segment(cur, {**fields, "id": segment_id}, add=False),
                   _run_lock(d))
    except OSError as exc:  # a typed error, not a crash (as Recorder.update_manifest)
        raise RecordingError(f"cannot update {d / RUN_JSON}: {exc}",
                             hint="check free disk space (or run with --no-record)") from exc


def _run_lock(run_dir: Path) -> Path:
    """The one lock file of a run, hidden in its directory (``.run.json.lock``): ``run.json``,
    every task's ``episode_result.json`` and the taking of an episode directory are all changed
    under it.

    One file per run, because a lock file cannot be removed once released: ``flock`` locks the
    inode, so a process still waiting on an unlinked file would get "the lock" while a newcomer
    locks a new file of the same name (``genmanip_runtime.atomic.FileLock`` leaves its file for
    that reason). A lock per task (the reference client's ``episode_result.lock``) would leave a
    visible file in every task directory; each holder keeps this one for milliseconds (a JSON
    merge, a few renames), so the workers of a run sharing it costs nothing measurable.
    """
    return run_dir / RUN_JSON_LOCK


def _unlink_markers(directory: Path) -> None:
    for pattern in _MARKER_GLOBS:
        for marker in directory.glob(pattern):
            marker.unlink(missing_ok=True)


def _truncate_rows(path: Path, n: int) -> None:
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
