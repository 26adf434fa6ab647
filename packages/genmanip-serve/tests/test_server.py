"""The server against raw WebSocket clients: metadata, replies, bad input, limits, auth, HTTP routes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
from genmanip_serve import PolicyServer, ServeOptions, decode_message, encode_message, serve_policy
from serve_helpers import make_obs
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import ClientConnection, connect

KEY = "s3cret-key-for-tests"


@pytest.fixture()
def server() -> Iterator[PolicyServer]:
    with serve_policy("serve_helpers:failing", options=ServeOptions(port=0, max_message_bytes=1 << 20)) as s:
        yield s


def _client(server: PolicyServer, key: str | None = None) -> tuple[ClientConnection, dict[str, object]]:
    headers = {"Authorization": f"Api-Key {key}"} if key else None
    # entered by hand: websockets >= 17 wants connect() used as a context manager; ws.close() ends it
    ws = connect(server.url, compression=None, max_size=None, additional_headers=headers,
                 proxy=None).__enter__()
    return ws, decode_message(ws.recv(timeout=10))


def _infer(ws: ClientConnection, obs: dict[str, object]) -> dict[str, object] | str:
    ws.send(encode_message(obs))
    reply = ws.recv(timeout=10)
    return reply if isinstance(reply, str) else decode_message(reply)


def _get(server: PolicyServer, path: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(server.url.replace("ws://", "http://") + path)
    if key:
        req.add_header("Authorization", f"Api-Key {key}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metadata_reply_and_timing(server: PolicyServer) -> None:
    ws, meta = _client(server)
    assert meta["server"] == "genmanip-serve" and meta["has_chunk"] and meta["max_message_bytes"] == 1 << 20
    obs = make_obs(3, cameras=False)
    # an openpi-style request (no gmp fields): a chunk, as `actions` (horizon, dim)
    r1 = _infer(ws, obs)
    assert isinstance(r1, dict)
    assert r1["actions"].shape == (3, 19) and "gmp/actions" not in r1  # 16 joints + 3 base
    assert r1["actions"][0, 16] == 3.0
    t = r1["server_timing"]
    assert t["batch_size"] == 1 and t["infer_ms"] >= 0 and "prev_total_ms" not in t
    # a gmp request: the exact action dicts too
    r2 = _infer(ws, {**obs, "gmp/worker_id": "7", "gmp/mode": "action", "gmp/new_episode": True})
    assert isinstance(r2, dict)
    assert r2["actions"].shape == (1, 19) and r2["gmp/mode"] == "action"
    (action,) = r2["gmp/actions"]
    assert action["control_type"] == "joint_position" and action["base_motion"] == [3.0, 0.0, 0.0]
    assert "prev_total_ms" in r2["server_timing"]
    ws.close()
    stats = json.loads(_get(server, "/stats")[1])
    assert stats["requests"] == 2 and {w for b in stats["recent"] for w in b["workers"]} >= {"7@1", "conn1"}


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (b"\xc1not msgpack", "<message>"),
        (msgpack.packb([1, 2, 3]), "<message>"),
        ("a text frame", "<message>"),
        (msgpack.packb({"video.top_camera_view": {b"__ndarray__": True, b"data": b"\0" * 8,
                                                  b"dtype": "|O", b"shape": [1]}}, use_bin_type=True),
         "video.top_camera_view"),
        (msgpack.packb({"gmp/worker_id": 3}), "gmp/worker_id"),
        (msgpack.packb({"gmp/mode": "everything"}), "gmp/mode"),
        (msgpack.packb({"gmp/bogus": 1}), "gmp/bogus"),
    ],
)
def test_bad_input_is_a_text_frame_and_serving_goes_on(server: PolicyServer, frame: bytes | str, field: str) -> None:
    ws, _ = _client(server)
    other, _ = _client(server)
    ws.send(frame)
    reply = ws.recv(timeout=10)
    assert isinstance(reply, str) and reply.startswith("invalid-request: ")
    if field != "<message>":
        assert repr(field) in reply
    # the same connection, and another client, are still served
    assert isinstance(_infer(ws, make_obs(1, cameras=False)), dict)
    assert isinstance(_infer(other, make_obs(2, cameras=False)), dict)
    ws.close()
    other.close()


def test_policy_failure_is_a_text_frame(server: PolicyServer) -> None:
    ws, _ = _client(server)
    obs = make_obs(0, cameras=False)
    reply = _infer(ws, {**obs, "instruction": "fail"})
    assert isinstance(reply, str) and reply.startswith("policy-failed: ") and "out of cheese" in reply
    assert isinstance(_infer(ws, obs), dict)
    ws.close()


def test_oversized_message_closes_that_connection_only(server: PolicyServer) -> None:
    ws, _ = _client(server)
    other, _ = _client(server)
    ws.send(encode_message({"video.x": np.zeros(2 << 20, dtype=np.uint8)}))
    with pytest.raises(ConnectionClosedError) as ei:
        ws.recv(timeout=10)
    assert ei.value.rcvd is not None and ei.value.rcvd.code == 1009
    assert isinstance(_infer(other, make_obs(0, cameras=False)), dict)
    other.close()


def test_healthz_and_stats_routes(server: PolicyServer) -> None:
    assert _get(server, "/healthz") == (200, "ok\n")
    code, body = _get(server, "/stats")
    assert code == 200 and json.loads(body)["server"] == "genmanip-serve"


def test_api_key() -> None:
    with serve_policy("serve_helpers:echo", options=ServeOptions(port=0, api_key=KEY)) as s:
        assert _get(s, "/healthz")[0] == 200  # health checks need no key
        code, body = _get(s, "/stats")
        assert code == 401 and "Authorization: Api-Key" in body
        assert _get(s, "/stats", KEY)[0] == 200
        for key, text in ((None, "requires an API key"), ("wrong", "was refused")):
            with pytest.raises(InvalidStatus) as ei:
                _client(s, key)
            assert ei.value.response.status_code == 401
            assert text in bytes(ei.value.response.body or b"").decode()
        ws, meta = _client(s, KEY)
        assert meta["server"] == "genmanip-serve" and isinstance(_infer(ws, make_obs(0, cameras=False)), dict)
        ws.close()
        assert json.loads(_get(s, "/stats", KEY)[1])["errors"]["auth"] == 3


def test_on_policy_error_sees_the_policys_exception_before_its_client_does() -> None:
    import threading

    from genmanip_eval.inference import Inference

    seen: list[BaseException] = []
    events: list[str] = []

    def hook(exc: BaseException) -> None:
        events.append("hook")
        seen.append(exc)
        if len(seen) == 2:
            raise RuntimeError("a broken hook")  # logged; the client still gets its frame

    inference = Inference.create("serve_helpers:failing")
    server = PolicyServer(inference, ServeOptions(port=0), on_policy_error=hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ws, _ = _client(server)
        obs = make_obs(0, cameras=False)
        for _ in range(2):
            reply = _infer(ws, {**obs, "instruction": "fail"})
            events.append("frame")
            assert isinstance(reply, str) and reply.startswith("policy-failed: ")
        assert events == ["hook", "frame", "hook", "frame"]
        assert all("out of cheese" in str(e) for e in seen)
        assert isinstance(_infer(ws, obs), dict) and len(seen) == 2  # a good request: no call
        ws.close()
    finally:
        server.close()
        thread.join(timeout=10)
        inference.close()
