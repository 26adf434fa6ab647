"""Plots and cleanup on trees written by the real pieces: the testbed (server layout, with
save_process) and genmanip-eval (client layout), over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_artifacts import load_series, plot_episode
from genmanip_artifacts.overlay import frame_timesteps
from genmanip_eval.runner import EvalConfig, run_eval
from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import find_runs
from genmanip_results.video import probe_video
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("real")
    with serve_testbed(
        robot="manip/lift2/R5a",
        tasks=("testbed/smoke",),
        save_process=True,
        results_root=base / "proj",
    ) as tb:
        cfg = EvalConfig(
            url=tb.url,
            policy="expert",
            results_dir=str(base / "client"),
            chunk_size=4,
            max_episodes=1,
        )
        run_eval(cfg)
    server_eps = [e for r in find_runs(base / "proj") for e in r.episodes if e.complete]
    client_eps = [e for r in find_runs(base / "client") for e in r.episodes if e.complete]
    assert server_eps and client_eps
    return {"base": base, "server": server_eps[0].path, "client": client_eps[0].path}


def test_client_layout_from_eval(trees: dict[str, Path]) -> None:
    ep = trees["client"]
    s = load_series(ep)
    assert s.layout == "client" and s.robot is not None and s.robot.robot_id == "manip/lift2/R5a"
    r = plot_episode(ep)
    n_frames = probe_video(next(iter(s.videos.values())))[0]
    assert r.frames == n_frames > 0
    ts, warnings = frame_timesteps(s, n_frames)
    # gmp eval records every observation it receives: one frame per timestep, none held.
    assert warnings == []
    assert np.array_equal(ts, np.arange(n_frames, dtype=np.float64) + ts[0])
    assert probe_video(r.video)[0] == n_frames  # type: ignore[arg-type]
    assert r.state_plot.stat().st_size > 10_000


def test_server_layout_from_testbed(cmd: Any, trees: dict[str, Path]) -> None:
    ep = trees["server"]
    s = load_series(ep)
    assert s.layout == "server"
    assert set(s.videos) == {"left_camera", "right_camera", "top_camera", "overlook_camera"}
    r = plot_episode(ep)
    assert r.warnings == []
    assert r.frames == s.n_steps + 1  # the reset observation + one per step
    # The whole run through the command, server layout discovered by the shared reader.
    run_dir = next(r.path for r in find_runs(trees["base"] / "proj"))
    assert cmd.plot(run=[run_dir], video=False, jobs=1) == ExitCode.OK


def test_clean_on_the_testbed_tree(
    cmd: Any, trees: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    proj = trees["base"] / "proj"
    run = next(r for r in find_runs(proj))
    cache = trees["base"] / "cache"
    # Freshly written: live, whatever else.
    assert cmd.clean(proj, cache_dir=cache, results=True, force=True, yes=True) == ExitCode.REFUSED
    assert "live run" in capsys.readouterr().err
    old = time.time() - 3600
    for dirpath, dirnames, filenames in os.walk(run.path):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (old, old), follow_symlinks=False)
    # Not submitted: refused, and nothing of the run disappears.
    assert cmd.clean(proj, cache_dir=cache, results=True, yes=True) == ExitCode.REFUSED
    assert "not submitted" in capsys.readouterr().err
    assert all((e.path / "result_info.json").exists() for e in run.episodes)
    # Submitted and idle for a while: it goes (plots included), the tasks dir stays.
    (run.path / "submitted.flag").write_text(json.dumps({"submission_id": "x"}))
    assert cmd.clean(proj, cache_dir=cache, results=True, plots=True, yes=True) == ExitCode.OK
    assert not run.path.exists()
    assert (proj / "saved" / "eval_results").is_dir()
