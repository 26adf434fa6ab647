"""`gmp eval`, `gmp submit`, `gmp status` through the real `gmp` entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from genmanip.cli.main import main
from genmanip_eval.cli import per_task_rows
from genmanip_testbed import serve_testbed


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


def test_gmp_eval_end_to_end(smoke: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--url", smoke.url, "--policy", "expert", "--worker_ids", "0,1",
                 "--results-dir", str(tmp_path / "res"), "--chunk-size", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    # Data on stdout: the per-task table; talk on stderr: episode lines and the results path.
    assert "testbed/smoke/red_block_easy" in out and "SR 95% CI" in out and "mean score" in out
    assert "results: " in err and str(tmp_path / "res") in err
    assert err.count("episode ") >= 2
    assert len(list((tmp_path / "res").rglob("result.json"))) == 2


def test_gmp_eval_no_record_and_bad_policy(smoke: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["eval", "--url", smoke.url, "--no_save_process"])
    assert code == 0 and not (tmp_path / "client_results").exists()
    capsys.readouterr()
    code = main(["eval", "--url", smoke.url, "--policy", "nosuchmod:make"])
    _, err = capsys.readouterr()
    assert code == 2 and "cannot import 'nosuchmod'" in err


def test_gmp_eval_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code = main(["eval", "--host", "127.0.0.1", "--port", str(port), "--no-record"])
    _, err = capsys.readouterr()
    assert code == 6 and "gmp" in err and str(port) in err


def test_submit_and_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_testbed(job=False, results_root=tmp_path, num_steps=3) as tb:
        code = main(["status", "--url", tb.url])
        out, _ = capsys.readouterr()
        assert code == 0 and "status:      idle" in out
        code = main(["submit", "testbed/smoke", "--url", tb.url, "--run-id", "r1"])
        out, err = capsys.readouterr()
        assert code == 0 and out.strip() == "r1" and "started run r1" in err
        # A job with active workers: submit refuses (exit 1), naming the run.
        code = main(["eval", "--url", tb.url, "--no-record", "--max-episodes", "1"])
        capsys.readouterr()
        code = main(["status", "--url", tb.url, "--json"])
        out, _ = capsys.readouterr()
        data = json.loads(out)
        assert data["run_id"] == "r1" and data["completed_episodes"] >= 1
        if data["status"] == "incomplete":
            code = main(["submit", "testbed/smoke", "--url", tb.url])
            _, err = capsys.readouterr()
            assert code == 1 and "--run-id r1" in err and "incomplete" in err
        code = main(["submit", "testbed/smoke", "--url", tb.url, "--run_id", "r1"])
        out, err = capsys.readouterr()
        assert code == 0 and "resumed run r1" in err
        code = main(["eval", "--url", tb.url, "--no-record"])
        capsys.readouterr()
        assert code == 0
        code = main(["status", "--url", tb.url, "--watch", "--interval", "0.2"])
        out, _ = capsys.readouterr()
        assert "status:      complete" in out and "mean score" in out and "not a success rate" in out
        code = main(["submit", "testbed/smoke", "--url", tb.url, "--run-id", "r1"])
        out, err = capsys.readouterr()
        assert code == 0 and "already complete" in err


def test_submit_refuses_while_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from genmanip_eval import EvalClient

    with serve_testbed(tasks=("testbed/smoke",), results_root=tmp_path) as tb:
        with EvalClient(tb.url, ["0"]) as c:
            c.reset()
            code = main(["submit", "testbed/smoke", "--url", tb.url])
            _, err = capsys.readouterr()
            assert code == 1 and "active workers" in err


@pytest.mark.slow
def test_sigkill_mid_episode_keeps_finished_episodes(tmp_path: Path) -> None:
    """A run killed with SIGKILL: finished episodes intact, the partial one marked INCOMPLETE."""
    res = tmp_path / "res"
    with serve_testbed(tasks=("testbed/smoke",), num_steps=4, results_root=tmp_path / "srv") as tb:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "genmanip", "eval", "--url", tb.url, "--results-dir", str(res),
             "--policy", "helper_policies:killer", "--policy-arg", "at=7", "--policy-arg", "wait=3"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    eps = sorted(p.parent for p in res.rglob("steps.jsonl"))
    assert len(eps) == 2
    done, partial = eps
    assert (done / "result.json").is_file() and not (done / "INCOMPLETE").exists()
    assert len(list(done.glob("*.mp4"))) == 4
    assert (partial / "INCOMPLETE").is_file() and not (partial / "result.json").exists()
    assert not list(partial.glob("*.mp4"))
    er = json.loads((done.parent / "episode_result.json").read_text())
    assert list(er) == [done.name]
    time.sleep(0)
