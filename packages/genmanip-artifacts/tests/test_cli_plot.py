"""gmp plot: its handler, called the way gmp calls it (``cmd``), on runs with bad episodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from genmanip_artifacts.errors import ArtifactsUsageError, PlotFailures
from genmanip_protocol.errors import ExitCode
from genmanip_results.testing import write_client_episode

CAMS = {"left_camera": (64, 48)}


@pytest.fixture
def run_with_bad_episodes(tmp_path: Path) -> Path:
    """A client run: two good episodes, one with a ragged row, one with a broken video, one incomplete."""
    root = tmp_path / "res"
    run = root / "bench" / "run1"
    for seed in ("000", "001", "002", "003"):
        write_client_episode(run, "bench/suite/task_a", seed, steps=8, chunk=2, cameras=CAMS)
    ep2 = run / "bench/suite/task_a/002"
    rows = (ep2 / "steps.jsonl").read_text().splitlines()
    bad = json.loads(rows[3])
    bad["action"]["action"] = bad["action"]["action"][:3]
    rows[3] = json.dumps(bad)
    (ep2 / "steps.jsonl").write_text("\n".join(rows) + "\n")
    (run / "bench/suite/task_a/003/left_camera.mp4").write_bytes(b"garbage")
    write_client_episode(run, "bench/suite/task_a", "004", steps=8, chunk=2, cameras=CAMS,
                         complete=False)  # fmt: skip
    return run


@pytest.mark.slow
def test_run_continues_past_bad_episodes_and_counts_them(
    cmd: Any, run_with_bad_episodes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(PlotFailures, match=r"^1 of 4 episodes could not be plotted$") as ei:
        cmd.plot(run=[run_with_bad_episodes], jobs=1)
    assert ei.value.exit_code == ExitCode.FAILURE
    out, err = capsys.readouterr()
    written = out.splitlines()
    # The episode with a ragged row is plotted too (the row is a gap) and says so.
    for seed in ("000", "001", "002"):
        ep = run_with_bad_episodes / "bench/suite/task_a" / seed
        assert {
            str(ep / n) for n in ("state_plot.png", "action_plot.png", "merged_with_plot.mp4")
        } <= set(written)
    warned = [ln for ln in err.splitlines() if "002: steps.jsonl:4: action.action:" in ln]
    assert len(warned) == 1 and "3 values where the episode's rows have 16" in warned[0]
    log = (run_with_bad_episodes / "bench/suite/task_a/002/plot.log").read_text()
    assert "warning: steps.jsonl:4: action.action: 3 values" in log
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1
    assert "003" in errors[0] and "left_camera.mp4: unreadable video" in errors[0]
    assert "skipping 1 incomplete episode" in err
    assert not (run_with_bad_episodes / "bench/suite/task_a/004/state_plot.png").exists()


@pytest.mark.slow
def test_process_pool_and_out_dir(
    cmd: Any, run_with_bad_episodes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eps = [str(run_with_bad_episodes / "bench/suite/task_a" / s) for s in ("000", "001")]
    out = tmp_path / "plots"
    assert cmd.plot(*eps, eps[0], jobs=2, out=out, video=False) == ExitCode.OK
    for seed in ("000", "001"):
        d = out / "bench" / "run1" / "bench" / "suite" / "task_a" / seed
        assert sorted(p.name for p in d.iterdir()) == [
            ".gmp-generated.jsonl",  # the provenance manifest every output is registered in
            "action_plot.png",
            "plot.log",
            "state_plot.png",
        ]
    assert len(capsys.readouterr().out.splitlines()) == 4  # duplicate argument plotted once
    assert not (Path(eps[0]) / "state_plot.png").exists()


def test_single_episode_out_dir_is_used_as_is(
    cmd: Any, run_with_bad_episodes: Path, tmp_path: Path
) -> None:
    ep = run_with_bad_episodes / "bench/suite/task_a/000"
    assert cmd.plot(ep, out=tmp_path / "o", video=False) == ExitCode.OK
    assert (tmp_path / "o" / "state_plot.png").exists()


def test_usage_errors(cmd: Any, tmp_path: Path) -> None:
    with pytest.raises(ArtifactsUsageError, match="nothing to plot") as ei:
        cmd.plot()
    assert ei.value.exit_code == ExitCode.USAGE
    (tmp_path / "notarun").mkdir()
    with pytest.raises(ArtifactsUsageError, match="not a run directory") as ei:
        cmd.plot(run=[tmp_path / "notarun"])
    assert ei.value.exit_code == ExitCode.USAGE


def test_missing_episode_dir_is_one_error(
    cmd: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(PlotFailures, match=r"^1 of 1 episodes could not be plotted$") as ei:
        cmd.plot(tmp_path / "nope")
    assert ei.value.exit_code == ExitCode.FAILURE
    err = capsys.readouterr().err
    assert "nope: not a directory" in err
