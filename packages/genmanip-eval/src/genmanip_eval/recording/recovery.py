"""The recovery notes (:class:`Recovery`): this recorder's pending result, and finishing what a
previous recorder left.

Internal to :mod:`genmanip_eval.recording` (not :mod:`genmanip_eval.recovery`, which is the
client's recovery of failed requests). A received result is saved at once, from the step loop, as
``.pending_result.<pid>.json`` (:meth:`Recovery.write_pending`); the writer thread leaves
``.awaiting_result.<pid>.json`` when the server ends an episode (``Writer._w_ended``: it must
follow the writer's flushes). A later recorder on the run claims the notes of a dead one: it
finishes pending episodes (:meth:`Recovery.recover`), finishes awaiting ones with a result
collected from the server (:meth:`Recovery.adopt`), and keeps those it cannot finish exactly
``INCOMPLETE`` with the reason (:meth:`Recovery.mark_unfinishable`, :meth:`Recovery.mark_orphans`).

Threads: ``write_pending`` and ``adopt`` run on the step loop; ``recover`` on the step loop (a
resumed run, a collected result) or on the writer thread (its first sight of a run directory);
``mark_orphans`` on the writer thread, or within ``recover``. The finishing itself is queued to
the transcoder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from collections.abc import Collection
from pathlib import Path

from genmanip_protocol.errors import ValidationError
from genmanip_protocol.schema import EpisodeResult, safe_relative_path
from genmanip_results.layout import (
    AWAITING_NOTE_GLOB,
    FRAMES_DIR,
    INCOMPLETE,
    PENDING_NOTE_GLOB,
    RESULT_JSON,
    STEPS_JSONL,
    note_pid,
    pending_note_name,
)
from genmanip_results.live import owner_alive, parse_pid
from genmanip_results.paths import UnsafePathError
from genmanip_runtime.atomic import atomic_write_json

from ..errors import RecordingError
from .episode import Episode, now
from .files import SafePaths, truncate_rows, unlink_markers
from .runs import Runs
from .transcoder import Transcoder

__all__ = ["Recovery"]

log = logging.getLogger("genmanip_eval.recording")


class Recovery:
    """A recorder's recovery notes: written for its own episodes, claimed from dead recorders'.

    Args:
        finished: the recorder's list of finished episodes (``Recorder.finished``): an episode
            finished with a collected result counts there.
    """

    def __init__(
        self, paths: SafePaths, runs: Runs, transcoder: Transcoder, finished: list[tuple[bool, float]]
    ) -> None:
        self._paths = paths
        self._runs = runs
        self._transcoder = transcoder
        self._finished = finished
        #: run directories recovered (once each)
        self.recovered: set[Path] = set()
        #: worker ids on which the server holds no result (``Recorder.results_not_held``)
        self.orphan_workers: set[str] = set()

    def write_pending(self, ep: Episode, result: EpisodeResult, finished: str, *, refused: Collection[Path]) -> None:
        """Persist a just-received result at once, from the step loop's thread.

        The server hands a result out once and will not run that seed again, so it must not wait
        in the writer's queue: a kill would lose it. The episode's rows and frames are already on
        disk (the writer caught up when the server ended the episode, see ``episode_ended``);
        with this file, a recorder resuming the run finishes the episode (``recover``).
        ``refused``: the writer's refused episode directories (read after the note is written).
        """
        try:
            self._paths.safe_dir(ep.directory)
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
            if ep.directory in refused:
                # The writer refused this episode meanwhile (a hostile camera name): its notes
                # are removed, this one included (whichever of the two threads came last).
                (ep.directory / pending_note_name(os.getpid())).unlink(missing_ok=True)
        except OSError as exc:
            raise RecordingError(
                f"recording failed: cannot save the result of {ep.episode_id}: {exc}",
                hint="check free disk space (or run with --no-record)",
            ) from exc

    def run_dirs_of(self, run_id: str) -> list[Path]:
        """Every ``<root>/<benchmark>/<run_id>`` there is (none for an unsafe run id)."""
        try:
            safe_relative_path(run_id, field="run_id")
        except ValidationError:
            return []
        root = self._paths.root
        return [bench / run_id for bench in (sorted(root.iterdir()) if root.is_dir() else [])
                if bench.is_dir() and not bench.is_symlink() and (bench / run_id).is_dir()]

    def recover_run_id(self, run_id: str) -> int:
        """:meth:`recover` every ``<root>/<benchmark>/<run_id>`` (a resumed run)."""
        return sum(self.recover(run_dir) for run_dir in self.run_dirs_of(run_id))

    def awaiting_workers(self, run_id: str) -> list[str]:
        """The worker ids on which a stopped recorder left an episode of run ``run_id`` awaiting
        its result (see ``Recorder.awaiting_workers``)."""
        out: set[str] = set()
        for run_dir in self.run_dirs_of(run_id):
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
        if run_dir in self.recovered or not run_dir.is_dir():
            return 0
        self.recovered.add(run_dir)
        # result.json is written before INCOMPLETE is removed: a kill between the two leaves a
        # finished episode (result.json decides) with a stale marker. Tidy it.
        for stale in run_dir.rglob(INCOMPLETE):
            d = stale.parent
            if (d / RESULT_JSON).is_file() and not d.is_symlink():
                stale.unlink(missing_ok=True)
                unlink_markers(d)
                shutil.rmtree(d / FRAMES_DIR, ignore_errors=True)
        found = 0
        for pending in sorted(run_dir.rglob(PENDING_NOTE_GLOB)):
            d = pending.parent
            result: EpisodeResult | None = None
            try:
                self._paths.safe_dir(d)
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
                ep = Episode.from_note(info["episode"], d, run_dir)
                result = EpisodeResult(
                    episode_id=ep.episode_id, task_name=ep.task_name, seed=ep.seed,
                    score=float(info["result"]["score"]), sr=float(info["result"]["sr"]),
                )
                # (a camera that never sent a frame has no spool file)
                cams = [str(c) for c in info["cameras"] if self._paths.has_frames(d, str(c))]
                if info["cameras"] and not cams:
                    raise ValueError("frame spool missing")
                truncate_rows(d / STEPS_JSONL, ep.steps)
            except (OSError, ValueError, KeyError, TypeError, UnsafePathError) as exc:
                log.warning("cannot finish the interrupted episode in %s: %s", d, exc)
                if result is not None:
                    mine.unlink(missing_ok=True)
                    self.mark_unfinishable(d, result)
                continue
            log.info("finishing episode %s, interrupted while transcoding", ep.episode_id)
            self._transcoder.submit(ep, result, cams, str(info.get("finished") or now()))
            found += 1
        self.mark_orphans(run_dir)
        return found

    def mark_orphans(self, run_dir: Path) -> None:
        """Episodes of ``run_dir`` a dead recorder left awaiting a result that the server no longer
        holds for their worker (see ``Recorder.results_not_held``): keep them INCOMPLETE, say why."""
        if not self.orphan_workers:
            return
        for marker in sorted(run_dir.rglob(AWAITING_NOTE_GLOB)):
            try:
                info = json.loads(marker.read_text())
                pid = note_pid(marker.name)
                if str(info["episode"]["worker_id"]) not in self.orphan_workers:
                    continue
                # (this process's own notes count as alive: owner_alive says so for its pid)
                if not info.get("parked") and owner_alive(pid, info.get("host")):
                    continue
                eid = str(info["episode"]["episode_id"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            d = marker.parent
            finishing = self._transcoder.is_busy(d)
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

    def adopt(self, result: EpisodeResult, directory: Path, run_dir: Path, bench: str, run_id: str) -> None:
        """Finish (or mark) the episode ``result`` is for, at ``directory`` of ``run_dir``
        (``Recorder.adopt_result``, on the step loop; ``OSError`` when its files cannot be written)."""
        if not (self._runs.ids.get(run_dir) or run_dir.is_dir()):
            # Not a run recorded here (e.g. the previous client did not record): nothing to mark.
            log.info("result of %s collected from the server: its run is not recorded here", result.episode_id)
            return
        self._paths.safe_dir(directory)
        if not (directory / RESULT_JSON).exists():
            self._finish_awaiting(directory, run_dir, result)
        # Housekeeping after the result is safe on disk.
        self._runs.ids.setdefault(run_dir, (bench, run_id))
        if run_dir not in self._runs.dirs:
            self._runs.dirs.add(run_dir)
            self._runs.merge_run_json(run_dir)
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
                ep = Episode.from_note(e, directory, run_dir)
                cams = [str(c) for c in info["cameras"]]
                if not all(self._paths.has_frames(directory, c) for c in cams):
                    raise ValueError("its frame spool is missing")
            except (OSError, ValueError, KeyError, TypeError, UnsafePathError) as exc:
                log.warning("cannot finish %s with the collected result from %s: %s", result.episode_id, marker.name, exc)
                continue
            finished = now()
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
                truncate_rows(directory / STEPS_JSONL, ep.steps)
            except (OSError, ValueError) as exc:
                log.warning("cannot finish %s with the collected result: %s", result.episode_id, exc)
                unlink_markers(directory)
                break
            log.info("finishing episode %s with its result collected from the server", result.episode_id)
            self._finished.append((result.success, result.score))
            self._transcoder.submit(ep, result, cams, finished)
            return
        # Not finishable (its last steps may not have been recorded): keep it INCOMPLETE, but say
        # what the server made of it.
        self.mark_unfinishable(directory, result)

    def mark_unfinishable(self, directory: Path, result: EpisodeResult) -> None:
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
