"""The server killed mid-run: ``gmp eval`` stops quickly with the unreachable exit code (6), no
cleanup against the dead server, and says how to resume (issue 19, "stops are calm and quick")."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from genmanip_eval import EvalConfig
from genmanip_eval.cli import evaluate
from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.console import Console

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_server_ends_the_run_quickly_with_exit_6_and_the_resume_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    code = (
        "import threading\n"
        "from genmanip_testbed import serve_testbed\n"
        f"with serve_testbed(tasks='testbed/reach', port={port}, faults='latency=30ms', run_id='gone1'):\n"
        "    threading.Event().wait()\n"
    )
    server = subprocess.Popen([sys.executable, "-c", code],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "testbed did not start"
                time.sleep(0.1)
        killed_at: list[float] = []

        def kill_soon() -> None:
            time.sleep(2.0)
            killed_at.append(time.monotonic())
            server.send_signal(signal.SIGKILL)

        threading.Thread(target=kill_soon, daemon=True).start()
        cfg = EvalConfig(url=url, worker_ids=["0", "1"], policy="zero", record=False,
                         timeouts={"server_wait": 3.0})
        with pytest.raises(GenmanipError) as info:
            evaluate(cfg, Console(sys.stderr))
        took = time.monotonic() - killed_at[0]
    finally:
        server.kill()
        server.wait(10)
    err = capsys.readouterr().err
    assert info.value.exit_code == ExitCode.UNREACHABLE, (info.value, err)
    assert "did not answer for 3 s" in str(info.value.hint)
    assert took < 20.0, took  # 3 s of waiting, then no cleanup retries against the dead server
    assert "To resume: gmp eval" in err and "--run-id gone1" in err
