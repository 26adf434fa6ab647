from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_eval.errors import PolicyError
from genmanip_eval.policy import (
    POLICY_GROUP,
    PolicyHandle,
    PolicyNotInstalledError,
    ZeroPolicy,
    installed_policies,
    load_policy_factory,
    parse_policy_args,
    zero_policy,
)
from genmanip_protocol.errors import ExitCode
from genmanip_protocol.robots import get_robot
from genmanip_protocol.schema import validate_action

# The facts (genmanip-protocol-facts.md section 7.1 robot table; section 8: gripper entries are
# always absolute, arm entries with is_rel add to the commanded targets): zero arm deltas, every
# gripper at its published *open* value, the dual-arm vector [left 6, left 2, right 6, right 2].
_OPEN_JOINT_ACTION = {
    "manip/franka/panda_hand": [0.0] * 7 + [0.04, 0.04],
    "manip/franka/robotiq": [0.0] * 7 + [0.0] * 6,
    "manip/mobile_aloha/piper": ([0.0] * 6 + [0.05, -0.05]) * 2,
    "manip/lift2/R5a": ([0.0] * 6 + [0.044, 0.044]) * 2,
}


@pytest.mark.parametrize("rid", sorted(_OPEN_JOINT_ACTION))
def test_zero_policy_holds_still_with_grippers_open(rid: str) -> None:
    spec = get_robot(rid)
    action = ZeroPolicy().get_action({"robot_id": rid})
    validate_action(spec, action)
    assert action["control_type"] == "joint_position" and action["is_rel"] is True
    assert action["action"] == _OPEN_JOINT_ACTION[rid]
    _arms, grips = spec.split_joint_action(action["action"])
    assert grips == list(spec.gripper_open) * spec.n_arms
    if spec.has_base:
        assert action["base_motion"] == [0.0, 0.0, 0.0] and action["base_is_rel"] is True
    else:
        assert "base_motion" not in action  # the server ignores it on Franka; send nothing
    # The one owner of the no-op: the protocol's spec helper.
    assert action == spec.neutral_action()


@pytest.mark.parametrize("rid", sorted(_OPEN_JOINT_ACTION))
def test_zero_policy_ee_pose_is_the_identity_delta_with_grippers_open(rid: str) -> None:
    spec = get_robot(rid)
    action = ZeroPolicy(control_type="ee_pose").get_action({"robot_id": rid})
    validate_action(spec, action)
    arms = action["action"] if spec.dual_arm else [action["action"]]
    assert action["control_type"] == "ee_pose" and action["is_rel"] is True
    assert arms == [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], list(spec.gripper_open)]] * spec.n_arms


def test_zero_policy_chunk_reset_and_args() -> None:
    pol = zero_policy(chunk="3", robot="lift2")
    pol.reset()
    chunk = pol.get_action_chunk({})  # robot= given: the observation needs no robot_id
    assert len(chunk) == 3 and all(a == get_robot("lift2").neutral_action() for a in chunk)
    assert len({id(a) for a in chunk}) == 3  # independent dicts: a caller may edit one
    assert np.asarray([a["action"] for a in chunk]).shape == (3, 16)
    assert len(ZeroPolicy().get_action_chunk({"robot_id": "franka"})) == 4
    h = PolicyHandle.create("zero", {"control_type": "ee_pose"})
    assert h.has_action and h.has_chunk and h.action({"robot_id": "franka"})["control_type"] == "ee_pose"
    with pytest.raises(PolicyError, match="control_type"):
        ZeroPolicy(control_type="torque")
    with pytest.raises(PolicyError, match="chunk"):
        zero_policy(chunk="0")
    with pytest.raises(PolicyError, match="not an integer"):
        zero_policy(chunk="x")
    with pytest.raises(PolicyError, match="takes only"):
        zero_policy(noise="1")
    with pytest.raises(PolicyError, match="robot='r2d2'"):
        zero_policy(robot="r2d2")
    with pytest.raises(PolicyError, match="no robot_id") as info:
        ZeroPolicy().get_action({})
    assert info.value.hint is not None and "robot=" in info.value.hint


def test_zero_policy_ee_pose_runs_on_the_testbed(tmp_path: Path) -> None:
    from genmanip_eval import EvalConfig, run_eval
    from genmanip_testbed import serve_testbed

    for robot in ("manip/franka/panda_hand", "manip/lift2/R5a"):
        with serve_testbed(robot, tasks=("testbed/smoke",), num_steps=4, results_root=tmp_path / "srv") as tb:
            cfg = EvalConfig(url=tb.url, policy="zero", policy_args={"control_type": "ee_pose"},
                             record=False, max_episodes=1)
            summary = run_eval(cfg)
            assert summary.steps >= 4 and len(summary.episodes) == 1
            # every action was accepted and applied (a rejected one would be a 500, not a step)
            assert tb.stats.total_steps == summary.steps


def test_parse_policy_args() -> None:
    assert parse_policy_args(["a=1", "ckpt=x=y", "empty="]) == {"a": "1", "ckpt": "x=y", "empty": ""}
    with pytest.raises(PolicyError, match="KEY=VALUE"):
        parse_policy_args(["novalue"])
    with pytest.raises(PolicyError, match="KEY=VALUE"):
        parse_policy_args(["bad key=1"])


def test_load_user_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_policy_mod.py").write_text(
        textwrap.dedent(
            """
            class P:
                def __init__(self, scale="1"):
                    self.scale = float(scale)
                    self.resets = 0
                def reset(self):
                    self.resets += 1
                def get_action_chunk(self, obs):
                    return {"0": [{"control_type": "joint_position", "action": [self.scale] * 16}]}
            def make(**kw):
                return P(**kw)
            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    h = PolicyHandle.create("my_policy_mod:make", {"scale": "2"})
    assert h.has_chunk and not h.has_action
    # An EBench-style {worker_id: ...} wrapper is unwrapped.
    assert h.chunk({})[0]["action"] == [2.0] * 16
    h.reset()
    assert h.policy.resets == 1
    with pytest.raises(PolicyError, match="rejected its arguments"):
        PolicyHandle.create("my_policy_mod:make", {"nope": "1"})
    with pytest.raises(PolicyError, match="not callable"):
        load_policy_factory("my_policy_mod:NOT_CALLABLE")
    with pytest.raises(PolicyError, match="no attribute"):
        load_policy_factory("my_policy_mod:missing")
    sys.modules.pop("my_policy_mod", None)


@pytest.mark.parametrize("spec", ["nomodule", "no_such_module_xyz:make", ":make", "mod:"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(PolicyError):
        load_policy_factory(spec)


def test_policy_without_methods() -> None:
    with pytest.raises(PolicyError, match="has none of get_action"):
        PolicyHandle(object())


def test_bad_policy_outputs() -> None:
    class Bad:
        def get_action(self, obs):  # type: ignore[no-untyped-def]
            return [1, 2, 3]

        def get_action_chunk(self, obs):  # type: ignore[no-untyped-def]
            return []

    h = PolicyHandle(Bad())
    with pytest.raises(PolicyError, match="expected an action dict"):
        h.action({})
    with pytest.raises(PolicyError, match="non-empty list"):
        h.chunk({})


def test_names_come_from_the_entry_point_group() -> None:
    from genmanip_testbed.policies import expert

    installed = installed_policies()
    assert {"zero", "expert"} <= set(installed)
    assert load_policy_factory("zero") is zero_policy
    assert load_policy_factory("expert") is expert  # the testbed registers it; eval never imports it
    h = PolicyHandle.create("expert", {"chunk": "2"})
    assert h.has_action and h.has_chunk
    # A factory's ValueError on a bad argument is the user's input error, not a crash.
    with pytest.raises(PolicyError, match="rejected its arguments"):
        PolicyHandle.create("expert", {"speeed": "1"})


def _write_dist(root: Path, name: str, entry_points: str, module: str = "") -> None:
    """A minimal installed distribution on ``root`` (what ``pip install`` of a model repo leaves)."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    if module:
        (root / f"{name.replace('-', '_')}.py").write_text(textwrap.dedent(module))


def test_a_model_repo_registers_its_own_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_dist(
        tmp_path,
        "my-model",
        f'[{POLICY_GROUP}]\nmymodel = my_model:make\nbroken = my_model_gone:make\n',
        """
        from genmanip_eval.policy import ZeroPolicy
        def make(**kw):
            return ZeroPolicy(**kw)
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        h = PolicyHandle.create("mymodel", {"robot": "franka"})
        assert h.action({})["action"] == [0.0] * 7 + [0.04, 0.04]
        # Installed but not importable: the error names who registered it.
        with pytest.raises(PolicyError, match="my-model registers it as 'my_model_gone:make'") as info:
            load_policy_factory("broken")
        assert not isinstance(info.value, PolicyNotInstalledError)
        assert info.value.hint is not None and "my-model" in info.value.hint
    finally:
        sys.modules.pop("my_model", None)


def test_two_distributions_with_one_name_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_dist(tmp_path, "clash-a", f"[{POLICY_GROUP}]\nclash = clash_a:make\n")
    _write_dist(tmp_path, "clash-b", f"[{POLICY_GROUP}]\nclash = clash_b:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyError, match="more than one distribution registers it: clash-") as info:
        load_policy_factory("clash")
    assert info.value.hint is not None and "package.module:callable" in info.value.hint


def test_unknown_name_lists_installed_names_with_a_did_you_mean() -> None:
    with pytest.raises(PolicyNotInstalledError) as info:
        load_policy_factory("exprt")
    err = info.value
    assert err.exit_code == ExitCode.NOT_INSTALLED and err.name == "exprt"
    assert {"expert", "zero"} <= set(err.installed)
    assert "installed: " in err.message and "did you mean 'expert'?" in err.message
    assert err.hint == "--policy expert"
    with pytest.raises(PolicyNotInstalledError, match="did you mean 'zero'") as info:
        load_policy_factory("zer0")
    with pytest.raises(PolicyNotInstalledError) as info:
        load_policy_factory("mypkg.policy")  # a module without its factory
    assert info.value.hint == "a module is named with its factory: --policy mypkg.policy:<factory>"
    with pytest.raises(PolicyNotInstalledError) as info:
        load_policy_factory("qqqq")
    assert info.value.hint is not None and f'[project.entry-points."{POLICY_GROUP}"]' in info.value.hint


def _without(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    """Distributions as if ``hidden`` (distribution names) were not installed."""
    from importlib.metadata import distributions as real

    import genmanip_eval.plugins as mod

    def fake() -> list[Any]:
        return [d for d in real() if d.metadata["Name"] not in hidden]

    monkeypatch.setattr(mod, "distributions", fake)


def test_without_any_provider_table_the_hint_says_how_names_are_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # genmanip-eval installed alone: no table, and eval names no distribution above it.
    _without(monkeypatch, "genmanip-testbed", "genmanip")
    with pytest.raises(PolicyNotInstalledError) as info:
        load_policy_factory("expert")
    assert info.value.installed == ["zero"] or "expert" not in info.value.installed
    assert info.value.hint is not None and "install the distribution that provides it" in info.value.hint
    assert "pip install" not in info.value.hint


def test_eval_source_never_names_the_testbed() -> None:
    # Dependency rule: eval's library code finds the testbed's policies through entry points only.
    import genmanip_eval

    src = Path(genmanip_eval.__file__).parent
    offenders = [
        str(p.relative_to(src))
        for p in sorted(src.rglob("*.py"))
        if "genmanip_testbed" in p.read_text() or "genmanip-testbed" in p.read_text()
    ]
    assert offenders == []


def test_policy_exception_is_named() -> None:
    from genmanip_protocol.errors import ExitCode

    class Boom:
        def get_action(self, obs):  # type: ignore[no-untyped-def]
            raise ValueError("bad tensor shape")

    with pytest.raises(PolicyError, match=r"get_action\(obs\) raised ValueError: bad tensor shape") as info:
        PolicyHandle(Boom(), name="mypkg:make").action({})
    assert info.value.exit_code == ExitCode.FAILURE and isinstance(info.value.__cause__, ValueError)


def test_default_policy_runs_whole_chunks(smoke: Any, tmp_path: Path) -> None:
    # What `gmp eval --chunk-size 4 --step-chunk` runs with the default policy (zero).
    import json

    from genmanip_eval import EvalConfig, run_eval

    cfg = EvalConfig(url=smoke.url, chunk_size=4, step_chunk=True, results_dir=str(tmp_path))
    assert cfg.policy == "zero"
    summary = run_eval(cfg)
    stats = smoke.stats.snapshot()
    assert summary.complete and summary.steps == sum(stats["steps_by_worker"].values()) == 12
    assert stats["requests"].get("/step_chunk", 0) >= 2 and stats["requests"].get("/step", 0) == 0
    rows = [json.loads(x) for f in tmp_path.rglob("steps.jsonl") for x in f.read_text().splitlines()]
    assert len(rows) == 12 and {r["chunk"]["size"] for r in rows} == {4}
