"""The CLI handlers called directly (the parser lives in the meta package and is tested there)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval.cli import per_task_rows, run_eval, status, submit
from genmanip_eval.errors import GenmanipEvalError, PolicyError
from genmanip_testbed import serve_testbed


def ns(**kw: Any) -> argparse.Namespace:
    base = {"url": None, "host": "127.0.0.1", "port": 8087, "token": None, "run_id": None,
            "worker_ids": "0", "processes": 1, "max_episodes": None, "policy": "zero",
            "policy_arg": [], "chunk_size": 1, "step_chunk": False, "robot": None, "arm_type": None,
            "gripper_type": None, "control_type": None, "codec": "auto", "frames": "auto",
            "render_mode": None, "subframes": None, "results_dir": None, "record": True,
            "live_every": 0, "plot_on_episode_end": False, "quiet": False, "verbose": 0,
            "json": False, "watch": False, "interval": 0.2}
    base.update(kw)
    return argparse.Namespace(**base)


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
    code = run_eval(ns(url=smoke.url, policy="expert", worker_ids="0,1", results_dir=str(tmp_path),
                       arm_type="r5a"))
    out, err = capsys.readouterr()
    assert code == 0
    assert "testbed/smoke/red_block_easy" in out and "SR 95% CI" in out
    assert "results: " in err
    with pytest.raises(PolicyError, match="KEY=VALUE"):
        run_eval(ns(url=smoke.url, policy_arg=["oops"]))
    with pytest.raises(GenmanipEvalError, match="no worker id"):
        run_eval(ns(url=smoke.url, worker_ids=","))


def test_submit_status_handlers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_testbed(job=False, results_root=tmp_path, num_steps=3) as tb:
        assert submit(ns(url=tb.url, configs=["testbed/smoke"], run_id="x1")) == 0
        out, _ = capsys.readouterr()
        assert out.strip() == "x1"
        assert status(ns(url=tb.url, json=True)) == 0
        out, _ = capsys.readouterr()
        assert json.loads(out)["run_id"] == "x1"
