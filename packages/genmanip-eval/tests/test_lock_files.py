"""A finished run leaves no lock files in its results tree but the run's one hidden lock.

A lock file can only be removed if every locker checks, once it holds the lock, that the name still
points at its file (``flock`` locks the inode: a process still waiting on an unlinked file would
hold "the lock" next to one that locked a new file of that name). The recorder keeps every lock it
needs in one hidden file per run, ``.run.json.lock`` (the task directories no longer get the
reference client's ``episode_result.lock``); the videos made afterwards (``gmp transcode``) take
the episode's ``.video.lock`` with ``FileLock(remove=True)``, which is gone once they are made.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from genmanip_eval import EvalConfig
from genmanip_eval.runner import run_eval
from genmanip_results.layout import RUN_JSON_LOCK


def _lock_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".lock", ".lck")))


@pytest.mark.parametrize("transcode", ["deferred", "inline"])
def test_a_complete_run_leaves_only_the_runs_hidden_lock(smoke: object, tmp_path: Path, transcode: str) -> None:
    results = tmp_path / "results"
    cfg = EvalConfig(url=smoke.url, worker_ids=["0", "1"], policy="zero", results_dir=str(results),  # type: ignore[attr-defined]
                     transcode=transcode)
    summary = run_eval(cfg)
    assert summary.complete and len(summary.episodes) == 2
    (run_dir,) = (Path(d) for d in summary.run_dirs)
    task = run_dir / "testbed" / "smoke" / "red_block_easy"
    # Really recorded and merged (under that one lock): both seeds, both results.
    assert sorted(json.loads((task / "episode_result.json").read_text())) == ["000", "001"]
    assert all((task / seed / "result.json").is_file() for seed in ("000", "001"))
    assert _lock_files(results) == [run_dir / RUN_JSON_LOCK]
    assert RUN_JSON_LOCK.startswith(".")  # hidden: ls and the bundles leave it out


def test_videos_made_after_the_run_leave_no_lock_behind(smoke: object, tmp_path: Path) -> None:
    from genmanip_results.frames import transcode_episode

    results = tmp_path / "results"
    cfg = EvalConfig(url=smoke.url, worker_ids=["0"], policy="zero", results_dir=str(results),  # type: ignore[attr-defined]
                     transcode="deferred")
    summary = run_eval(cfg)
    (run_dir,) = (Path(d) for d in summary.run_dirs)
    episode = run_dir / "testbed" / "smoke" / "red_block_easy" / "000"
    assert not list(episode.glob("*.mp4"))
    transcode_episode(episode)
    assert list(episode.glob("*.mp4"))  # the videos were made (under the episode's lock)
    assert _lock_files(results) == [run_dir / RUN_JSON_LOCK]
