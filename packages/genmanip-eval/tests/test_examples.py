"""The two example programs of the GenManip/EBench integration docs, run as written there
(only the camera name is a real one: the docs' ``video.front_view`` does not exist)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_eval import ZeroPolicy
from genmanip_testbed import serve_testbed

TOKEN = "example-token"


class SingleStepModelClient:
    def __init__(self) -> None:
        pass  # Load your model here

    def get_action(self, obs: dict[str, Any]) -> dict[str, Any]:
        worker_id = next(iter(obs))
        worker_obs = obs[worker_id]["obs"]
        _instruction = worker_obs["instruction"]
        image = worker_obs["video.left_camera_view"]
        joints = worker_obs["state.joints"]
        gripper = worker_obs["state.gripper"]
        assert image.shape == (480, 640, 3) and image.dtype == np.uint8
        # Hold the current pose: 6 left joints + 2 left grip + 6 right joints + 2 right grip.
        action = np.concatenate([joints[:6], gripper[:2], joints[6:], gripper[2:]])
        return {
            worker_id: {
                "action": action,
                "base_motion": np.zeros(3),
                "control_type": "joint_position",
                "is_rel": False,
                "base_is_rel": True,
            }
        }


class ChunkModelClient(SingleStepModelClient):
    def get_action_chunk(self, obs: dict[str, Any]) -> list[dict[str, Any]]:
        step = self.get_action(obs)
        return [step, step, step]


def test_single_step_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reference's scripts expect recording by default: the compatibility client records.
    monkeypatch.setenv("GENMANIP_RESULT_DIR", str(tmp_path / "res"))
    with serve_testbed(tasks=("testbed/smoke",), num_steps=5, token=TOKEN, results_root=tmp_path) as tb:
        from genmanip_client.eval_client import EvalClient

        client = EvalClient(base_url=tb.url, worker_ids=["0"], run_id="my_run", token=TOKEN)
        model = SingleStepModelClient()
        obs = client.reset()
        steps = 0
        while True:
            action = model.get_action(obs)
            obs, done = client.step(action)
            steps += 1
            if done:
                break
        client.close()
        stats = tb.stats.snapshot()
    assert steps == 10 == sum(stats["steps_by_worker"].values())
    assert len(client.episode_results) == 2
    assert len(list((tmp_path / "res").rglob("result.json"))) == 2


def test_chunk_mode_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENMANIP_RESULT_DIR", str(tmp_path / "res"))
    with serve_testbed(tasks=("testbed/smoke",), num_steps=5, token=TOKEN, results_root=tmp_path) as tb:
        from genmanip_client.eval_client import EvalClient

        client = EvalClient(base_url=tb.url, worker_ids=["0"], run_id="my_run", token=TOKEN)
        model = ChunkModelClient()
        obs = client.reset()
        calls = 0
        while True:
            actions = model.get_action_chunk(obs)  # [{"0": action_dict}, ...]: time-major
            obs, done = client.step(actions)
            calls += 1
            if done:
                break
            # A bare list of action dicts is the other documented chunk form.
            actions = [a["0"] for a in model.get_action_chunk(obs)]
            obs, done = client.step(actions)
            calls += 1
            if done:
                break
        client.close()
        stats = tb.stats.snapshot()
    assert sum(stats["steps_by_worker"].values()) == 10  # every action of every chunk counted
    assert stats["requests"]["/step_chunk"] == calls
    assert set(stats["chunk_paths"]) == {"fast"}


def test_reference_migration_methods_and_a_complete_job(tmp_path: Path) -> None:
    # What the reference's example scripts call: load_config() starts a job, kill_workers()
    # releases; reset() on a job with nothing left is a clear error, not obs=None.
    from genmanip_client.eval_client import EvalClient
    from genmanip_eval import JobComplete

    with serve_testbed(job=False, num_steps=3, token=TOKEN, results_root=tmp_path) as tb:
        client = EvalClient(base_url=tb.url, worker_ids=["0"], token=TOKEN, record=False)
        client.load_config("testbed/smoke", run_id="mig1")
        obs = client.reset()
        while True:
            obs, done = client.step(ZeroPolicy().get_action(obs["0"]["obs"]))
            if done:
                break
        client.kill_workers()
        client.close()
        again = EvalClient(base_url=tb.url, worker_ids=["0"], token=TOKEN, record=False)
        with pytest.raises(JobComplete, match=r"nothing left to evaluate .*\(run mig1\) is complete"):
            again.reset()
        again.close()
    assert len(client.episode_results) == 2
