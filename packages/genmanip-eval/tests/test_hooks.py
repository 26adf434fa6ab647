from __future__ import annotations

import pytest
from genmanip_eval import EvalConfig, HookNotInstalledError, load_episode_hook, run_workers
from genmanip_protocol.errors import ExitCode


def test_unknown_hook_names_the_package_to_install() -> None:
    with pytest.raises(HookNotInstalledError) as ei:
        load_episode_hook("no-such-hook")
    assert ei.value.exit_code == ExitCode.NOT_INSTALLED
    assert "no-such-hook" in str(ei.value)


def test_plot_on_episode_end_needs_recording(smoke, tmp_path) -> None:
    cfg = EvalConfig(url=smoke.url, record=False, plot_on_episode_end=True, results_dir=str(tmp_path))
    with pytest.raises(Exception, match="--no-record"):
        run_workers(cfg)
