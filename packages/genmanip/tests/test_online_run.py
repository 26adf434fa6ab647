"""``gmp online run`` end to end, then ``gmp leaderboard submit`` of its results.

The online service, the evaluation endpoint and the leaderboard are the testbed's emulations,
reached over real HTTP on 127.0.0.1. (HTTPS with certificate verification is exercised in the
genmanip-online and genmanip-leaderboard test suites.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from genmanip.cli.main import main
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

TOKEN = "online-run-token-ABCDEF"
AUTHOR = "author-token-GHIJKL"


@pytest.fixture
def env(tmp_path, monkeypatch):
    cfg = tmp_path / "config.toml"
    cfg.write_text("", encoding="utf-8")
    e = dict(os.environ, GMP_CONFIG=str(cfg), NO_COLOR="1", GMP_ONLINE_TOKEN=TOKEN, USER_TOKEN=AUTHOR)
    for k in ("GMP_ONLINE_URL", "GMP_TOKEN", "LEADERBOARD_HOST", "LEADERBOARD_PORT", "GENMANIP_RESULT_DIR"):
        e.pop(k, None)
    monkeypatch.setenv("GMP_CONFIG", str(cfg))
    monkeypatch.setenv("GMP_ONLINE_TOKEN", TOKEN)
    return e


def _gmp(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(check=False, args=[sys.executable, "-m", "genmanip", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_online_run_then_leaderboard_submit(tmp_path, env):
    results = tmp_path / "results"
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, leaderboard_token=AUTHOR, job=False,
                       data_dir=tmp_path / "lb") as tb:
        p = _gmp(["online", "run", "--base-url", tb.url, "--model-name", "expert-test",
                  "--benchmark-set", "testbed/smoke", "--interval", "0.02", "--policy", "expert",
                  "--results-dir", str(results)], env, tmp_path)
        assert p.returncode == 0, p.stderr
        task_id = p.stderr.split("created task ", 1)[1].split()[0]
        assert f"stopped task {task_id}" in p.stderr
        requests = tb.stats.snapshot()["requests"]
        assert requests.get(f"/online/{task_id}/stop") == 1
        assert requests.get(f"/online/{task_id}/step", 0) > 0
        run_dir = results / "testbed" / task_id
        episodes = sorted(run_dir.glob("testbed/smoke/*/*/result.json"))
        assert len(episodes) == 2
        manifest = json.loads((run_dir / "run.json").read_text())
        assert manifest["run_id"] == task_id
        assert manifest["server_url"] == f"{tb.url}/online/{task_id}"

        p = _gmp(["leaderboard", "submit", "--root", str(results), "--run-id", task_id,
                  "-n", "expert", "-l", "testbed-board", "--host", "127.0.0.1", "--port",
                  str(tb.port), "--insecure-http"], env, tmp_path)
        assert p.returncode == 0, p.stderr
        sid = json.loads(p.stdout)["submission_id"]
        stored = tb.server.hosted.submissions_dir() / sid / "bundle.zip"
        with zipfile.ZipFile(stored) as zf:
            names = set(zf.namelist())
            bundle_manifest = json.loads(zf.read("manifest.json"))
        assert "run.json" in names and len([n for n in names if n.endswith("/result.json")]) == 2
        assert bundle_manifest["run_id"] == task_id and bundle_manifest["counts"]["episodes_complete"] == 2
        assert json.loads((run_dir / "submitted.flag").read_text())["submission_id"] == sid
    for text in (p.stdout, p.stderr):
        assert TOKEN not in text and AUTHOR not in text


def test_online_run_stops_the_task_when_the_evaluation_fails(tmp_path, env, capsys):
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, job=False) as tb:
        rc = main(["online", "run", "--base-url", tb.url, "--model-name", "m", "--interval", "0.02",
                   "--policy", "no_such_module_xyz:make", "--results-dir", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert rc != 0
        stops = [k for k in tb.stats.snapshot()["requests"] if k.endswith("/stop")]
        assert len(stops) == 1, err
        assert "stopped task" in err


def test_online_run_refuses_a_foreign_run_id(tmp_path, env, capsys):
    rc = main(["online", "run", "--base-url", "http://127.0.0.1:9", "--run-id", "mine"])
    assert rc == ExitCode.INVALID_INPUT
    assert "--run-id" in capsys.readouterr().err
