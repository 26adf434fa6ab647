"""The public :class:`Recorder`: the step loop's side of recording.

The step loop only classifies and enqueues (cheap): an observation becomes one typed item for the
writer thread (:mod:`.writer`), a request's executed actions one item of rows. What must not wait
in the writer's queue is done here, on the step loop's thread: a received result is saved at once
(:meth:`.recovery.Recovery.write_pending`), after the writer caught up with the episode's end
(``_catch_up``). The Recorder builds the other rooms (:mod:`genmanip_eval.recording`) and owns
the episodes being recorded, per worker.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from genmanip_protocol.errors import ValidationError
from genmanip_protocol.schema import EpisodeResult, safe_relative_path, split_episode_id
from genmanip_results.layout import RUN_JSON
from genmanip_results.stats import wilson_interval
from genmanip_runtime.text import safe_text

from ..errors import EpisodeIdError, RecordingError
from .episode import Episode, now
from .files import NOTHING_OUTSIDE, SafePaths, camera_name, is_gmp_episode_dir
from .recovery import Recovery
from .runs import Runs
from .threads import Abort, Begin, Ended, Failure, Finish, Frame, Live, Orphans, Park, Rows
from .transcoder import Transcoder
from .writer import Writer

__all__ = ["TRANSCODE_MODES", "Recorder"]

log = logging.getLogger("genmanip_eval.recording")

#: ``Recorder(transcode=...)``: when an episode's H.264 videos are made (docs/eval.md).
TRANSCODE_MODES = ("deferred", "inline")


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
        self._paths = SafePaths(self.root, self.root.resolve())
        self._runs = Runs(dict(manifest or {}))
        self.manifest.setdefault("started", now())
        self.live_every = max(0, int(live_every))
        self.fps = fps
        self.nice = nice
        self.on_episode_complete = on_episode_complete
        self._failure = Failure()
        self._episodes: dict[str, Episode] = {}
        self._obs_count: dict[str, int] = {}
        self._own_dirs: set[Path] = set()  # episode directories this recorder has begun
        self._closed = False
        self._reported_left = False
        #: Finished episodes seen by this recorder: (success, score) — for the live running SR.
        self.finished: list[tuple[bool, float]] = []
        #: The server's final metric (progress-prefixed task name -> score/sr), merged over workers.
        self.final_metric: dict[str, Any] = {}
        self._transcoder = Transcoder(self._paths, self._failure, mode=transcode, fps=fps, nice=nice,
                                      on_episode_complete=on_episode_complete)
        self._recovery = Recovery(self._paths, self._runs, self._transcoder, self.finished)
        self._writer = Writer(self._paths, self._runs, self._recovery, self._transcoder, self._failure,
                              queue_size=queue_size)
        self._writer.thread.start()
        self._transcoder.thread.start()

    # ------------------------------------------------------------ producer side (step loop)

    @property
    def manifest(self) -> dict[str, Any]:
        """Fields for ``run.json`` (``update_manifest`` stamps them into every run written)."""
        return self._runs.manifest

    @manifest.setter
    def manifest(self, value: dict[str, Any]) -> None:
        self._runs.manifest = value

    @property
    def run_dirs(self) -> list[Path]:
        """Run directories this recorder has written to."""
        return sorted(self._runs.dirs.copy())  # (the writer thread adds to it)

    def check(self) -> None:
        """Raise :class:`RecordingError` if the writer or transcoder failed, and
        ``KeyboardInterrupt`` once a stop signal ended the recorder's ffmpeg.

        That signal was meant for the run as well (a terminal's Ctrl-C, a SIGTERM of the process
        group), whose own ``KeyboardInterrupt`` may still be on its way, or lost: CPython drops one
        raised inside a finalizer or weakref callback. The run stops as on Ctrl-C either way.
        """
        self._check_failed()
        if self._transcoder.cut_signalled and not self._closed:
            raise KeyboardInterrupt(self._transcoder.cut_detail)

    def _check_failed(self) -> None:
        """Raise :class:`RecordingError` if the writer or transcoder failed.

        The producer side checks only this: a stop that ended ffmpeg must not cut the recording of
        what is already on its way (a result the server handed out once, an episode's last rows);
        the step loop's :meth:`check` stops the run.
        """
        self._failure.check()

    def _sync(self) -> None:
        """Wait until the writer has handled everything queued so far."""
        self._writer.sync()

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
                self._writer.put(Abort(ep, "restarted before the episode ended"))
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
        ep.observed(ts, obs)
        self._writer.put(Frame(ep, frames, ep.frames))
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
            self._writer.put(Live(ep.run_dir, worker_id, frames, live))

    def _refuse(self, worker_id: str, ep: Episode, what: str) -> None:
        """Refuse the recording of ``ep`` (step loop): it is left INCOMPLETE with the reason, and
        a :class:`RecordingError` starting with ``what`` (``"<field>: ..."``) is raised."""
        self._episodes.pop(worker_id, None)
        self._writer.aborts_queued.add(ep.directory)
        self._writer.put(Abort(ep, f"recording refused: {what}"))
        raise RecordingError(
            f"{what}; refusing to record episode {ep.episode_id!r}; {NOTHING_OUTSIDE}",
            hint="the server sent observation keys this client cannot record (or run with --no-record)",
        )

    def _running_sr(self) -> dict[str, Any]:
        n = len(self.finished)
        k = sum(1 for s, _ in self.finished if s)
        lo, hi = wilson_interval(k, n)
        return {"episodes": n, "successes": k, "sr": (k / n) if n else None, "sr_ci95": [lo, hi]}

    def _begin(self, worker_id: str, obs: Any) -> Episode:
        eid = obs.get("episode_id")
        directory, run_dir, task, seed, bench, run_id = self._split(eid)
        # Checked here, where the path was built and before anything is queued or written for
        # this episode (the writer clears the directory for the new attempt; the step loop writes
        # the pending result into it): a directory that exists and holds someone else's files is
        # never taken over.
        if directory not in self._own_dirs and not is_gmp_episode_dir(directory):
            raise RecordingError(
                f"episode: refusing to record episode {str(eid)!r} into {directory}: that "
                f"directory exists and holds files gmp did not write; {NOTHING_OUTSIDE}",
                hint="record into an empty --results-dir",
            )
        self._own_dirs.add(directory)  # (a later attempt may find it mid-rewrite: still ours)
        self._runs.ids[run_dir] = (bench, run_id)
        rid = obs.get("robot_id")
        instr = obs.get("instruction")
        ep = Episode(
            episode_id=str(eid),
            directory=directory,
            run_dir=run_dir,
            task_name=task,
            seed=seed,
            worker_id=worker_id,
            robot_id=None if rid is None else str(rid),
            instruction=None if instr is None else str(instr),
            started=now(),
        )
        self._episodes[worker_id] = ep
        self._writer.put(Begin(ep))
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
        rows = ep.rows(worker_id, actions, obs_timesteps=obs_timesteps, chunk=chunk, latency=latency,
                       batch_size=batch_size)
        self._writer.put(Rows(ep, rows))

    def episode_end(self, worker_id: str, result: EpisodeResult | None, *, lock_lost: bool) -> None:
        """The worker's current episode ended (result None: aborted / not scored)."""
        ep = self._episodes.pop(worker_id, None)
        if ep is None:
            return
        if lock_lost:
            self._writer.put(Abort(ep, "lock_lost: the server aborted the episode and re-queued it"))
        elif result is None:
            self._writer.put(Abort(ep, "the server sent no result for this episode (re-queued)"))
        elif result.episode_id != ep.episode_id:
            log.warning(
                "worker %s: result for %s arrived while recording %s", worker_id, result.episode_id, ep.episode_id
            )
            self._writer.put(Abort(ep, f"result mismatch: server reported {result.episode_id}"))
        else:
            # A recorder that failed (or refused this episode) writes nothing more; one that a stop
            # signal cut still saves the result: the server hands it out once.
            self._check_failed()
            self._catch_up(ep)  # (a caller that did not say the episode ended: see episode_ended)
            self.finished.append((result.success, result.score))
            finished = now()
            self._recovery.write_pending(ep, result, finished, refused=self._writer.refused)
            self._writer.put(Finish(ep, result, finished))

    def episode_ended(self, worker_id: str) -> None:
        """The server ended the worker's episode; its result follows (``episode_end``)."""
        ep = self._episodes.get(worker_id)
        if ep is not None:
            self._catch_up(ep)

    def _catch_up(self, ep: Episode) -> None:
        """Once per episode, at its end: every row and frame on disk (the writer's ``ended``),
        before the result's note is written, which the writer's begin of the episode would wipe."""
        if not ep.awaiting:
            ep.awaiting = True
            self._writer.put(Ended(ep))
            # The client now waits for the server anyway (scoring, the next reset): let the writer
            # catch up, so a kill from here on leaves the episode finishable.
            self._sync()

    def episode_aborted(self, worker_id: str, reason: str) -> None:
        """The worker's episode will not be completed by this client: mark it ``INCOMPLETE``."""
        ep = self._episodes.pop(worker_id, None)
        if ep is not None:
            self._writer.aborts_queued.add(ep.directory)
            self._writer.put(Abort(ep, reason))

    def adopt_result(self, worker_id: str, result: EpisodeResult) -> None:
        """A result for an episode not recorded to the end by this recorder: a previous client's
        (collected when resuming) or one whose recording was aborted. The episode is finished from
        disk when everything but the result is there (``.awaiting_result`` left by the recorder
        that ran it); otherwise its ``INCOMPLETE`` marker records the server's result."""
        try:
            directory, run_dir, _task, _seed, bench, run_id = self._split(result.episode_id)
        except EpisodeIdError as exc:
            log.warning("worker %s: %s", worker_id, exc)
            return
        # At once, on this thread: the server handed this result out once (see write_pending).
        # If this very episode's abort is still queued, the writer must do it first.
        if directory in self._writer.aborts_queued:
            self._sync()
        self._check_failed()  # (not the stop: see episode_end)
        try:
            self._recovery.adopt(result, directory, run_dir, bench, run_id)
        except OSError as exc:
            raise RecordingError(
                f"recording failed: cannot save the collected result of {result.episode_id}: {exc}",
                hint="check free disk space (or run with --no-record)",
            ) from exc

    def results_not_held(self, worker_ids: list[str]) -> None:
        """The server holds no result for these workers (a resumed client asked): an episode a
        dead recorder left awaiting its result on one of them is marked lost, with the reason."""
        self._recovery.orphan_workers.update(str(w) for w in worker_ids)
        self._writer.put(Orphans())

    def worker_finished(self, worker_id: str, metric: Any) -> None:
        """The worker has no task left; ``metric`` is the server's final metric dict."""
        if isinstance(metric, Mapping):
            # run.json keeps it: the results reader derives the run's total episodes from it.
            self.final_metric.update(metric)
        ep = self._episodes.pop(worker_id, None)
        if ep is not None:
            self._writer.put(Abort(ep, "the worker finished without a result for this episode"))

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
            self._transcoder.cut.set()
        stopping: list[KeyboardInterrupt] = []

        def stop_once(exc: KeyboardInterrupt) -> None:
            # A Ctrl-C while this waits only cuts the completions short (what is left is the
            # resume's); a second one stops the waiting.
            if stopping:
                raise exc
            stopping.append(exc)
            self._transcoder.cut.set()

        try:
            for wid, ep in list(self._episodes.items()):
                self._episodes.pop(wid, None)
                try:
                    if ep.awaiting:
                        self._writer.put(Park(ep))
                    else:
                        self._writer.put(Abort(ep, "the run ended before the episode finished"))
                except RecordingError:
                    break
        except KeyboardInterrupt as exc:
            stop_once(exc)  # (those episodes keep their INCOMPLETE marker)
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(2):  # the writer must get its stop, whatever cut the first try short
            try:
                self._writer.request_stop(timeout=5.0)
                break
            except queue.Full:
                break
            except KeyboardInterrupt as exc:
                stop_once(exc)
        for done in (self._writer.done, self._transcoder.done):
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
        if self._transcoder.cut_signalled and not interrupted:
            raise KeyboardInterrupt(self._transcoder.cut_detail)  # (see check: the run's stop, maybe lost)
        self.check()

    def left_for_resume(self) -> list[Path]:
        """Episode directories whose completion a stop cut short (their results are saved; the
        resume of the run, ``gmp eval --run-id``, makes their videos)."""
        return sorted(self._transcoder.left)

    def _report_left(self) -> None:
        left = self._transcoder.left
        if left and not self._reported_left:
            self._reported_left = True
            n = len(left)
            # (the resume command follows: gmp eval prints it after a stop)
            log.warning("interrupted; %d episode%s videos will be made on resume", n, "'s" if n == 1 else "s'")

    def update_manifest(self, **fields: Any) -> None:
        """Merge ``fields`` into ``run.json`` of every run dir written so far (e.g. ``finished``)."""
        self.manifest.update(fields)
        for run_dir in self.run_dirs:
            try:
                self._runs.merge_run_json(run_dir)
            except OSError as exc:  # disk full, read-only: a typed error, not a crash (exit 70)
                raise RecordingError(
                    f"cannot update {run_dir / RUN_JSON}: {exc}",
                    hint="check free disk space (or run with --no-record)",
                ) from exc

    # ------------------------------------------------------------ a previous recorder's notes

    def recover(self, run_dir: Path) -> int:
        """Finish episodes of ``run_dir`` whose last step was recorded but whose transcoding was
        cut short (the process died): queue their transcodes; return how many were found.

        Safe to call on any run directory: episodes without a pending result are untouched.
        """
        return self._recovery.recover(run_dir)

    def recover_run_id(self, run_id: str) -> int:
        """:meth:`recover` every ``<root>/<benchmark>/<run_id>`` (a resumed run)."""
        return self._recovery.recover_run_id(run_id)

    def awaiting_workers(self, run_id: str) -> list[str]:
        """The worker ids on which a stopped recorder left an episode of run ``run_id`` awaiting
        its result (``.awaiting_result``: the server ended the episode, the result had not come):
        a client on them collects the results the server holds (``EvalClient`` ``adopt_on_start``)
        and this recorder finishes the episodes from disk. Notes of a recorder still running (in
        another process) are not counted."""
        return self._recovery.awaiting_workers(run_id)
