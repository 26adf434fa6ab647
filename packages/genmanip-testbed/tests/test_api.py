"""Public API, the msgpack wire, concurrency, clean shutdown and the CLI."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import genmanip_testbed
import numpy as np
import pytest
from _tbhelpers import Raw, poll_reset
from genmanip_protocol.codec import MSGPACK_CONTENT_TYPE, JpegFrame, MsgpackCodec, Observation
from genmanip_testbed import UnknownConfigError, serve_testbed
from genmanip_testbed.app import build_asgi_app

pytestmark = pytest.mark.timeout(120)

ZERO = {"control_type": "joint_position", "action": [0.0] * 16, "is_rel": True}


def test_all_matches_public_names() -> None:
    public = {
        n
        for n, v in vars(genmanip_testbed).items()
        if not n.startswith("_") and not inspect.ismodule(v)
    }
    public -= {"annotations"}
    assert set(genmanip_testbed.__all__) == public | {"__version__"}
    assert sorted(genmanip_testbed.__all__, key=str.lower) == sorted(
        set(genmanip_testbed.__all__), key=str.lower
    )
    assert not any(n.startswith("Test") for n in genmanip_testbed.__all__)


def _mp(raw: Raw, path: str, obj: object, frames: str | None = None) -> tuple[int, object]:
    headers = {"X-Genmanip-Frames": frames} if frames else {}
    st, hdr, data = raw.request(
        "POST", path, MsgpackCodec().encode(obj), ctype=MSGPACK_CONTENT_TYPE, headers=headers
    )
    if st == 200:
        assert hdr["content-type"] == MSGPACK_CONTENT_TYPE
        assert float(hdr["x-genmanip-server-ms"]) >= 0
        return st, MsgpackCodec().decode(data)
    return st, data


def test_msgpack_wire_raw_and_jpeg_frames() -> None:
    with serve_testbed(tasks=("testbed/smoke",), wire="both") as tb:
        raw = Raw(tb.url)
        st, proto = raw.get_json("/protocol")
        assert proto == {
            "server": "genmanip-testbed",
            "testbed": True,
            "version": genmanip_testbed.__version__,
            "protocol_versions": [1],
            "codecs": ["msgpack", "legacy"],
            "frames": ["raw", "jpeg"],
            "robot_id": "manip/lift2/R5a",
            "auth": False,
        }
        st, resp = _mp(raw, "/reset", {"worker_ids": ["0"]})
        assert st == 200 and resp["0"]["reset_pending"] is True
        while True:
            st, resp = _mp(raw, "/reset_result", {"worker_ids": ["0"]})
            if not resp["0"].get("reset_pending"):
                break
            time.sleep(0.01)
        obs = resp["0"]["obs"]
        assert isinstance(obs, Observation) and not obs.is_encoded("video.top_camera_view")
        top = obs["video.top_camera_view"]
        assert top.shape == (720, 1280, 3) and top.dtype == np.uint8
        assert obs["state.joints"].dtype == np.float32 and obs["state.joints"].shape == (12,)
        st, resp = _mp(raw, "/step", {"0": ZERO}, frames="jpeg")
        obs = resp["0"]["obs"]
        assert obs.is_encoded("video.left_camera_view")
        assert isinstance(obs.jpeg_frame("video.left_camera_view"), JpegFrame)
        assert obs["video.left_camera_view"].shape == (480, 640, 3)
        st, resp = _mp(raw, "/step_chunk", [{"0": ZERO}] * 3)
        assert (
            st == 200 and resp["executed_steps"] == 3 and resp["obs"]["0"]["obs"]["timestep"] == 4
        )
        st, body = raw.request("POST", "/step", b"\x00garbage", ctype=MSGPACK_CONTENT_TYPE)[::2]
        assert st == 400 and b"Invalid msgpack in request body" in body
        st, body = raw.request(
            "POST",
            "/step",
            MsgpackCodec().encode({"0": ZERO}),
            ctype=MSGPACK_CONTENT_TYPE,
            headers={"X-Genmanip-Frames": "png"},
        )[::2]
        assert st == 400 and b"X-Genmanip-Frames" in body
        raw.close()
    with serve_testbed(tasks=("testbed/smoke",), wire="msgpack") as tb:
        raw = Raw(tb.url)
        st, _, body = raw.request("POST", "/reset", b"", ctype="application/octet-stream")
        assert st == 415 and b"msgpack" in body
        assert raw.get_json("/protocol")[1]["codecs"] == ["msgpack"]
        raw.close()


def test_parallel_workers_are_served_concurrently_and_counted_once() -> None:
    with serve_testbed(tasks=("testbed/all",), reset_delay=0.01) as tb:
        wids = ["0", "1", "2", "3"]
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": wids})
        poll_reset(raw, wids)
        raw.close()

        def drive(wid: str) -> int:
            r = Raw(tb.url)
            n = 0
            for _ in range(15):
                st, _ = r.pickle_post("/step", {wid: ZERO})
                assert st == 200
                n += 1
            r.close()
            return n

        with ThreadPoolExecutor(4) as pool:
            counts = list(pool.map(drive, wids))
        assert counts == [15] * 4
        assert dict(tb.stats.steps_by_worker) == {w: 15 for w in wids}
        assert all(v == 15 for v in tb.stats.steps_by_episode.values())
        # One multi-worker /step moves everyone by one.
        raw = Raw(tb.url)
        st, resp = raw.pickle_post("/step", {w: ZERO for w in wids})
        assert st == 200 and {resp[w]["obs"]["timestep"] for w in wids} == {16}
        # One bad worker fails the whole request; the others still advanced.
        bad = {
            **{w: ZERO for w in wids[:3]},
            "3": {"control_type": "joint_position", "action": [0.0]},
        }
        st, body = raw.pickle_post("/step", bad)
        assert st == 500 and "RayTaskError(ValueError)" in body["detail"]
        assert [tb.stats.steps_by_worker[w] for w in wids] == [17, 17, 17, 16]
        raw.close()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_clean_shutdown_and_temp_results() -> None:
    before = {t.ident for t in threading.enumerate()}
    with serve_testbed(tasks=("testbed/smoke",)) as tb:
        root = Path(tb.results_root)
        port = tb.port
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        poll_reset(raw, ["0"])
        raw.pickle_post("/step", {"0": ZERO})
        raw.close()
        assert root.is_dir() and _port_open(port)
    time.sleep(0.2)
    leaked = [
        t for t in threading.enumerate() if t.ident not in before and t.name.startswith("testbed")
    ]
    assert leaked == [] and not _port_open(port)
    assert not root.exists()  # the temp results dir we created is removed


def test_unknown_task_set_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownConfigError, match="Config file testbed/what not found"):
        with serve_testbed(tasks=("testbed/what",), results_root=tmp_path):
            pass


# `gmp testbed serve --port 0 --tasks testbed/smoke --results-root DIR --no-save-process
# --run-id cli`: the handler with the parser's defaults for every other flag, called the way gmp
# calls it (the parser lives in the meta package, which this package's tests do not install).
_SERVE = """\
import sys
from genmanip_runtime.console import Console
from genmanip_testbed.cli import serve
sys.exit(serve(
    host="127.0.0.1", port=0, token=None, wire="both", robot="manip/lift2/R5a",
    tasks=["testbed/smoke"], results_root=sys.argv[1], save_process=False, fault=[],
    no_job=False, run_id="cli", num_steps=None, capacity=8, reset_delay=0.03,
    is_relative_action=False, seed=0, without_render=False, online_token=None,
    leaderboard_token=None, ssl_certfile=None, ssl_keyfile=None, console=Console(),
))
"""


def test_cli_serve_and_interrupt(tmp_path: Path) -> None:
    """The serve handler in a child process: token from the environment, URL and access log on
    stderr (never the token), nothing on stdout, Ctrl-C stops it cleanly with exit 0."""
    env = {**os.environ, "GMP_TESTBED_TOKEN": "clitok"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        seen = []
        m = None
        while m is None and len(seen) < 20:
            line = proc.stderr.readline()
            assert line, "".join(seen)  # the server exited before printing its URL
            seen.append(line)
            m = re.search(r"testbed serving http://127\.0\.0\.1:(\d+)", line)
        assert m, "".join(seen)
        url = f"http://127.0.0.1:{m.group(1)}"
        deadline = time.monotonic() + 30
        while True:
            try:
                raw = Raw(url, "clitok")
                st, body = raw.get_json("/status")
                raw.close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert st == 200 and body["data"]["run_id"] == "cli"
        raw = Raw(url)
        assert raw.get_json("/status")[0] == 401
        raw.close()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "clitok" not in err and "clitok" not in out
    assert re.search(r"GET /status 200 [\d.]+ms \d+B", err)
    assert out == ""


def test_cli_access_log_escapes_a_hostile_request_line(tmp_path: Path) -> None:
    """A client's path reaches the access log decoded (``%1b`` is ESC): an OSC 52 clipboard
    write, a screen clear, a bidi override and CR LF forging an ``ok:`` line are written out
    escaped, one line per request; nothing of it reaches the terminal raw."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "GMP_TESTBED_TOKEN"},
    )
    hostile = [
        "/%1b]52;c;aGVsbG8=%07x",  # OSC 52: write the clipboard
        "/%1b[2J%1b[H",  # clear the screen, cursor home
        "/a%0d%0aok:%20all%20episodes%20passed",  # forge the next log line
        "/%e2%80%aeevil",  # U+202E right-to-left override
        "/%c2%9b31m",  # C1 CSI
    ]
    try:
        assert proc.stderr is not None
        m = None
        seen: list[bytes] = []
        while m is None and len(seen) < 20:
            line = proc.stderr.readline()
            assert line, b"".join(seen)
            seen.append(line)
            m = re.search(rb"testbed serving http://127\.0\.0\.1:(\d+)", line)
        assert m, b"".join(seen)
        url = f"http://127.0.0.1:{m.group(1).decode()}"
        deadline = time.monotonic() + 30
        while True:
            try:
                raw = Raw(url)
                assert raw.get_json("/status")[0] == 200
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        for path in hostile:
            assert raw.get_json(path)[0] == 404
        raw.close()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err_bytes = proc.communicate(timeout=30)
    assert proc.returncode == 0, err_bytes
    err = err_bytes.decode("utf-8")
    lines = err.splitlines()
    access = [ln for ln in lines if re.search(r" GET /.* 404 [\d.]+ms \d+B$", ln)]
    assert len(access) == len(hostile), err
    assert not any(ln.startswith("ok:") for ln in lines), err
    assert "\x1b" not in err and "\r" not in err, err
    assert not any(ch in err for ch in ("\x07", "\u202e", "\x9b")), err
    for escaped in ("GET /\\x1b]52;c;aGVsbG8=\\x07x 404", "GET /\\x1b[2J\\x1b[H 404",
                    "GET /a\\r\\nok: all episodes passed 404", "GET /\\u202eevil 404",
                    "GET /\\x9b31m 404"):  # fmt: skip
        assert escaped in err, err


def test_unknown_routes_and_methods_answer_like_fastapi() -> None:
    with serve_testbed(tasks=("testbed/smoke",)) as tb:
        raw = Raw(tb.url)
        assert raw.get_json("/nope") == (404, {"detail": "Not Found"})
        assert raw.get_json("/step") == (405, {"detail": "Method Not Allowed"})
        st, hdr, _ = raw.request("GET", "/openapi.json")
        assert st == 200 and "x-genmanip-server-ms" in hdr
        assert "/step_chunk" in raw.get_json("/openapi.json")[1]["paths"]
        raw.close()


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    from genmanip_protocol.errors import ExitCode
    from genmanip_testbed import OptionError

    with pytest.raises(OptionError, match=re.escape("run_id '../x'")) as ei:
        with serve_testbed(tasks="testbed/smoke", run_id="../x", results_root=tmp_path):
            pass
    assert ei.value.exit_code == ExitCode.USAGE
    with pytest.raises(OptionError, match="wire"):
        with serve_testbed(wire="grpc", results_root=tmp_path):
            pass


def test_single_arm_robot_over_http_and_busy_port() -> None:
    from genmanip_testbed import ServerStartError

    with serve_testbed("manip/franka/panda_hand", tasks="testbed/smoke") as tb:
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        first = poll_reset(raw, ["0"])["0"]
        obs = first["obs"]
        assert obs["robot_id"] == "manip/franka/panda_hand"
        assert obs["state.base"] == [0.0, 0.0, 0.0]  # a plain list on single-arm robots
        assert {k for k in obs if k.startswith("video.")} == {
            "video.obs_camera_view",
            "video.obs_camera_2_view",
            "video.realsense_view",
        }
        act = {"control_type": "joint_position", "action": [0.0] * 7 + [0.04, 0.04], "is_rel": True}
        st, resp = raw.pickle_post("/step", {"0": act})
        assert st == 200 and resp["0"]["obs"]["timestep"] == 1
        st, resp = raw.pickle_post("/step", {"0": {**act, "action": [0.0] * 16}})
        assert st == 500 and "value array of shape (16,)" in resp["detail"]
        raw.close()
        with pytest.raises(ServerStartError, match="cannot listen"):
            with serve_testbed(tasks="testbed/smoke", port=tb.port):
                pass


def test_a_request_is_counted_before_its_reply_leaves() -> None:
    # A client that holds its answer must find the request in the stats (it once raced the log).
    with serve_testbed(tasks="testbed/smoke") as tb:
        app = build_asgi_app(tb.server)
        seen: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                seen.append(tb.stats.snapshot())

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": "/docs", "raw_path": b"/docs", "root_path": "",
            "query_string": b"", "headers": [], "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", tb.port),
        }
        asyncio.run(app(scope, receive, send))
        assert seen and seen[0]["requests"].get("/docs") == 1
        assert seen[0]["statuses"].get("200") == 1
