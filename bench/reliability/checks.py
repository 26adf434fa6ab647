"""Integrity checks of a client-layout results tree, shared by the fault runs (items 1-4).

:func:`check_run` walks ``<results>/<benchmark>/<run_id>/`` and returns every problem found:
a finished episode (``result.json`` present) must have ``steps.jsonl`` whose every row parses and
whose ``step`` indices are exactly ``0..n-1``, ``result.json`` consistent with it (``steps``,
``episode_id``), every camera video decodable with one frame per observation; each task's
``episode_result.json`` must list exactly the finished seeds with the same score (plus seeds whose
result is saved in ``.pending_result`` while a kill cut their transcode short: reported as
``finishing``); an unfinished episode directory must carry ``INCOMPLETE``. Reported apart, not
problems: ``INCOMPLETE`` left next to a ``result.json`` (``stale_markers``; ``result.json``
decides, the next run tidies it). Optionally the server's count of executed actions per episode is
compared with the rows (a replayed step shows up there).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunCheck", "check_run", "find_run_dir", "python_env"]


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a ``python -m genmanip`` child: unbuffered, no colour, no stray tokens."""
    env = {k: v for k, v in os.environ.items() if k not in ("GMP_TOKEN", "GENMANIP_RESULT_DIR")}
    env.update({"PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    env.update(extra)
    return env


GMP = [sys.executable, "-m", "genmanip"]


@dataclass
class RunCheck:
    """What :func:`check_run` found. ``problems`` empty means the tree is consistent."""

    finished: dict[str, Path] = field(default_factory=dict)  # episode_id -> dir
    incomplete: dict[str, Path] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    videos_checked: int = 0
    #: cameras of finished episodes with a ``<cam>.mp4.part`` (a video being made, or a leftover)
    videos_being_made: int = 0
    #: finished episodes (result.json) still carrying INCOMPLETE: a kill between writing the one
    #: and removing the other; result.json decides, and the next run's recorder tidies it
    stale_markers: list[str] = field(default_factory=list)
    #: episodes whose result is saved and listed in episode_result.json while their transcode was
    #: cut short (no result.json yet): the next run finishes them
    finishing: list[str] = field(default_factory=list)

    @property
    def finished_seeds(self) -> set[tuple[str, str]]:
        return {(str(p.parent), p.name) for p in self.finished.values()}


def find_run_dir(results: Path) -> Path | None:
    runs = sorted(p.parent for p in results.glob("*/*/run.json"))
    return runs[0] if runs else None


def _video_frames(path: Path) -> int:
    """Decode every frame (ffmpeg to the null muxer, errors fatal); return the frame count.

    A JPEG frame store (``<cam>.jpegs``) is decoded frame by frame by ffmpeg too
    (:func:`genmanip_results.frames.decode_store_frames`, ``-xerror``)."""
    import subprocess

    from genmanip_results.video import ffmpeg_executable, video_info

    if path.name.endswith(".jpegs"):
        from genmanip_results.frames import decode_store_frames

        return sum(1 for _ in decode_store_frames(path, size=(16, 16)))

    res = subprocess.run([ffmpeg_executable(), "-nostdin", "-v", "error", "-xerror", "-i", str(path),
                          "-f", "null", "-"], capture_output=True, timeout=120, check=False)
    if res.returncode != 0 or res.stderr.strip():
        raise RuntimeError(f"ffmpeg decode failed: {res.stderr.decode('utf-8', 'replace')[-200:]}")
    return int(video_info(path).n_frames)


def check_run(run_dir: Path, *, server_steps: Mapping[str, int] | None = None,
              decode_videos: bool = True) -> RunCheck:
    res = RunCheck()
    if not run_dir.is_dir():
        res.problems.append(f"{run_dir}: missing")
        return res
    try:
        json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as exc:
        res.problems.append(f"run.json: {exc}")
    episode_dirs = [p.parent for p in run_dir.rglob("steps.jsonl")]
    episode_dirs += [p.parent for p in run_dir.rglob("INCOMPLETE") if p.parent not in episode_dirs]
    by_task: dict[Path, dict[str, float]] = {}
    for d in sorted(set(episode_dirs)):
        rel = d.relative_to(run_dir)
        result = d / "result.json"
        if not result.exists():
            eid = str(rel)
            res.incomplete[eid] = d
            if not (d / "INCOMPLETE").exists():
                res.problems.append(f"{rel}: unfinished but no INCOMPLETE marker")
            continue
        try:
            info = json.loads(result.read_text())
        except ValueError as exc:
            res.problems.append(f"{rel}/result.json: does not parse ({exc})")
            continue
        eid = str(info.get("episode_id"))
        res.finished[eid] = d
        if (d / "INCOMPLETE").exists():
            res.stale_markers.append(str(rel))
        rows: list[dict[str, Any]] = []
        try:
            for line in (d / "steps.jsonl").read_text().splitlines():
                rows.append(json.loads(line))
        except (OSError, ValueError) as exc:
            res.problems.append(f"{rel}/steps.jsonl: row {len(rows)}: {exc}")
        steps = [r.get("step") for r in rows]
        if steps != list(range(len(rows))):
            res.problems.append(f"{rel}/steps.jsonl: step indices are not 0..{len(rows) - 1}")
        if info.get("steps") != len(rows):
            res.problems.append(f"{rel}: result.json steps={info.get('steps')} but {len(rows)} rows")
        res.rows[eid] = len(rows)
        if server_steps is not None and eid in server_steps and server_steps[eid] != len(rows):
            res.problems.append(
                f"{rel}: the server executed {server_steps[eid]} actions, steps.jsonl has {len(rows)}")
        frames = {r.get("frame") for r in rows if r.get("frame") is not None}
        # Every state of a camera's frames (genmanip_results.frames): a finished episode holds
        # its frame store (<cam>.jpegs), its mp4, or both; a <cam>.mp4.part is a video being made
        # (or a killed maker's leftover: the next one replaces it), never a camera's only copy.
        from genmanip_results.frames import episode_streams

        streams = episode_streams(d)
        if frames and not streams:
            res.problems.append(f"{rel}: rows reference frames but there is no video")
        for cam, s in streams.items():
            if s.store is None and s.video is None:
                res.problems.append(f"{rel}: camera {cam}: finished, but its frames are only spooled")
                continue
            if s.making_video:
                res.videos_being_made += 1
            if not decode_videos:
                continue
            counts: dict[str, int] = {}
            for f in (s.store, s.video):
                if f is None:
                    continue
                try:
                    counts[f.name] = _video_frames(f)
                except Exception as exc:
                    res.problems.append(f"{rel}/{f.name}: does not decode ({exc})"[:300])
                    continue
                res.videos_checked += 1
                if frames and counts[f.name] < max(frames) + 1:
                    res.problems.append(f"{rel}/{f.name}: {counts[f.name]} frames, rows reference frame {max(frames)}")
            if len(set(counts.values())) > 1:
                res.problems.append(f"{rel}: camera {cam}: frame store and mp4 differ ({counts})")
        by_task.setdefault(d.parent, {})[d.name] = info.get("score")
    for task_dir in {p.parent for p in run_dir.rglob("episode_result.json")} | set(by_task):
        path = task_dir / "episode_result.json"
        try:
            merged = json.loads(path.read_text()) if path.exists() else {}
        except ValueError as exc:
            res.problems.append(f"{path.relative_to(run_dir)}: does not parse ({exc})")
            continue
        done = by_task.get(task_dir, {})
        # A seed whose result is saved (.pending_result) while its videos and result.json are
        # still being made (the transcode was cut short by a kill) is already listed: the index is
        # merged first, so it never misses a finished episode. The next run finishes it.
        finishing = {seed for seed in set(merged) - set(done)
                     if _pending_score(task_dir / seed) == merged[seed].get("score")}
        res.finishing += [str((task_dir / s).relative_to(run_dir)) for s in sorted(finishing)]
        if set(merged) - finishing != set(done):
            res.problems.append(
                f"{task_dir.relative_to(run_dir)}/episode_result.json lists {sorted(merged)}, "
                f"finished episodes are {sorted(done)}")
        for seed, score in done.items():
            if seed in merged and merged[seed].get("score") != score:
                res.problems.append(f"{task_dir.relative_to(run_dir)}/{seed}: score differs")
    return res


def _pending_score(episode_dir: Path) -> float | None:
    for pending in episode_dir.glob(".pending_result.*.json"):
        try:
            return float(json.loads(pending.read_text())["result"]["score"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def unrecorded_with_reason(episode_dir: Path) -> bool:
    """A server-finished episode the client did not record is acceptable only when its INCOMPLETE
    marker says why: the reply carrying its result was lost, or the result was collected but the
    recording lacks its last steps (``server_result``, e.g. a chunk's reply lost, or a kill in the
    milliseconds between the last action and its row reaching the disk)."""
    try:
        info = json.loads((episode_dir / "INCOMPLETE").read_text())
    except (OSError, ValueError):
        return False
    reason = str(info.get("reason") or "")
    # (or the server lost the worker -- it restarted -- while the request that ended the episode
    # was unanswered: the dead server scored it, the client cannot know)
    return ("server_result" in info or "reply carrying its result was lost" in reason
            or "server lost the worker" in reason)

