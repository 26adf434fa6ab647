"""Submitting a run: bundle, verify, check the previous submission, upload, mark as submitted.

``<run_dir>/submitted.flag`` (JSON; a superset of the reference client's two names) is written
atomically and **only after the leaderboard confirmed** the upload with a submission id. It records
the bundle's content digest, so submitting an unchanged run again is detected and skipped.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from genmanip_results.discovery import RunInfo
from genmanip_runtime.atomic import atomic_write_json, read_json

from .bundle import FLAG_NAME, Bundle, build_bundle, bundle_filename
from .client import LeaderboardClient
from .errors import GenmanipLeaderboardError

__all__ = ["SubmitOutcome", "read_flag", "submit_run", "write_flag"]


@dataclass(frozen=True)
class SubmitOutcome:
    """Result of :func:`submit_run`.

    ``status`` is ``"submitted"`` (uploaded now; ``flag`` is the new marker) or ``"unchanged"``
    (already submitted with identical content to the same leaderboard; nothing was uploaded;
    ``previous`` is the existing marker).
    """

    status: Literal["submitted", "unchanged"]
    run: RunInfo
    bundle_sha256: str
    content_sha256: str
    bundle_size: int
    submission_id: str | None
    status_url: str | None
    flag: dict[str, Any] | None
    previous: dict[str, Any] | None


def read_flag(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``submitted.flag`` (``{}`` when it exists but is not a JSON object), or None."""
    path = Path(run_dir) / FLAG_NAME
    if not path.is_file() or path.is_symlink():
        return None
    try:
        value = read_json(path)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def write_flag(run_dir: str | Path, data: dict[str, Any]) -> Path:
    """Write ``submitted.flag`` atomically."""
    return atomic_write_json(Path(run_dir) / FLAG_NAME, data, sort_keys=True)


def _unchanged(previous: dict[str, Any] | None, bundle: Bundle, leaderboard_name: str) -> bool:
    if previous is None:
        return False
    if "content_sha256" not in previous:
        # A marker of the reference client (only the two names): the content is unknown, so the
        # safe reading is "already submitted"; --force overrides.
        return previous.get("leaderboard_name") in (None, leaderboard_name)
    return (
        previous.get("content_sha256") == bundle.content_sha256
        and previous.get("leaderboard_name") == leaderboard_name
    )


def submit_run(
    run: RunInfo,
    client: LeaderboardClient,
    *,
    submission_name: str,
    leaderboard_name: str,
    include_videos: bool = False,
    force: bool = False,
    progress: Callable[[Bundle], Callable[[int], None] | None] | None = None,
) -> SubmitOutcome:
    """Bundle ``run`` (refusing an incomplete one), verify it and upload it unless unchanged.

    ``progress(bundle)`` may return a callback that receives the bytes sent so far. The bundle is
    built in a private temporary directory (outside the results tree) and removed afterwards.

    Raises:
        IncompleteRunError: the run is not complete (nothing is uploaded).
        UploadError and subclasses: the upload failed; ``submitted.flag`` is not written.
    """
    tmpdir = Path(tempfile.mkdtemp(prefix="gmp-bundle-"))
    try:
        bundle = build_bundle(run, tmpdir / bundle_filename(run.run_id), include_videos=include_videos)
        previous = read_flag(run.path)
        if not force and _unchanged(previous, bundle, leaderboard_name):
            return SubmitOutcome(
                status="unchanged",
                run=run,
                bundle_sha256=bundle.sha256,
                content_sha256=bundle.content_sha256,
                bundle_size=bundle.size,
                submission_id=(previous or {}).get("submission_id"),
                status_url=(previous or {}).get("status_url"),
                flag=None,
                previous=previous,
            )
        callback = progress(bundle) if progress is not None else None
        result = client.upload(
            bundle.path,
            submission_name=submission_name,
            leaderboard_name=leaderboard_name,
            filename=bundle_filename(run.run_id),
            progress=callback,
        )
        history = list((previous or {}).get("history") or [])
        if previous and previous.get("submission_id"):
            history.append(
                {k: previous.get(k) for k in ("submission_id", "submitted_at", "leaderboard_name",
                                              "submission_name", "content_sha256")}
            )
        flag = {
            "submission_name": submission_name,
            "leaderboard_name": leaderboard_name,
            "submission_id": result.submission_id,
            "status_url": result.status_url,
            "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "server": client.base_url,
            "bundle_sha256": bundle.sha256,
            "content_sha256": bundle.content_sha256,
            "bundle_size": bundle.size,
            "bundle_files": len(bundle.manifest.get("files", [])),
            "include_videos": include_videos,
            "history": history,
        }
        try:
            write_flag(run.path, flag)
        except OSError as e:
            raise GenmanipLeaderboardError(
                f"uploaded as submission {result.submission_id}, but writing {FLAG_NAME} failed: {e}",
                hint="the submission exists on the leaderboard; do not submit again",
            ) from e
        return SubmitOutcome(
            status="submitted",
            run=run,
            bundle_sha256=bundle.sha256,
            content_sha256=bundle.content_sha256,
            bundle_size=bundle.size,
            submission_id=result.submission_id,
            status_url=result.status_url,
            flag=flag,
            previous=previous,
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
