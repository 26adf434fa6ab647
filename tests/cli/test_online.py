"""``gmp online ...`` end to end: real subprocesses of the gmp command against the testbed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

# Each test starts gmp subprocesses (a second or more each on a loaded 2-core machine).
pytestmark = pytest.mark.slow

TOKEN = "cli-online-token-S3CRET"


def gmp(*args: str, token: str | None = TOKEN, timeout: float = 60, **env_extra: str):
    env = dict(os.environ)
    env["NO_COLOR"] = "1"
    for k in ("GMP_ONLINE_TOKEN", "GMP_ONLINE_URL"):
        env.pop(k, None)
    if token is not None:
        env["GMP_ONLINE_TOKEN"] = token
    env.update(env_extra)
    p = subprocess.run(check=False, args=[sys.executable, "-m", "genmanip", "online", *args], env=env,
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    # The token never shows up in any output, whatever the command did.
    assert TOKEN not in p.stdout + p.stderr
    return p


@pytest.fixture(scope="module")
def testbed():
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, job=False) as tb:
        yield tb


def test_submit_print_endpoint_stdout_is_only_json(testbed):
    p = gmp("submit", "--base-url", testbed.url, "--model-name", "m", "--interval", "0.01",
            "--print-endpoint")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"task_id", "endpoint"}
    assert out["endpoint"] == f"{testbed.url}/online/{out['task_id']}"
    assert p.stdout.count("\n") == 1
    assert f"task {out['task_id']} is ready" in p.stderr


def test_create_ready_stop_commands(testbed):
    p = gmp("create", "--base-url", testbed.url, "--model-name", "m", "--benchmark-set", "testbed/smoke")
    assert p.returncode == 0, p.stderr
    tid = p.stdout.strip()
    assert tid and "\n" not in tid
    p = gmp("ready", "--base-url", testbed.url, "--task-id", tid)
    assert p.returncode == 0
    assert json.loads(p.stdout) == {"task_id": tid, "ready": False, "endpoint": None,
                                    "queue_position": 2, "eta_s": 10.0, "status": "queued"}
    # Reuse of --task-id: no createTask, straight to polling.
    p = gmp("submit", "--base-url", testbed.url, "--task-id", tid, "--interval", "0.01")
    assert p.returncode == 0, p.stderr
    endpoint = json.loads(p.stdout)["endpoint"]
    # stop without --endpoint looks the endpoint up with `ready`
    p = gmp("stop", "--base-url", testbed.url, "--task-id", tid)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["stopped"] is True and out["endpoint"] == endpoint
    assert out["stop_url"] == endpoint + "/stop"


def test_deadline_exit_code_and_message(testbed):
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, job=False, online_ready_after=10**6) as tb:
        p = gmp("submit", "--base-url", tb.url, "--model-name", "m", "--interval", "0.05",
                "--deadline", "0.5", "--print-endpoint")
    assert p.returncode == ExitCode.TIMEOUT
    assert p.stdout == ""
    assert "got no endpoint within the 0.5 s deadline" in p.stderr
    assert "gmp online submit --task-id" in p.stderr


def test_service_error_and_bad_token(testbed):
    p = gmp("ready", "--base-url", testbed.url, "--task-id", "nope")
    assert p.returncode == ExitCode.REMOTE_ERROR
    assert "online service ready: error code 40004: unknown task_id 'nope'" in p.stderr
    p = gmp("create", "--base-url", testbed.url, "--model-name", "m", token="wrong-token")
    assert p.returncode == ExitCode.AUTH
    assert "HTTP 401" in p.stderr and "wrong-token" not in p.stderr


def test_missing_token_and_url():
    p = gmp("create", "--base-url", "http://127.0.0.1:9", token=None)
    assert p.returncode == ExitCode.AUTH and "GMP_ONLINE_TOKEN" in p.stderr
    p = gmp("create")
    assert p.returncode == ExitCode.USAGE and "--base-url" in p.stderr


def test_plain_http_to_remote_host_refused_without_flag():
    p = gmp("create", "--base-url", "http://eval.example.invalid", "--model-name", "m")
    assert p.returncode == ExitCode.REFUSED
    assert "refusing plain HTTP to eval.example.invalid" in p.stderr and "--insecure-http" in p.stderr
    # With the flag the URL is accepted (and the unresolvable host is what fails).
    p = gmp("create", "--base-url", "http://eval.example.invalid", "--model-name", "m",
            "--insecure-http", "--timeout", "5")
    assert p.returncode == ExitCode.UNREACHABLE


@pytest.mark.parametrize("value", ["0", "-1", "none", "inf", "nan"])
def test_deadline_and_timeout_are_never_unbounded(value):
    for flag in ("--deadline", "--timeout"):
        p = gmp("submit", "--base-url", "http://127.0.0.1:9", flag, value)
        assert p.returncode == ExitCode.USAGE and "invalid duration" in p.stderr


def test_ctrl_c_prints_the_stop_command_when_not_a_tty():
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, job=False, online_ready_after=10**6) as tb:
        env = dict(os.environ, GMP_ONLINE_TOKEN=TOKEN, NO_COLOR="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "genmanip", "online", "submit", "--base-url", tb.url,
             "--model-name", "m", "--interval", "0.05"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            t0 = time.monotonic()
            while tb.stats.snapshot()["requests"].get("/api/v1/benchmark/onlineEvaluation/ready", 0) < 2:
                assert time.monotonic() - t0 < 30, "the client never polled"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert TOKEN not in out + err
    assert proc.returncode == ExitCode.INTERRUPTED
    assert out == ""
    created = err.split("created task ", 1)[1].split()[0]
    assert f"To stop it: gmp online stop --base-url {tb.url} --task-id {created}" in err

