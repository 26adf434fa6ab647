"""`gmp eval`, `gmp submit`, `gmp status`, `gmp demo` through the real `gmp` entry point
(handlers in genmanip_eval.cli and genmanip.demo, parser spec genmanip.cli.specs.eval)."""

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
from genmanip_results.layout import FRAME_STORE_SUFFIX
from genmanip_testbed import serve_testbed

KILLER = """
import os, signal, time
from pathlib import Path
from genmanip_eval.policy import ZeroPolicy

class Killer:
    def __init__(self, at="10", wait="0", results=""):
        self.at, self.wait, self.n, self.zero = int(at), float(wait), 0, ZeroPolicy()
        self.results = Path(results) if results else None
    def reset(self):
        pass
    def get_action(self, obs):
        self.n += 1
        if self.n >= self.at:
            # let the finished episode's transcode complete (however loaded the machine is)
            deadline = time.monotonic() + 120
            while self.results is not None and time.monotonic() < deadline \\
                    and not any(self.results.rglob("result.json")):
                time.sleep(0.05)
            time.sleep(self.wait)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.zero.get_action(obs)

def killer(**kw):
    return Killer(**kw)
"""


@pytest.fixture()
def smoke(tmp_path: Path) -> Any:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=6, results_root=tmp_path / "server") as tb:
        yield tb


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
    code = main(["eval", "--url", smoke.url, "--policy", "nosuchmod:make"])
    _, err = capsys.readouterr()
    assert code == 2 and "cannot import 'nosuchmod'" in err
    code = main(["eval", "--url", smoke.url, "--no_save_process"])
    _, err = capsys.readouterr()
    assert code == 0 and not (tmp_path / "client_results").exists()
    # the one start line, and the testbed's default policy said out loud
    assert "no --policy: running the built-in zero policy" in err
    start = next(line for line in err.splitlines() if line.startswith(f"eval: {smoke.url} ("))
    assert "genmanip-testbed" in start and "policy zero" in start and "workers 0 (async runner)" in start
    # Never a green run that did nothing: the job is complete now.
    code = main(["eval", "--url", smoke.url, "--policy", "zero", "--no-record"])
    _, err = capsys.readouterr()
    assert code == 10 and "has finished its job: run " in err and "nothing to evaluate" in err
    assert "hint: start a new job (gmp submit CONFIG..." in err
    run_id = err.split("has finished its job: run ", 1)[1].split(" ", 1)[0]
    # ... unless the user asked to resume that finished run
    code = main(["eval", "--url", smoke.url, "--policy", "zero", "--no-record", "--run-id", run_id])
    _, err = capsys.readouterr()
    assert code == 0 and "is complete" in err and "nothing left to evaluate" in err


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
        # (status counts the seeds whose result_info.json the server has written, as the real
        # server does with refresh: that happens in the background after the result is sent)
        deadline = time.monotonic() + 60
        while True:
            code = main(["status", "--url", tb.url, "--json"])
            out, _ = capsys.readouterr()
            data = json.loads(out)
            if data["completed_episodes"] >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
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
        (tmp_path / "killer_policy.py").write_text(KILLER)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "genmanip", "eval", "--url", tb.url, "--results-dir", str(res),
             "--policy", "killer_policy:killer", "--policy-arg", "at=7",
             "--policy-arg", f"results={res}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    eps = sorted(p.parent for p in res.rglob("steps.jsonl"))
    assert len(eps) == 2
    done, partial = eps
    assert (done / "result.json").is_file() and not (done / "INCOMPLETE").exists()
    # (recording keeps each camera's JPEG frames as received; H.264 is made when needed)
    assert len(list(done.glob("*" + FRAME_STORE_SUFFIX))) == 4
    assert (partial / "INCOMPLETE").is_file() and not (partial / "result.json").exists()
    assert not list(partial.glob("*" + FRAME_STORE_SUFFIX)) and not list(partial.glob("*.mp4"))
    er = json.loads((done.parent / "episode_result.json").read_text())
    assert list(er) == [done.name]


def test_gmp_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = tmp_path / "demo"
    code = main(["demo", "--results-dir", str(res), "--tasks", "testbed/smoke", "--workers", "2",
                 "--processes", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "testbed/smoke/red_block_easy" in out and "SR 95% CI" in out
    assert f"gmp viz --root {res}" in err
    assert len(list(res.rglob("result.json"))) == 2
    assert len(list(res.rglob("*" + FRAME_STORE_SUFFIX))) == 8  # 2 episodes x 4 cameras


def test_gmp_eval_json_summary(smoke: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code = main(["eval", "--url", smoke.url, "--policy", "expert", "--no-record", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    data = json.loads(out)  # stdout holds the JSON only (talk is on stderr)
    assert data["schema"] == "gmp-eval/1" and data["policy"]["spec"] == "expert"
    assert data["overall"]["n"] == 2 and data["invocation"]["complete"] is True
    (task,) = data["tasks"]
    lo, hi = data["tasks"][task]["ci95"]
    assert 0.0 <= lo <= data["tasks"][task]["sr"] <= hi <= 1.0
