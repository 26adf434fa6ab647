from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from genmanip_eval.errors import PolicyError
from genmanip_eval.policy import (
    PolicyHandle,
    ZeroPolicy,
    load_policy_factory,
    parse_policy_args,
)
from genmanip_protocol.robots import get_robot
from genmanip_protocol.schema import validate_action


def test_zero_policy_fits_every_robot() -> None:
    for rid in ("manip/lift2/R5a", "manip/franka/panda_hand", "manip/franka/robotiq"):
        action = ZeroPolicy().get_action({"robot_id": rid})
        validate_action(get_robot(rid), action)
        assert action["is_rel"] is True
        assert len(action["action"]) == get_robot(rid).action_dim


def test_zero_policy_ee_pose_holds_every_robot_still() -> None:
    import numpy as np

    for rid in ("manip/lift2/R5a", "manip/franka/panda_hand", "manip/franka/robotiq"):
        spec = get_robot(rid)
        grip = np.linspace(0.0, 0.01, spec.gripper_dim).astype(np.float32)
        action = ZeroPolicy(control_type="ee_pose").get_action({"robot_id": rid, "state.gripper": grip})
        validate_action(spec, action)
        arms = action["action"] if spec.dual_arm else [action["action"]]
        assert action["control_type"] == "ee_pose" and action["is_rel"] is True
        assert [a[:2] for a in arms] == [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]] * spec.n_arms
        assert [g for a in arms for g in a[2]] == pytest.approx(grip.tolist())  # grippers stay put
    with pytest.raises(PolicyError, match="control_type"):
        ZeroPolicy(control_type="torque")


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
    with pytest.raises(PolicyError, match="neither get_action"):
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


def test_expert_builtin_loads() -> None:
    h = PolicyHandle.create("expert")
    assert h.has_action or h.has_chunk


def test_policy_exception_is_named() -> None:
    from genmanip_protocol.errors import ExitCode

    class Boom:
        def get_action(self, obs):  # type: ignore[no-untyped-def]
            raise ValueError("bad tensor shape")

    with pytest.raises(PolicyError, match=r"get_action\(obs\) raised ValueError: bad tensor shape") as info:
        PolicyHandle(Boom(), name="mypkg:make").action({})
    assert info.value.exit_code == ExitCode.FAILURE and isinstance(info.value.__cause__, ValueError)
