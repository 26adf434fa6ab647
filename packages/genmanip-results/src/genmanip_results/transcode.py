"""``gmp transcode [RUN...]``: make the H.264 mp4 of every finished episode that has only its JPEG
frame store (``gmp eval --transcode deferred``, the default), in an explicit pass.

Each video is made by :func:`genmanip_results.frames.ensure_video` (under the episode's lock,
atomic, registered for ``gmp clean``). Unfinished episodes (frames still spooled) are skipped:
the ``gmp eval --run-id`` that resumes the run finishes them. Data on stdout (one line per video
made, ``--json`` for a summary object); talk on stderr.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.console import Console

from .discovery import RunInfo, find_runs

__all__ = ["transcode"]


def _runs(specs: list[str], root: str | None) -> list[RunInfo]:
    from .compare import resolve_run
    from .roots import search_roots

    if specs:
        return [resolve_run(s, root) for s in specs]
    out: list[RunInfo] = []
    seen: set[Path] = set()
    for r in search_roots(root):
        if Path(r).is_dir():
            for info in find_runs(r):
                if Path(info.path).resolve() not in seen:
                    seen.add(Path(info.path).resolve())
                    out.append(info)
    return out


def transcode(
    *,
    runs: list[str],
    root: str | None,
    jobs: int,
    drop_frames: bool,
    as_json: bool,
    console: Console,
) -> int:
    """Make the missing mp4s of ``runs`` (every run found when none is named); exit 10 when there
    was nothing to make, 1 when any video failed (the others are made)."""
    from .frames import episode_streams, transcode_episode

    console = console or Console()
    todo: list[tuple[RunInfo, Path]] = []
    skipped = 0
    for run in _runs(list(runs or []), root):
        for ep in run.episodes:
            streams = episode_streams(ep.path)
            if not ep.complete:
                skipped += any(s.state == "spooled" for s in streams.values())
                continue
            if any(s.video is None or (drop_frames and s.store is not None) for s in streams.values()):
                todo.append((run, Path(ep.path)))
    made: list[str] = []
    failed: list[str] = []

    def one(item: tuple[RunInfo, Path]) -> tuple[Path, list[Path] | str]:
        run, d = item
        before = {s.video for s in episode_streams(d).values() if s.video is not None}
        try:
            return d, [v for v in transcode_episode(d, within=run.path, nice=10, drop_frames=drop_frames)
                       if v not in before]
        except GenmanipError as exc:
            return d, str(exc)
        except OSError as exc:
            return d, f"{exc.strerror or exc}"

    with ThreadPoolExecutor(max_workers=max(1, int(jobs or 1))) as pool:
        for d, res in pool.map(one, todo):
            if isinstance(res, str):
                failed.append(f"{d}: {res}")
                console.error(f"{d}: {res}")
                continue
            for v in res:
                made.append(str(v))
                if not as_json:
                    sys.stdout.write(f"{v}\n")
                    sys.stdout.flush()
    if as_json:
        sys.stdout.write(json.dumps({"made": made, "failed": failed, "skipped_unfinished": skipped}) + "\n")
    if skipped:
        console.info(f"{skipped} unfinished episode(s) skipped: resume their run with gmp eval --run-id")
    console.info(f"{len(made)} video(s) made, {len(failed)} failed, in {len(todo)} episode(s)")
    if failed:
        return int(ExitCode.FAILURE)
    return int(ExitCode.OK if todo else ExitCode.NOTHING_TO_DO)
