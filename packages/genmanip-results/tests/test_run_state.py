"""A run's state (``RunInfo.state``) follows its writer: ``gmp eval``'s segments in ``run.json``
(host, pid, outcome), the process behind them (``live.process_alive``) and the run's newest write;
a finished or crashed run is never "live". Also the run key every page and report addresses runs
by (``discovery.run_key``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genmanip_results.discovery import RunScanner, load_run, run_key, run_rel
from genmanip_results.layout import (
    FRAME_SPOOL_SUFFIX,
    FRAMES_DIR,
    INCOMPLETE,
    MERGED_VIDEO,
    RUN_JSON,
)
from genmanip_results.live import ACTIVE_S, STALE_AFTER_S, owner_alive, parse_pid, process_alive
from genmanip_results.testing import write_client_episode, write_live_worker, writer_process

HOST = socket.gethostname()


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds")


def _segment(pid: int, *, host: str = HOST, started: float | None = None, outcome: str = "running",
             finished: float | None = None) -> dict[str, Any]:
    """A segment as genmanip_eval.runner writes it: id ``<host>:<pid>:<start>``."""
    t = time.time() - 30 if started is None else started
    return {"id": f"{host}:{pid}:{_iso(t)}", "host": host, "started": _iso(t), "outcome": outcome,
            "finished": None if finished is None else _iso(finished), "workers": ["0"]}


def _run(tmp_path: Path, *segments: dict[str, Any], incomplete: bool = True) -> Path:
    """A client run with one complete and (by default) one unfinished episode, its run.json
    carrying ``segments``, the way the recorder leaves it."""
    run = tmp_path / "res" / "bench" / "r1"
    write_client_episode(run, "bench/t/a", "0", steps=3, videos=False)
    if incomplete:
        write_client_episode(run, "bench/t/a", "1", steps=2, videos=False, complete=False)
    manifest = {"run_id": "r1", "benchmark": "bench", "total_episodes": 4}
    if segments:
        manifest["segments"] = list(segments)
    (run / RUN_JSON).write_text(json.dumps(manifest))
    return run


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process of this host that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    return proc.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """Stands in for a gmp eval process (its pid is what the segment names)."""
    with writer_process() as proc:
        yield proc


# ------------------------------------------------------------------------------ process_alive


def test_process_alive_on_this_host(dead_pid: int, sleeper: subprocess.Popen[bytes]) -> None:
    assert process_alive(os.getpid(), HOST) is True
    assert process_alive(sleeper.pid, HOST, started=time.time() + 60) is True
    assert process_alive(dead_pid, HOST) is False
    # The pid is there, but its process started long after the writer recorded itself: reused.
    assert process_alive(sleeper.pid, HOST, started=time.time() - 3600) is False
    # Another machine, or no pid: this machine cannot tell.
    assert process_alive(sleeper.pid, HOST + "-elsewhere") is None
    assert process_alive(None, HOST) is None
    assert process_alive(sleeper.pid, None) is None


@pytest.mark.parametrize(
    ("text", "pid"),
    [("4242", 4242), ("1", 1), ("0", None), ("-5", None), ("", None), ("12a", None), (" 12", None),
     ("\u0661\u0662", None), ("1.5", None), (None, None), (12, None)],
)
def test_parse_pid_reads_only_a_positive_decimal(text: Any, pid: int | None) -> None:
    assert parse_pid(text) == pid


def test_owner_alive_takes_a_note_as_recorded(dead_pid: int, sleeper: subprocess.Popen[bytes]) -> None:
    assert owner_alive(str(os.getpid()), HOST) is True
    assert owner_alive(str(sleeper.pid), HOST) is True
    assert owner_alive(str(dead_pid), HOST) is False
    # A note of this host with no usable pid has no owner left ...
    for bad in ("", "x", "0", "-1", None):
        assert owner_alive(bad, HOST) is False, bad
    # ... while another host's (or an unknown host's) is never raced: alive, whatever its pid.
    for host in (HOST + "-elsewhere", None, 7, ["h"]):
        assert owner_alive(str(dead_pid), host) is True, host
        assert owner_alive("x", host) is True, host
    assert owner_alive(str(dead_pid), "gpu1", this_host="gpu1") is False


def test_a_killed_unreaped_process_is_not_alive(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        proc.kill()
        stat = Path(f"/proc/{proc.pid}/stat")
        deadline = time.monotonic() + 30
        while stat.read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        assert process_alive(proc.pid, HOST) is False
    finally:
        proc.wait(30)


# ------------------------------------------------------------------------------- run states


def test_a_running_segment_whose_process_lives_is_live(tmp_path: Path) -> None:
    run = _run(tmp_path, _segment(os.getpid()))
    info = load_run(run, now=time.time() + 3600)  # nothing written for an hour: the pid decides
    assert (info.state, info.live) == ("live", True)
    assert str(os.getpid()) in info.state_detail


def test_a_running_segment_whose_process_is_gone_is_interrupted(tmp_path: Path, dead_pid: int) -> None:
    run = _run(tmp_path, _segment(dead_pid))
    info = load_run(run, now=time.time() + ACTIVE_S + 1)
    assert (info.state, info.live) == ("interrupted", False)
    assert f"pid {dead_pid}" in info.state_detail and "gone" in info.state_detail
    # ... but while its files still change it is live (a process this host cannot see).
    assert load_run(run).state == "live"


def test_a_finished_run_is_not_live_while_its_last_files_settle(tmp_path: Path) -> None:
    """The reported bug: 'live' for up to 5 minutes after the run finished (an INCOMPLETE episode
    left by the run's end, written a moment ago)."""
    end = time.time()
    run = _run(tmp_path, _segment(os.getpid(), outcome="complete", finished=end))
    info = load_run(run, now=end + 1)
    assert (info.state, info.live) == ("complete", False)
    stopped = _run(tmp_path / "b", _segment(os.getpid(), outcome="stopped", finished=end))
    assert load_run(stopped).state == "stopped"
    ctrl_c = _run(tmp_path / "c", _segment(os.getpid(), outcome="interrupted", finished=end))
    assert load_run(ctrl_c).state == "interrupted"
    failed = _run(tmp_path / "d", _segment(os.getpid(), outcome="failed", finished=end))
    assert load_run(failed).state == "failed"


def test_resumed_runs_go_by_their_newest_segment(tmp_path: Path, dead_pid: int) -> None:
    t = time.time()
    crashed_then_completed = _run(
        tmp_path, _segment(dead_pid, started=t - 600), _segment(os.getpid(), started=t - 300,
                                                                outcome="complete", finished=t - 5)
    )
    assert load_run(crashed_then_completed, now=t + 60).state == "complete"
    resumed_and_running = _run(
        tmp_path / "b", _segment(dead_pid, started=t - 600, outcome="interrupted", finished=t - 500),
        _segment(os.getpid(), started=t - 300),
    )
    assert load_run(resumed_and_running, now=t + 60).state == "live"


def test_a_run_recorded_on_another_host_goes_by_its_writes(tmp_path: Path) -> None:
    run = _run(tmp_path, _segment(12345, host="gpu-box-7"))
    now = time.time()
    assert load_run(run, now=now + 60).state == "live"
    info = load_run(run, now=now + STALE_AFTER_S + 60)
    assert info.state == "interrupted" and "gpu-box-7" in info.state_detail


def test_the_frame_spool_of_a_running_episode_is_its_heartbeat(tmp_path: Path, dead_pid: int) -> None:
    """steps.jsonl is buffered; the frame spools grow at every observation. A run whose process
    looks gone from here stays live while they do."""
    run = _run(tmp_path, _segment(dead_pid))
    old = time.time() - 3600
    for d, _dirs, files in os.walk(run):
        for name in [*files, "."]:
            os.utime(Path(d) / name, (old, old))
    assert load_run(run).state == "interrupted"
    spool = run / "bench/t/a/1" / FRAMES_DIR / f"left_camera{FRAME_SPOOL_SUFFIX}"
    spool.parent.mkdir()
    spool.write_bytes(b"\x00\x00\x00\x01x")
    for d in (spool.parent, spool.parent.parent):  # only the file's own write is new
        os.utime(d, (old, old))
    info = load_run(run)
    assert info.state == "live"
    (ep,) = [e for e in info.episodes if not e.complete]
    assert ep.mtime >= spool.stat().st_mtime


def test_the_scanner_follows_a_run_from_live_to_interrupted(tmp_path: Path) -> None:
    """Incremental rescans see the change (no cached state)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        run = _run(tmp_path, _segment(proc.pid, started=time.time() + 5))
        scanner = RunScanner(tmp_path / "res")
        later = time.time() + ACTIVE_S + 1
        assert [r.state for r in scanner.scan(now=later)] == ["live"]
    finally:
        proc.kill()
        proc.wait(30)
    assert [r.state for r in scanner.scan(now=later)] == ["interrupted"]
    assert run.is_dir()


def test_runs_without_segments_keep_the_earlier_rules(tmp_path: Path) -> None:
    run = _run(tmp_path)  # no segments: an older recording
    now = time.time()
    assert load_run(run, now=now + 10).state == "live"  # an INCOMPLETE episode written just now
    assert load_run(run, now=now + STALE_AFTER_S + 10).state is None
    manifest = json.loads((run / RUN_JSON).read_text())
    (run / RUN_JSON).write_text(json.dumps({**manifest, "finished": _iso(now)}))
    assert load_run(run, now=now + 10).state == "finished"
    quiet = _run(tmp_path / "b", incomplete=False)
    assert load_run(quiet, now=now + 10).state is None
    write_live_worker(quiet, "0")
    assert load_run(quiet, now=now + 10).state == "live"  # live frames, no segments
    assert (quiet / "bench/t/a/0").is_dir() and not (quiet / "bench/t/a/0" / INCOMPLETE).exists()


def test_server_runs_stale_locks_say_interrupted(tmp_path: Path) -> None:
    run = tmp_path / "saved" / "eval_results" / "bench" / "srv"
    (run / "bench" / "t").mkdir(parents=True)
    (run / "progress.json").write_text(json.dumps({"*(0/2)bench/t": {"score": 0.0, "sr": 0.0}}))
    lock = run / "bench" / "t" / "000.lock"
    lock.write_text(json.dumps({"worker_id": "0", "timestamp": time.time()}))
    assert load_run(run).state == "live"
    info = load_run(run, now=time.time() + STALE_AFTER_S + 10)
    assert info.state == "interrupted" and not info.live


def test_the_plot_video_is_no_camera(tmp_path: Path) -> None:
    ep = write_client_episode(tmp_path / "b" / "r", "t/a", "0", steps=3, cameras=["left_camera"])
    (ep / MERGED_VIDEO).write_bytes((ep / "left_camera.mp4").read_bytes())
    (info,) = load_run(tmp_path / "b" / "r").episodes
    assert set(info.videos) == {"left_camera"}


# ---------------------------------------------------------------------------------- run key


def test_run_key_is_the_hash_of_the_path_under_the_root(tmp_path: Path) -> None:
    run = tmp_path / "root" / "client_results" / "bench" / "r1"
    run.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "root")
    assert run_rel(run, tmp_path / "root") == "client_results/bench/r1"
    assert run_rel(tmp_path / "link" / "client_results/bench/r1", tmp_path / "root") == (
        "client_results/bench/r1"
    )
    assert run_rel(run, tmp_path / "elsewhere") == "r1"  # not under the root: its name
    key = run_key("client_results/bench/r1")
    import hashlib

    assert key == hashlib.sha256(b"client_results/bench/r1").hexdigest()[:12]
    assert run_key("client_results/bench/r2") != key and len(key) == 12
