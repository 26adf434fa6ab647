"""The ws:// client (through genmanip-eval's Inference, as gmp eval uses it) against real servers."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_eval.errors import PolicyError
from genmanip_eval.inference import BatchItem, Inference
from genmanip_protocol.robots import get_robot
from genmanip_serve import (
    KeyMapError,
    PolicyServerAuthError,
    PolicyServerGone,
    PolicyServerRejected,
    PolicyServerTimeout,
    PolicyServerUnreachable,
    RemotePolicyError,
    decode_message,
    encode_message,
    load_keymap,
)
from serve_helpers import ROBOT, make_obs
from websockets.sync.server import ServerConnection, serve

HERE = Path(__file__).resolve().parent


def _stats(url: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url.replace("ws://", "http://") + "/stats", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _item(wid: str, i: int = 0, *, cameras: bool = True, **obs: Any) -> BatchItem:
    o = {**make_obs(i, episode=f"e{wid}", cameras=cameras), **obs}
    return BatchItem(wid, f"e{wid}", o, new_episode=i == 0)


def test_inference_over_ws_matches_in_process(server_proc: Callable[..., Any]) -> None:
    srv = server_proc(policy="expert")
    remote = Inference.create(srv.url)
    local = Inference.create("expert")
    try:
        assert remote.batched and remote.has_action and remote.has_chunk
        for i in range(3):
            batch = [_item("0", i), _item("1", i)]
            assert remote.actions(batch) == local.actions(batch)
        chunk = remote.chunks([_item("0", 3)])
        assert chunk == local.chunks([_item("0", 3)]) and len(chunk[0]) == 4
    finally:
        remote.close()
        local.close()
    stats = _stats(srv.url)
    assert stats["batcher"]["items"] == 7 and stats["connections_total"] == 2


_CLIENT = """
import sys, time, pathlib
from genmanip_eval.inference import BatchItem, Inference
from serve_helpers import make_obs
url, wid, go = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
inf = Inference.create(url)
(go.parent / f"ready-{wid}").touch()
while not go.exists():
    time.sleep(0.01)
for i in range(10):
    (a,) = inf.actions([BatchItem(wid, "e" + wid, make_obs(i, cameras=False), i == 0)])
    assert a["base_motion"][0] == float(i), a
inf.close()
"""


def test_two_client_processes_share_server_batches(
    server_proc: Callable[..., Any], tmp_path: Path, child_env: Callable[[str | None], dict[str, str]]
) -> None:
    # A long max wait: once both connections have a history (after their first request), each
    # batch waits for the other's request, which is due (calls cost 20 ms: a free policy's
    # batches wait for nobody).
    srv = server_proc(policy="serve_helpers:costly", max_wait_ms=20000)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _CLIENT, srv.url, wid, str(go)], env=child_env(None),
                         cwd=str(HERE), stderr=subprocess.PIPE, text=True)
        for wid in ("a", "b")
    ]
    for p in procs:  # both connected before either sends
        while not (tmp_path / f"ready-{'a' if p is procs[0] else 'b'}").exists():
            assert p.poll() is None, p.communicate()[1]
            threading.Event().wait(0.01)
    go.touch()
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    stats = _stats(srv.url)
    assert stats["batcher"]["items"] == 20
    assert stats["max_batch_connections"] == 2
    shared = [b for b in stats["recent"] if b["connections"] == 2]
    assert shared and all({w.split("@")[0] for w in b["workers"]} == {"a", "b"} for b in shared)


def test_server_dying_mid_request_is_a_typed_error(server_proc: Callable[..., Any]) -> None:
    srv = server_proc(policy="serve_helpers:dying")
    inf = Inference.create(srv.url, {"timeout": "600"})
    try:
        inf.actions([_item("0", 1)])
        with pytest.raises(PolicyServerGone) as ei:  # long before the 600 s deadline
            inf.actions([_item("0", 2, instruction="die")])
        assert isinstance(ei.value, PolicyError) and "closed worker 0's connection" in str(ei.value)
        assert srv.proc.wait(timeout=30) == 3
    finally:
        inf.close()


def test_reply_deadline(server_proc: Callable[..., Any]) -> None:
    srv = server_proc(policy="serve_helpers:slow", policy_arg=["delay=5"])
    inf = Inference.create(srv.url, {"timeout": "0.3"})
    try:
        with pytest.raises(PolicyServerTimeout) as ei:
            inf.actions([_item("0", 0, instruction="slow")])
        assert ei.value.timeout == 0.3 and ei.value.worker_id == "0"
    finally:
        inf.close()


def test_errors_of_the_server_and_of_the_connection(server_proc: Callable[..., Any]) -> None:
    srv = server_proc(policy="serve_helpers:failing", api_key="k3y-for-tests", max_message_mb=1)
    with pytest.raises(PolicyServerAuthError, match="requires an API key"):
        Inference.create(srv.url)
    with pytest.raises(PolicyServerAuthError, match="refused"):
        Inference.create(srv.url, {"api_key": "wrong"})
    inf = Inference.create(srv.url, {"api_key": "k3y-for-tests"})
    try:
        with pytest.raises(PolicyServerRejected) as ei:
            inf.actions([_item("0", 0, cameras=False, instruction="fail")])
        assert ei.value.kind == "policy-failed" and "out of cheese" in str(ei.value)
        assert inf.actions([_item("0", 1, cameras=False)])[0]["control_type"] == "joint_position"  # still served
        with pytest.raises(RemotePolicyError, match="over the policy server's limit"):
            inf.actions([_item("0", 2)])  # three 720x1280 frames > 1 MiB
    finally:
        inf.close()
    with pytest.raises(PolicyError, match="unknown --policy-arg"):
        Inference.create(srv.url, {"api_key": "k3y-for-tests", "bogus": "1"})


def test_unreachable_server() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PolicyServerUnreachable, match="cannot reach"):
        Inference.create(f"ws://127.0.0.1:{port}", {"connect_timeout": "5"})


# ------------------------------------------------------------------ an openpi-style server + key map


class OpenpiServer:
    """A minimal openpi-style policy server: its own metadata, its own keys, ``actions`` back."""

    def __init__(self, dim: int = 19, horizon: int = 5) -> None:
        self.dim, self.horizon = dim, horizon
        self.seen: list[dict[str, Any]] = []
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, ws: ServerConnection) -> None:
        ws.send(encode_message({"policy": "pi0-like"}))
        for msg in ws:
            obs = decode_message(msg)
            self.seen.append(obs)
            if "prompt" not in obs:
                ws.send("KeyError: 'prompt'")
                continue
            ws.send(encode_message({"actions": np.arange(self.horizon * self.dim, dtype=np.float32)
                                    .reshape(self.horizon, self.dim)}))

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture()
def openpi() -> Iterator[OpenpiServer]:
    s = OpenpiServer()
    yield s
    s.close()


KEYMAP = """
[observation]
"video.top_camera_view" = "observation/image"
"state.joints" = "observation/state"
"state.gripper" = "observation/state"
instruction = "prompt"

[action]
robot = "manip/lift2/R5a"
arm = [0, 12]
gripper = [12, 16]
base = [16, 19]
is_rel = true
"""


def test_keymap_against_an_openpi_server(openpi: OpenpiServer, tmp_path: Path) -> None:
    km = tmp_path / "map.toml"
    km.write_text(KEYMAP)
    inf = Inference.create(openpi.url, {"keymap": str(km)})
    try:
        (chunk,) = inf.chunks([_item("0")])
        (action,) = inf.actions([_item("0", 1)])
    finally:
        inf.close()
    assert set(openpi.seen[0]) == {"observation/image", "observation/state", "prompt"}
    assert openpi.seen[0]["observation/state"].shape == (16,)
    assert openpi.seen[0]["observation/image"].shape == get_robot(ROBOT).cameras["top_camera_view"]
    robot = get_robot(ROBOT)
    row = np.arange(19, dtype=np.float64)
    assert len(chunk) == 5 and action == chunk[0]
    assert action["action"] == robot.merge_joint_state(list(row[:12]), list(row[12:16]))
    assert action["base_motion"] == [16.0, 17.0, 18.0] and action["is_rel"] is True


def test_no_keymap_against_an_openpi_server_says_so(openpi: OpenpiServer) -> None:
    with pytest.raises(RemotePolicyError, match="not a gmp policy server") as ei:
        Inference.create(openpi.url)
    assert "keymap" in (ei.value.hint or "")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[observation]\ninstruction = "prompt"\n[action]\narm = [0, 12]\ngripper = [12, 16]\n[extra]\n', "extra"),
        ('[observation]\ninstruction = "prompt"\n[action]\nrobot = "manip/lift2/R5a"\narm = [0, 12]\n'
         'gripper = [12, 15]\n', "action.gripper"),
        ('[observation]\ninstruction = "prompt"\n[action]\narm = [0, 12]\n', "action.gripper"),
        ('[observation]\ninstruction = 3\n[action]\narm = [0, 12]\ngripper = [12, 16]\n', "observation.instruction"),
        ('[observation]\ninstruction = "prompt"\n[action]\narm = [0, 12]\ngripper = [12, 16]\nspeed = 2\n',
         "action.speed"),
        ("not toml [", "<file>"),
    ],
)
def test_wrong_keymap_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    km = tmp_path / "map.toml"
    km.write_text(text)
    with pytest.raises(KeyMapError) as ei:
        load_keymap(km)
    assert ei.value.key == key and isinstance(ei.value, PolicyError)


def test_keymap_that_does_not_fit_the_observation_or_the_reply(openpi: OpenpiServer, tmp_path: Path) -> None:
    km = tmp_path / "map.toml"
    km.write_text(KEYMAP.replace('"video.top_camera_view"', '"video.nope_view"'))
    inf = Inference.create(openpi.url, {"keymap": str(km)})
    try:
        with pytest.raises(KeyMapError) as ei:
            inf.actions([_item("0")])
        assert ei.value.key == "observation.video.nope_view"
    finally:
        inf.close()
    openpi.dim = 10
    km.write_text(KEYMAP)
    inf = Inference.create(openpi.url, {"keymap": str(km)})
    try:
        with pytest.raises(KeyMapError) as ei:
            inf.actions([_item("0")])
        assert ei.value.key == "action.arm" and "dim 10" in str(ei.value)
    finally:
        inf.close()
    # a key map the server does not accept: its text frame becomes a typed error
    km.write_text(KEYMAP.replace('instruction = "prompt"', 'instruction = "task"'))
    inf = Inference.create(openpi.url, {"keymap": str(km)})
    try:
        with pytest.raises(PolicyServerRejected, match="KeyError: 'prompt'"):
            inf.actions([_item("0")])
    finally:
        inf.close()


# ------------------------------------------------------------------ a hostile server_timing


class TimingServer:
    """A gmp-looking server (``max_batch`` 8) whose replies carry the ``server_timing`` values
    queued in ``timings``, one per request, in order."""

    def __init__(self, timings: list[Any]) -> None:
        self.timings = list(timings)
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, ws: ServerConnection) -> None:
        ws.send(encode_message({"server": "genmanip-serve", "max_batch": 8}))
        for msg in ws:
            decode_message(msg)
            action = get_robot(ROBOT).neutral_action()
            ws.send(encode_message({"gmp/actions": [action], "server_timing": self.timings.pop(0)}))

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


_HOSTILE_TIMINGS = [
    {"batch_size": True}, {"batch_size": "4"}, {"batch_size": -3}, {"batch_size": 0},
    {"batch_size": 2**63}, {"batch_size": 9}, {"batch_size": {"n": 4}}, {"batch_size": [4]},
    {"batch_size": 4.0}, {"batch_size": None}, {}, "batch_size=4", [4],
]


def test_hostile_server_timing_batch_size_says_nothing() -> None:
    # Valid values interleaved: a hostile one must replace the earlier size, not keep it.
    timings: list[Any] = []
    for t in _HOSTILE_TIMINGS:
        timings += [{"batch_size": 3}, t]
    timings += [{"batch_size": 8}]
    srv = TimingServer(timings)
    inf = Inference.create(srv.url)
    try:
        assert inf.batch_size_of("0") is None  # before any reply
        for i, t in enumerate(_HOSTILE_TIMINGS):
            inf.actions([_item("0", 2 * i, cameras=False)])
            assert inf.batch_size_of("0") == 3
            inf.actions([_item("0", 2 * i + 1, cameras=False)])
            assert inf.batch_size_of("0") is None, t
        inf.actions([_item("0", 99, cameras=False)])
        assert inf.batch_size_of("0") == 8  # the server's own max_batch is believed
        assert inf.batch_size_of("1") is None  # a worker that sent nothing
    finally:
        inf.close()
        srv.close()


def test_trusted_network_uses_no_proxy_and_does_not_warn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``0.0.0.0`` reaches this machine's server but is not a loopback name: an API key over
    ``ws://`` to it warns and goes through the environment's proxy, unless the caller vouches for
    the network (gmp's Ray actors, which talk over the cluster's own network)."""
    from genmanip_serve import RemotePolicy, ServeOptions, serve_policy

    with socket_port() as dead:  # a proxy nobody listens on
        for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, f"http://127.0.0.1:{dead}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        with serve_policy("serve_helpers:echo", options=ServeOptions(port=0, api_key="k3y")) as srv:
            url = f"ws://0.0.0.0:{srv.port}"
            caplog.set_level("WARNING")
            with pytest.raises(PolicyServerUnreachable):  # through the (dead) proxy
                RemotePolicy(url, api_key="k3y", connect_timeout=5)
            assert any("sent over plain http:// to 0.0.0.0" in r.getMessage()
                       for r in caplog.records), [r.getMessage() for r in caplog.records]
            caplog.clear()
            p = RemotePolicy(f"ws://0.0.0.0:{srv.port}/", api_key="k3y", trusted_network=True)
            try:
                (out,) = p.get_actions([_item("0", cameras=False)])
                assert isinstance(out, dict)
            finally:
                p.close()
            assert not [r for r in caplog.records if r.levelname == "WARNING"]


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections while the block runs (bound, not listening)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
