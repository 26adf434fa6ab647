"""gmp plot through the real command entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from genmanip.cli.main import main
from genmanip_artifacts._synthetic import write_client_episode
from genmanip_protocol.errors import ExitCode

CAMS = {"left_camera": (64, 48)}


@pytest.fixture
def run_with_bad_episodes(tmp_path: Path) -> Path:
    """A client run: two good episodes, one with ragged rows, one with a broken video, one incomplete."""
    root = tmp_path / "res"
    for seed in ("000", "001", "002", "003"):
        write_client_episode(root, n_steps=8, chunk=2, cameras=CAMS, seed=seed)
    run = root / "bench" / "run1"
    ep2 = run / "bench/suite/task_a/002"
    rows = (ep2 / "steps.jsonl").read_text().splitlines()
    bad = json.loads(rows[3])
    bad["action"]["action"] = bad["action"]["action"][:3]
    rows[3] = json.dumps(bad)
    (ep2 / "steps.jsonl").write_text("\n".join(rows) + "\n")
    (run / "bench/suite/task_a/003/left_camera.mp4").write_bytes(b"garbage")
    write_client_episode(root, n_steps=8, chunk=2, cameras=CAMS, seed="004", complete=False)
    return run


@pytest.mark.slow
def test_run_continues_past_bad_episodes_and_counts_them(
    run_with_bad_episodes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["plot", "--run", str(run_with_bad_episodes), "--jobs", "1"])
    assert rc == ExitCode.FAILURE
    out, err = capsys.readouterr()
    written = out.splitlines()
    for seed in ("000", "001"):
        ep = run_with_bad_episodes / "bench/suite/task_a" / seed
        assert {
            str(ep / n) for n in ("state_plot.png", "action_plot.png", "merged_with_plot.mp4")
        } <= set(written)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 2
    assert any("002: steps.jsonl:4: ragged rows" in ln or "ragged rows" in ln for ln in errors)
    assert any("003" in ln and "left_camera.mp4: unreadable video" in ln for ln in errors)
    assert "skipping 1 incomplete episode" in err
    assert "gmp: error: 2 of 4 episodes could not be plotted" in err
    assert not (run_with_bad_episodes / "bench/suite/task_a/004/state_plot.png").exists()


@pytest.mark.slow
def test_process_pool_and_out_dir(
    run_with_bad_episodes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eps = [str(run_with_bad_episodes / "bench/suite/task_a" / s) for s in ("000", "001")]
    out = tmp_path / "plots"
    assert (
        main(["plot", *eps, eps[0], "--jobs", "2", "--out", str(out), "--no-video"]) == ExitCode.OK
    )
    for seed in ("000", "001"):
        d = out / "bench" / "run1" / "bench" / "suite" / "task_a" / seed
        assert sorted(p.name for p in d.iterdir()) == [
            "action_plot.png",
            "plot.log",
            "state_plot.png",
        ]
    assert len(capsys.readouterr().out.splitlines()) == 4  # duplicate argument plotted once
    assert not (Path(eps[0]) / "state_plot.png").exists()


def test_single_episode_out_dir_is_used_as_is(run_with_bad_episodes: Path, tmp_path: Path) -> None:
    ep = run_with_bad_episodes / "bench/suite/task_a/000"
    assert main(["plot", str(ep), "--out", str(tmp_path / "o"), "--no-video"]) == ExitCode.OK
    assert (tmp_path / "o" / "state_plot.png").exists()


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot"]) == ExitCode.USAGE
    assert "nothing to plot" in capsys.readouterr().err
    (tmp_path / "notarun").mkdir()
    assert main(["plot", "--run", str(tmp_path / "notarun")]) == ExitCode.USAGE
    assert "not a run directory" in capsys.readouterr().err


def test_missing_episode_dir_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plot", str(tmp_path / "nope")]) == ExitCode.FAILURE
    err = capsys.readouterr().err
    assert "nope: not a directory" in err
