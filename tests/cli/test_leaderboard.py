"""``gmp leaderboard ...`` end to end: real gmp subprocesses, the testbed's leaderboard over HTTPS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

# Each test starts gmp subprocesses (a second or more each on a loaded 2-core machine).
pytestmark = pytest.mark.slow

TOKEN = "cli-author-token-Q7Q7Q7"


@pytest.fixture(scope="module")
def board(tls_files, tmp_path_factory):
    with serve_testbed(tasks="testbed/smoke", job=False, token="x-eval", leaderboard_token=TOKEN,
                       data_dir=tmp_path_factory.mktemp("lb"), ssl_certfile=tls_files.cert,
                       ssl_keyfile=tls_files.key) as tb:
        yield tb


def gmp(*args: str, cwd: Path, token: str | None = TOKEN, **env_extra: str):
    env = dict(os.environ)
    env["NO_COLOR"] = "1"
    for k in ("USER_TOKEN", "LEADERBOARD_HOST", "LEADERBOARD_PORT", "GENMANIP_RESULT_DIR"):
        env.pop(k, None)
    if token is not None:
        env["USER_TOKEN"] = token
    env.update(env_extra)
    p = subprocess.run(check=False, args=[sys.executable, "-m", "genmanip", "leaderboard", *args], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    # The token never shows up in any output, whatever the command did.
    for secret in (TOKEN, "wrong-author-token"):
        assert secret not in p.stdout + p.stderr
    return p


def test_list_bundle_submit_status_flow(board, tls_files, project, server_run, client_run):
    run_dir = server_run(project, run_id="flow")
    client_run(project / "client_results", run_id="crun")
    server_run(project, run_id="part", tasks={"testbed/a/x": 2}, done={"testbed/a/x": [1]})

    p = gmp("list", "--json", cwd=project)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert {(r["benchmark"], r["run_id"], r["layout"]) for r in rows} == {
        ("testbed", "flow", "server"), ("testbed", "crun", "client"), ("testbed", "part", "server")}
    part = next(r for r in rows if r["run_id"] == "part")
    assert (part["episodes_done"], part["episodes_total"], part["complete"]) == (1, 2, False)

    p = gmp("list", cwd=project)
    assert p.returncode == 0
    header = p.stdout.splitlines()[0].split()
    assert header[:4] == ["BENCHMARK", "RUN", "ID", "LAYOUT"]
    assert any("part" in line and "1/2" in line and "no" in line for line in p.stdout.splitlines())

    out_dir = project.parent / "bundles"
    p = gmp("bundle", "flow", "--out", str(out_dir) + "/", cwd=project)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == out_dir / "results_flow.zip" and (out_dir / "results_flow.zip").is_file()
    assert "sha256" in p.stderr

    p = gmp("bundle", "part", "--out", str(out_dir), cwd=project)
    assert p.returncode == ExitCode.REFUSED
    assert "testbed/a/x/000" in p.stderr and "--allow-incomplete" in p.stderr
    p = gmp("bundle", "part", "--out", str(out_dir), "--allow-incomplete", cwd=project)
    assert p.returncode == 0 and "incomplete" in p.stderr

    p = gmp("bundle", "flow", "--out", str(run_dir / "x.zip"), cwd=project)
    assert p.returncode == ExitCode.REFUSED and "inside the results tree" in p.stderr

    sub = ["submit", "--run-id", "flow", "-n", "my sub", "-l", "board", "--ca-cert", str(tls_files.ca)]
    env = {"LEADERBOARD_HOST": "127.0.0.1", "LEADERBOARD_PORT": str(board.port)}
    p = gmp(*sub, cwd=project, **env)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["status"] == "submitted" and res["run_id"] == "flow"
    sid = res["submission_id"]
    assert json.loads((run_dir / "submitted.flag").read_text())["submission_id"] == sid
    assert res["status_url"] == f"https://127.0.0.1:{board.port}/upload_status/{sid}"

    p = gmp(*sub, cwd=project, **env)
    assert p.returncode == ExitCode.NOTHING_TO_DO
    assert json.loads(p.stdout)["status"] == "unchanged" and "nothing to do" in p.stderr

    p = gmp(*sub, "--force", "--token", TOKEN, cwd=project, token=None, **env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["submission_id"] != sid
    assert "--token puts the token in process lists" in p.stderr

    p = gmp("status", sid, "--host", "127.0.0.1", "--port", str(board.port), "--ca-cert",
            str(tls_files.ca), cwd=project, token=None)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["submission_id"] == sid

    p = gmp("list", "--json", cwd=project)
    flow = next(r for r in json.loads(p.stdout) if r["run_id"] == "flow")
    assert flow["submitted"] is True and flow["submission_id"]


def test_submit_failures_exit_nonzero_without_flag(board, tls_files, project, server_run):
    run_dir = server_run(project, run_id="fail")
    base = ["submit", "--run-id", "fail", "-n", "s", "-l", "b", "--host", "127.0.0.1",
            "--port", str(board.port)]
    p = gmp(*base, cwd=project)
    assert p.returncode == ExitCode.UNREACHABLE and "certificate" in p.stderr.lower()
    p = gmp(*base, "--ca-cert", str(tls_files.ca), cwd=project, token="wrong-author-token")
    assert p.returncode == ExitCode.AUTH and "invalid author_token" in p.stderr
    p = gmp(*base, "--ca-cert", str(tls_files.ca), cwd=project, token=None)
    assert p.returncode == ExitCode.AUTH and "USER_TOKEN" in p.stderr
    p = gmp("submit", "--run-id", "fail", "-n", "s", "-l", "b", "--host", "lb.example.org",
            "--insecure-http", cwd=project)
    assert p.returncode == ExitCode.REFUSED
    assert not (run_dir / "submitted.flag").exists()


def test_ambiguous_run_id_is_an_error(project, server_run):
    server_run(project, benchmark="testbed", run_id="dup")
    server_run(project, benchmark="other", run_id="dup")
    p = gmp("submit", "--run-id", "dup", "-n", "s", "-l", "b", cwd=project)
    assert p.returncode == ExitCode.USAGE
    assert "ambiguous" in p.stderr and "testbed" in p.stderr and "other" in p.stderr
    p = gmp("bundle", "dup", "--benchmark-id", "other", "--out", str(project.parent), cwd=project)
    assert p.returncode == 0, p.stderr

