"""`gmp eval --plot-on-episode-end`: eval finds this package's hook by entry point and every
recorded episode gets its plots, made in a separate process off the step loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from genmanip_artifacts import PlotHook
from genmanip_eval import EvalConfig, load_episode_hook, run_workers
from genmanip_results.discovery import find_runs
from genmanip_testbed import serve_testbed


def test_entry_point_provides_the_plot_hook() -> None:
    hook = load_episode_hook("plot")
    try:
        assert isinstance(hook, PlotHook)
    finally:
        assert hook.close(timeout=30) == 0


@pytest.mark.slow
def test_every_recorded_episode_is_plotted(tmp_path: Path) -> None:
    results = tmp_path / "client"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=6, results_root=tmp_path / "server") as tb:
        summary = run_workers(
            EvalConfig(url=tb.url, policy="expert", results_dir=str(results), plot_on_episode_end=True)
        )
    assert summary.complete
    (run,) = find_runs(results)
    episodes = [e for e in run.episodes if e.complete]
    assert len(episodes) == 2
    for ep in episodes:
        for name in ("action_plot.png", "state_plot.png", "merged_with_plot.mp4"):
            assert (ep.path / name).stat().st_size > 0, (ep.path, name)
