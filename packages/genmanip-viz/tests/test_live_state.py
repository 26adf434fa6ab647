"""``gmp viz`` follows a run within seconds: the API and the pages show the tree as it is now (not
the snapshot of the previous request), a finished run is not "live", and a run whose ``gmp eval``
is gone (killed) says "interrupted". Driven by files written the way the recorder writes them and
by a real ``gmp eval`` against the embedded testbed, killed with SIGKILL."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from genmanip_results.layout import RESULT_JSON, RUN_JSON
from genmanip_results.live import ACTIVE_S
from genmanip_results.testing import write_client_episode, writer_process
from genmanip_viz.server import VizServer


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds")


def _api(srv: VizServer, path: str = "/api/runs") -> list[dict[str, Any]]:
    r = requests.get(srv.base_url + path, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    runs: list[dict[str, Any]] = r.json()["runs"]
    return runs


def _until(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


def _client_run(results: Path, pid: int, started: float) -> Path:
    """A run being recorded by process ``pid``: run.json with its running segment (the id is
    ``<host>:<pid>:<start>``, as genmanip_eval.runner writes it), one finished episode and one
    being recorded."""
    run = results / "bench" / "r1"
    write_client_episode(run, "bench/t/a", "0", steps=3, videos=False)
    write_client_episode(run, "bench/t/a", "1", steps=2, videos=False, complete=False)
    host = socket.gethostname()
    (run / RUN_JSON).write_text(json.dumps({
        "run_id": "r1", "benchmark": "bench", "total_episodes": 4,
        "segments": [{"id": f"{host}:{pid}:{_iso(started)}", "host": host, "started": _iso(started),
                      "finished": None, "outcome": "running", "workers": ["0"]}],
    }))  # fmt: skip
    return run


def _age_tree(top: Path, seconds: float) -> None:
    t = time.time() - seconds
    for d, _dirs, files in os.walk(top):
        for name in [*files, "."]:
            os.utime(Path(d) / name, (t, t))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """Stands in for a gmp eval process (its pid is what the segment names)."""
    with writer_process() as proc:
        yield proc


def test_a_killed_writer_turns_live_into_interrupted(
    tmp_path: Path, viz_cache: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    results = tmp_path / "res"
    run = _client_run(results, sleeper.pid, started=time.time() + 5)
    _age_tree(run, 60)  # quiet files: only the process tells that it is running
    with VizServer(results, warm=False, cache_dir=viz_cache) as srv:  # the default 2 s interval
        (info,) = _api(srv)
        assert (info["state"], info["live"], info["done"], info["total"]) == ("live", True, 1, 4)
        assert f"pid {sleeper.pid}" in info["state_detail"]
        page = requests.get(srv.base_url + f"/run/{info['key']}", timeout=30).text
        assert 'data-state="live"' in page and '<span class="live"' in page
        sleeper.kill()
        sleeper.wait(30)
        t0 = time.monotonic()
        gone = _until("the state to leave 'live'",
                      lambda: next((r for r in _api(srv) if r["state"] != "live"), None), 10)
        assert time.monotonic() - t0 < 8.0  # a scan interval or so, not the 5-minute lock window
        assert (gone["state"], gone["live"]) == ("interrupted", False)
        assert f"pid {sleeper.pid}" in gone["state_detail"] and "gone" in gone["state_detail"]
        assert gone["display"]["state"] == "interrupted"
        runs_page = requests.get(srv.base_url + "/", timeout=30).text
        assert 'data-state="interrupted"' in runs_page and '<span class="live"' not in runs_page
        assert (_api(srv, f"/api/run/{gone['key']}")[0]["state"]) == "interrupted"
        assert requests.get(srv.base_url + "/api/run/ffffffffffff", timeout=30).status_code == 404


def test_one_request_after_a_change_shows_it(tmp_path: Path, viz_cache: Path) -> None:
    """Before, a request answered from the snapshot of the previous one (and only then started a
    rescan): a page opened after a quiet spell showed 10/32 while the run was at 23/32."""
    results = tmp_path / "res"
    run = _client_run(results, os.getpid(), started=time.time() - 30)
    with VizServer(results, warm=False, cache_dir=viz_cache, scan_interval=0.0) as srv:
        srv.app.state.viz.index.wait_for_scan()
        assert _api(srv)[0]["done"] == 1
        for seed in ("1", "2", "3"):
            write_client_episode(run, "bench/t/a", seed, steps=3, videos=False)
            (info,) = _api(srv)  # one request, no polling
            assert info["done"] == int(seed) + 1, info
        page = requests.get(srv.base_url + f"/run/{info['key']}", timeout=30).text
        assert '<b data-field="done">4 / 4</b>' in page


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_gmp_eval_killed_mid_run(tmp_path: Path, viz_cache: Path) -> None:
    from genmanip_testbed import serve_testbed

    results = tmp_path / "client_results"
    results.mkdir()
    (tmp_path / "slow_policy.py").write_text(
        "import time\n"
        "from genmanip_eval.policy import ZeroPolicy\n"
        "class Slow:\n"
        "    def __init__(self):\n"
        "        self.zero = ZeroPolicy()\n"
        "    def reset(self):\n"
        "        pass\n"
        "    def get_action(self, obs):\n"
        "        time.sleep(0.03)\n"
        "        return self.zero.get_action(obs)\n"
        "def make():\n"
        "    return Slow()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    with serve_testbed(tasks=("testbed/reach",), num_steps=20, results_root=tmp_path / "srv") as tb, \
            VizServer(results, warm=False, cache_dir=viz_cache) as srv:  # fmt: skip
        # (genmanip-eval's own runner, as `gmp eval` calls it: this package's tests do not
        # install the gmp command)
        code = ("import sys\n"
                "from genmanip_eval import EvalConfig, run_eval\n"
                "run_eval(EvalConfig(url=sys.argv[1], worker_ids=['0'], results_dir=sys.argv[2],\n"
                "                    policy='slow_policy:make'))\n")
        proc = subprocess.Popen([sys.executable, "-c", code, tb.url, str(results)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def live_run() -> Any:
            # (an eval that died says why at once, not after the whole timeout)
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            return next((r for r in _api(srv) if r["live"] and r["done"] >= 2), None)

        try:
            live = _until("the run to be live with two finished episodes", live_run, 240)
            assert live["state"] == "live" and f"pid {proc.pid}" in live["state_detail"]
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(60)
            if proc.stderr:
                proc.stderr.close()
        t0 = time.monotonic()
        gone = _until("the killed run to say interrupted",
                      lambda: next((r for r in _api(srv) if r["state"] == "interrupted"), None),
                      ACTIVE_S + 15)
        # its last frames were written just before the kill: live for at most ACTIVE_S more
        assert time.monotonic() - t0 < ACTIVE_S + 8.0
        assert not gone["live"] and f"pid {proc.pid}" in gone["state_detail"]
        # the counts are the tree's, not an old snapshot's
        on_disk = len(list(results.rglob(RESULT_JSON)))
        assert gone["done"] == on_disk >= 2


@pytest.mark.slow
def test_a_finished_run_is_complete_at_once(tmp_path: Path, viz_cache: Path) -> None:
    from genmanip_eval.cli import evaluate
    from genmanip_eval.runner import EvalConfig
    from genmanip_runtime.console import Console
    from genmanip_testbed import serve_testbed

    results = tmp_path / "client_results"
    results.mkdir()
    with VizServer(results, warm=False, cache_dir=viz_cache) as srv:
        assert _api(srv) == []
        with serve_testbed(tasks=("testbed/smoke",), results_root=tmp_path / "srv") as tb:
            cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], processes=1, policy="expert",
                             results_dir=str(results))  # fmt: skip
            summary = evaluate(cfg, Console(io.StringIO()), label="test")
            assert summary.complete
        # The page may answer from a snapshot up to one scan interval old; the first one that
        # shows the run (at most a scan interval later) shows it complete, never "live".
        t0 = time.monotonic()
        (info,) = _until("the finished run", lambda: _api(srv), 10)
        assert time.monotonic() - t0 < 2.0 + 3.0  # the scan interval + a scan
        assert (info["state"], info["live"]) == ("complete", False)
        assert info["done"] == info["total"] == len(list(results.rglob(RESULT_JSON)))
