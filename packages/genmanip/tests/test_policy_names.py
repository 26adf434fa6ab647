"""`gmp eval --policy NAME` through the real `gmp` entry point: names from the
``genmanip.policies`` entry points, the default policy in chunks, and the provider table."""

from __future__ import annotations

import json
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

import pytest
from genmanip.cli.main import main
from genmanip.providers import PROVIDERS
from genmanip_eval.hooks import EPISODE_HOOK_GROUP, HookNotInstalledError, load_episode_hook
from genmanip_eval.inference import SCHEME_GROUP
from genmanip_eval.plugins import PROVIDERS_GROUP
from genmanip_eval.policy import (
    POLICY_GROUP,
    PolicyHandle,
    PolicyNotInstalledError,
    load_policy_factory,
)
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed


@pytest.fixture()
def smoke(tmp_path: Path) -> Any:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=6, results_root=tmp_path / "server") as tb:
        yield tb


def test_gmp_eval_default_policy_step_chunk(smoke: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--url", smoke.url, "--chunk-size", "4", "--step-chunk",
                 "--results-dir", str(tmp_path / "res")])
    _out, err = capsys.readouterr()
    assert code == 0, err
    stats = smoke.stats.snapshot()
    assert stats["requests"].get("/step_chunk", 0) >= 2 and sum(stats["steps_by_worker"].values()) == 12
    rows = [json.loads(x) for f in (tmp_path / "res").rglob("steps.jsonl") for x in f.read_text().splitlines()]
    assert len(rows) == 12 and {r["chunk"]["size"] for r in rows} == {4}
    # The recorded action is the testbed robot's no-op: zero arm deltas, grippers open.
    assert all(r["action"]["action"] == ([0.0] * 6 + [0.044, 0.044]) * 2 and r["action"]["is_rel"] for r in rows)


def test_gmp_eval_unknown_policy_name(smoke: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--url", smoke.url, "--no-record", "--policy", "exprt"])
    _out, err = capsys.readouterr()
    assert code == ExitCode.NOT_INSTALLED, err
    assert "did you mean 'expert'?" in err and "zero" in err and "--policy expert" in err


@pytest.mark.parametrize("group", [POLICY_GROUP, EPISODE_HOOK_GROUP, SCHEME_GROUP])
def test_provider_table_matches_the_registered_entry_points(group: str) -> None:
    # The meta package's hint table must name the distribution that really registers each name.
    registered = {
        ep.name: str(d.metadata["Name"])
        for d in distributions()
        for ep in d.entry_points
        if ep.group == group and str(d.metadata["Name"]).startswith("genmanip")
    }
    assert dict(PROVIDERS[group]) == registered
    (table,) = [ep for d in distributions() for ep in d.entry_points if ep.group == PROVIDERS_GROUP]
    assert table.load() is PROVIDERS


def _without(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    """Distributions as if ``hidden`` (distribution names) were not installed."""
    import genmanip_eval.plugins as mod

    real = mod.distributions
    monkeypatch.setattr(mod, "distributions", lambda: [d for d in real() if d.metadata["Name"] not in hidden])


def test_a_known_policy_that_is_not_installed_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # The testbed is not installed; the meta package's table says which distribution ships
    # 'expert' (eval itself never names it).
    _without(monkeypatch, "genmanip-testbed")
    with pytest.raises(PolicyNotInstalledError) as info:
        PolicyHandle.create("expert")
    assert "expert" not in info.value.installed and "zero" in info.value.installed
    assert info.value.hint == "policy 'expert' comes with genmanip-testbed: pip install genmanip-testbed"
    # A typo of it too.
    with pytest.raises(PolicyNotInstalledError, match="did you mean 'expert'") as info:
        load_policy_factory("expertt")
    assert info.value.hint is not None and info.value.hint.endswith("pip install genmanip-testbed")


def test_a_known_hook_that_is_not_installed_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "genmanip-artifacts")
    with pytest.raises(HookNotInstalledError) as info:
        load_episode_hook("plot")
    assert info.value.hint == "pip install genmanip-artifacts"
    # Without any table (genmanip-eval alone), the hint says how hooks get a name.
    _without(monkeypatch, "genmanip-artifacts", "genmanip")
    with pytest.raises(HookNotInstalledError) as info:
        load_episode_hook("plot")
    assert "pip install" not in (info.value.hint or "") and EPISODE_HOOK_GROUP in (info.value.hint or "")


def test_the_ray_launcher_is_in_the_provider_table_and_named_when_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from genmanip_eval.runner import LAUNCHER_GROUP

    # (genmanip-ray is an optional extra: where it is installed, the table names it rightly)
    registered = {
        ep.name: str(d.metadata["Name"])
        for d in distributions()
        for ep in d.entry_points
        if ep.group == LAUNCHER_GROUP and str(d.metadata["Name"]).startswith("genmanip")
    }
    assert registered.items() <= dict(PROVIDERS[LAUNCHER_GROUP]).items()
    assert dict(PROVIDERS[LAUNCHER_GROUP]) == {"ray": "genmanip-ray"}
    _without(monkeypatch, "genmanip-ray")
    code = main(["eval", "--url", "http://127.0.0.1:9", "--no-record", "--launcher", "ray"])
    _out, err = capsys.readouterr()
    assert code == ExitCode.NOT_INSTALLED, err
    assert "--launcher 'ray': not installed" in err and "pip install genmanip-ray" in err
