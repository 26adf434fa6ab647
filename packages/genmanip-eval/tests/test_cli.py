"""The CLI handlers called directly (the parser lives in the meta package and is tested there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval.cli import per_task_rows, run_eval, status, submit
from genmanip_eval.errors import GenmanipEvalError, PolicyError
from genmanip_runtime.console import Console
from genmanip_testbed import serve_testbed

# The handlers' keyword arguments with gmp's defaults (the parser lives in the meta package).
CONNECTION: dict[str, Any] = {"url": None, "host": "127.0.0.1", "port": 8087, "token": None,
                              "ca_cert": None, "run_id": None}
EVAL: dict[str, Any] = {
    **CONNECTION, "worker_ids": "0", "processes": 1, "max_episodes": None, "max_recoveries": 5,
    "policy": "zero", "policy_arg": [], "chunk_size": 1, "step_chunk": False, "robot": None,
    "arm_type": None, "gripper_type": None, "control_type": None, "codec": "auto",
    "frames": "auto", "render_mode": None, "subframes": None, "results_dir": None,
    "record": True, "live_every": 0, "plot_on_episode_end": False, "runner": "async",
    "max_batch": None, "max_wait_ms": None, "compare_to": None, "stop_when_decided": False,
    "alpha": 0.05, "delta": None, "launcher": "local", "ray_address": None,
    "workers_per_actor": None, "policy_replicas": None, "gpus_per_replica": None,
    "cpus_per_replica": None, "allow_policy_change": False, "as_json": False, "transcode": "deferred",
}
STATUS: dict[str, Any] = {**CONNECTION, "as_json": False, "watch": False, "interval": 0.2}


def kw(defaults: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """``defaults`` with ``overrides`` and the console gmp's main would pass (no -q/-v)."""
    return {**defaults, "console": Console(), **overrides}


def test_per_task_rows() -> None:
    eps = [
        {"task_name": "b", "score": 1.0, "success": True},
        {"task_name": "a", "score": 0.5, "success": False},
        {"task_name": "a", "score": 1.0, "success": True},
    ]
    rows = per_task_rows(eps)
    assert [r[0] for r in rows] == ["a", "b", "all"]
    assert rows[0][1:3] == [2, 0.5] and rows[0][4] == 0.75
    assert rows[2][1] == 3 and rows[2][3].startswith("[")


def test_run_eval_handler(smoke: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_eval(**kw(EVAL, url=smoke.url, policy="expert", worker_ids="0,1",
                         results_dir=str(tmp_path), arm_type="r5a"))
    out, err = capsys.readouterr()
    assert code == 0
    assert "testbed/smoke/red_block_easy" in out and "SR 95% CI" in out
    assert "results: " in err
    with pytest.raises(PolicyError, match="KEY=VALUE"):
        run_eval(**kw(EVAL, url=smoke.url, policy_arg=["oops"]))
    with pytest.raises(GenmanipEvalError, match="no worker id"):
        run_eval(**kw(EVAL, url=smoke.url, worker_ids=","))


def test_submit_status_handlers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_testbed(job=False, results_root=tmp_path, num_steps=3) as tb:
        assert submit(**kw(CONNECTION, url=tb.url, configs=["testbed/smoke"], run_id="x1")) == 0
        out, _ = capsys.readouterr()
        assert out.strip() == "x1"
        assert status(**kw(STATUS, url=tb.url, as_json=True)) == 0
        out, _ = capsys.readouterr()
        assert json.loads(out)["run_id"] == "x1"


def test_the_live_line_shows_success_per_task_so_far() -> None:
    import time

    from genmanip_eval.cli import _live_fields

    state = {"episodes": 3, "successes": 2, "steps": 10, "t0": time.perf_counter() - 1.0,
             "lat": {"n": 0}, "by_task": {"testbed/reach/red": [2, 1], "testbed/reach/blue": [1, 1]}}
    assert _live_fields(state)["tasks"] == "blue 1/1 red 1/2"
    state["by_task"] = {"testbed/reach/red": [2, 1]}
    assert "tasks" not in _live_fields(state)  # one task: the SR field says it already
