"""The run directories a recorder writes to and their ``run.json`` (:class:`Runs`), the run's one
lock (:func:`run_lock`), and the end of an invocation's segment (:func:`finish_segment`).

Internal to :mod:`genmanip_eval.recording` (``finish_segment`` is re-exported there). ``run.json``
is merged, never overwritten: several recorders (processes, hosts on a shared root, the segments
of a resumed run) write into one run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genmanip_results.layout import RUN_JSON, RUN_JSON_LOCK
from genmanip_runtime.atomic import merge_json

from ..errors import RecordingError

__all__ = ["Runs", "finish_segment", "run_lock"]


class Runs:
    """The run directories one recorder has written to, their ids, and the manifest it stamps
    into each one's ``run.json``.

    Shared by the step loop and the writer thread, as the single recorder class shared them: the
    step loop sets ``ids`` (an episode begins, a result is collected) and the manifest; the writer
    thread adds a run directory at its first sight of it (the step loop too, for a collected
    result) and merges ``run.json``; the step loop merges it again at the end (``update_manifest``).
    """

    def __init__(self, manifest: dict[str, Any]) -> None:
        #: fields for ``run.json`` (``Recorder.manifest``)
        self.manifest = manifest
        #: run directories written so far (``Recorder.run_dirs``)
        self.dirs: set[Path] = set()
        #: run directory -> (benchmark, run id), as the episode ids name them
        self.ids: dict[Path, tuple[str, str]] = {}

    def merge_run_json(self, run_dir: Path) -> None:
        manifest = dict(self.manifest)

        def update(cur: dict[str, Any]) -> None:
            workers = set(cur.get("workers") or []) | set(manifest.pop("workers", []) or [])
            started = cur.get("started")
            segment = manifest.pop("segment", None)
            for k, v in manifest.items():
                cur[k] = v
            if isinstance(segment, dict):
                _merge_segment(cur, segment, add=True)
            if run_dir in self.ids:
                cur["benchmark"], cur["run_id"] = self.ids[run_dir]
            if started and manifest.get("started"):
                cur["started"] = min(started, manifest["started"])
            cur["workers"] = sorted(workers)

        merge_json(run_dir / RUN_JSON, update, run_lock(run_dir))


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
                   run_lock(d))
    except OSError as exc:  # a typed error, not a crash (as Recorder.update_manifest)
        raise RecordingError(f"cannot update {d / RUN_JSON}: {exc}",
                             hint="check free disk space (or run with --no-record)") from exc


def run_lock(run_dir: Path) -> Path:
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
