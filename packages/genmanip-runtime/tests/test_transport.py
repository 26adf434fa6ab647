"""HttpTransport against real servers on 127.0.0.1 (stdlib ThreadingHTTPServer and uvicorn)."""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import os
import pickle
import signal
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from genmanip_protocol.errors import ConfigError, DecodeError, ExitCode
from genmanip_runtime import _connection
from genmanip_runtime import transport as transport_mod
from genmanip_runtime.errors import (
    AuthError,
    ConnectError,
    HTTPStatusError,
    RequestTimeout,
    ResponseTooLarge,
    TransportError,
    UnexpectedReply,
)
from genmanip_runtime.transport import HttpTransport, build_base_url

TOKEN = "s3cret-token-value"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.server.idle_timeout:
            self.connection.settimeout(self.server.idle_timeout)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, status: int, body: bytes, ctype: str = "application/json",
               close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        srv = self.server
        with srv.lock:
            srv.hits[url.path] = srv.hits.get(url.path, 0) + 1
            hit = srv.hits[url.path]
        path = url.path
        if path == "/echo":
            info = {
                "method": self.command,
                "path": path,
                "query": q,
                "port": self.client_address[1],
                "auth": self.headers.get("Authorization"),
                "ctype": self.headers.get("Content-Type"),
                "run_id": self.headers.get("run_id"),
                "body_sha": hashlib.sha256(body).hexdigest(),
                "body_len": len(body),
            }
            self._reply(200, json.dumps(info).encode())
        elif path == "/sleep":
            time.sleep(float(q.get("s", "1")))
            self._reply(200, b'{"slept": true}')
        elif path == "/error500":
            self._reply(500, json.dumps({"detail": "ValueError: No job started. Call start_new_job first."}).encode())
        elif path == "/text500":
            self._reply(500, b"Internal Server Error", "text/plain")
        elif path == "/auth":
            # A careless server echoing the credential back must not make gmp print it.
            detail = f"invalid token {self.headers.get('Authorization', '')}"
            self._reply(401, json.dumps({"detail": detail}).encode())
        elif path == "/big":
            self._reply(200, bytes(range(256)) * (int(q["n"]) // 256), "application/octet-stream")
        elif path == "/flaky":
            if hit == 1:
                # Read the request, then hang up without a single reply byte.
                self.close_connection = True
                return
            self._reply(200, b'{"second": true}')
        elif path == "/closing":
            self._reply(200, b'{"closing": true}', close=True)
        elif path == "/notjson":
            self._reply(200, b"<html>oops</html>", "text/html")
        elif path == "/upload":
            self._reply(200, json.dumps({
                "ctype": self.headers.get("Content-Type"),
                "len": len(body),
                "raw": body.decode("latin-1"),
            }).encode())
        else:
            self._reply(404, b'{"detail": "Not Found"}')

    do_GET = _handle
    do_POST = _handle


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, idle_timeout: float | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.idle_timeout = idle_timeout
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def idle_server() -> Iterator[_Server]:
    """Closes a keep-alive connection after 0.3 s idle, like uvicorn does after 5 s."""
    srv = _Server(idle_timeout=0.3)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_keepalive_reuses_one_socket(server: _Server) -> None:
    with HttpTransport(server.url) as t:
        ports = {t.get("/echo").json()["port"] for _ in range(20)}
        ports |= {t.post("/echo", body=b"x" * 100).json()["port"] for _ in range(5)}
    assert len(ports) == 1
    assert t.connections_opened == 1


def test_request_shapes_query_json_and_large_body(server: _Server) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB: above the single-send limit, sent with sendall
    with HttpTransport(server.url + "/", headers={"run_id": "r1"}) as t:
        r = t.post("/echo", json={"data": {"worker_ids": ["0"]}}, query={"run_id": "r1", "x": None})
        info = r.json()
        assert info["query"] == {"run_id": "r1"}
        assert info["ctype"] == "application/json"
        assert info["run_id"] == "r1"
        assert info["auth"] is None
        assert r.ok and r.status == 200 and r.elapsed_s > 0
        info = t.post("/echo", body=big, content_type="application/octet-stream").json()
        assert info["body_len"] == len(big)
        assert info["body_sha"] == hashlib.sha256(big).hexdigest()
        n = 3 * 480 * 640 * 3
        r = t.get("/big", query={"n": n})
        assert len(r.body) == n - n % 256
        assert r.body[:4] == b"\x00\x01\x02\x03"


def test_base_url_prefix_is_kept(server: _Server) -> None:
    with HttpTransport(server.url + "/prefix/") as t:
        r = t.get("/echo", raise_for_status=False)
    assert r.status == 404  # path became /prefix/echo


def test_reconnects_after_server_closed_idle_connection(idle_server: _Server) -> None:
    with HttpTransport(idle_server.url) as t:
        p1 = t.get("/echo").json()["port"]
        time.sleep(0.6)  # server hangs up at 0.3 s; our idle threshold (4 s) is not reached
        # A POST is not idempotent: it must still succeed because the dead socket is noticed
        # before sending, not after.
        p2 = t.post("/echo", body=b"step").json()["port"]
    assert p1 != p2
    assert t.connections_opened == 2
    assert idle_server.hits["/echo"] == 2


def test_reconnects_proactively_after_long_idle(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_connection, "IDLE_RECONNECT_S", 0.05)  # read by each call's prepare()
    with HttpTransport(server.url) as t:
        p1 = t.get("/echo").json()["port"]
        time.sleep(0.1)
        p2 = t.get("/echo").json()["port"]
    assert p1 != p2


def test_connection_close_header_reconnects_quietly(server: _Server) -> None:
    with HttpTransport(server.url) as t:
        t.get("/closing")
        t.post("/echo", body=b"a")
    assert t.connections_opened == 2


def test_dead_reused_connection_resends_only_idempotent(server: _Server) -> None:
    with HttpTransport(server.url) as t:
        t.get("/echo")
        r = t.request("POST", "/flaky", body=b"reset", idempotent=True)
        assert r.json() == {"second": True}
    assert server.hits["/flaky"] == 2


def test_dead_reused_connection_never_replays_step(server: _Server) -> None:
    with HttpTransport(server.url) as t:
        t.get("/echo")
        with pytest.raises(TransportError) as ei:
            t.post("/flaky", body=b"step", route_name="/step")
        err = ei.value
        assert err.sent and err.maybe_executed
        assert err.route == "/step"
        assert "/step" in str(err)
        # The transport stays usable.
        assert t.get("/echo").status == 200
    assert server.hits["/flaky"] == 1


def test_timeout_names_route_and_limit(server: _Server) -> None:
    with HttpTransport(server.url, timeout=5) as t:
        with pytest.raises(RequestTimeout) as ei:
            t.post("/sleep", query={"s": "1.0"}, body=b"", timeout=0.2, route_name="/step")
        assert str(ei.value) == "POST /step timed out after 0.2 s"
        assert ei.value.timeout == pytest.approx(0.2)
        assert ei.value.exit_code == ExitCode.TIMEOUT
        assert ei.value.maybe_executed
        # The late reply of the timed-out call must not be read as the next call's reply.
        assert t.get("/echo").json()["path"] == "/echo"


def test_an_interrupted_exchange_never_leaves_its_connection_behind(server: _Server) -> None:
    # Ctrl-C while the reply is on its way: the next request (a POST, never resent) must get
    # a connection of its own, not fail on (or read) the abandoned exchange.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with HttpTransport(server.url, timeout=5) as t:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(KeyboardInterrupt):
                t.post("/sleep", query={"s": "0.6"}, body=b"", route_name="/step")
            assert t.post("/echo", body=b"x").json()["path"] == "/echo"
            assert t.connections_opened == 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_status_error_carries_detail(server: _Server) -> None:
    with HttpTransport(server.url) as t:
        with pytest.raises(HTTPStatusError) as ei:
            t.post("/error500", json={})
        e = ei.value
        assert e.status == 500
        assert e.detail == "ValueError: No job started. Call start_new_job first."
        assert "HTTP 500" in str(e) and "No job started" in str(e)
        assert e.maybe_executed and e.exit_code == ExitCode.REMOTE_ERROR
        with pytest.raises(HTTPStatusError) as ei:
            t.get("/text500")
        assert ei.value.detail == "Internal Server Error"
        r = t.get("/error500", raise_for_status=False)
        assert r.status == 500 and r.detail().startswith("ValueError")
        with pytest.raises(HTTPStatusError):
            r.raise_for_status()


def test_auth_error_never_shows_token(server: _Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with HttpTransport(server.url, token=TOKEN) as t:
        assert t.get("/echo").json()["auth"] == f"Bearer {TOKEN}"
        with pytest.raises(AuthError) as ei:
            t.get("/auth")
        assert TOKEN not in repr(t)
    e = ei.value
    assert e.status == 401 and e.exit_code == ExitCode.AUTH
    for text in (str(e), e.detail, repr(e), e.hint or "", caplog.text):
        assert TOKEN not in text
    assert "***" in e.detail


def test_connection_refused_is_connect_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t = HttpTransport(f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(ConnectError) as ei:
        t.post("/step", body=b"x")
    assert ei.value.sent is False and ei.value.maybe_executed is False
    assert ei.value.exit_code == ExitCode.UNREACHABLE
    assert "connection refused" in str(ei.value)


def test_non_json_reply_is_decode_error(server: _Server) -> None:
    with HttpTransport(server.url) as t:
        r = t.get("/notjson")
        with pytest.raises(DecodeError, match="GET /notjson: reply is not JSON"):
            r.json()


def test_multipart_streams_file_with_progress(server: _Server, tmp_path) -> None:
    payload = bytes(range(256)) * 9000  # ~2.3 MB: several chunks
    f = tmp_path / "run.zip"
    f.write_bytes(payload)
    seen: list[int] = []
    with HttpTransport(server.url) as t:
        r = t.request_multipart(
            "/upload",
            {"submission_name": 'my "model"', "leaderboard_name": "lb"},
            {"file": ("run.zip", f, "application/zip")},
            progress=seen.append,
        )
    info = r.json()
    assert info["ctype"].startswith("multipart/form-data; boundary=gmp-")
    raw = info["raw"].encode("latin-1")
    assert payload in raw
    assert b'name="submission_name"\r\n\r\nmy "model"\r\n' in raw
    assert b'filename="run.zip"' in raw
    assert seen == sorted(seen) and seen[-1] == info["len"]
    assert len(seen) >= 3


def test_plain_http_token_warning(caplog: pytest.LogCaptureFixture) -> None:
    # The rule lives in genmanip_runtime.netpolicy (warn mode); the transport applies it.
    caplog.set_level(logging.WARNING, logger="genmanip_runtime.netpolicy")
    HttpTransport("http://127.0.0.1:9", token=TOKEN)
    assert "plain http" not in caplog.text
    HttpTransport("http://example.invalid:8087", token=TOKEN)
    HttpTransport("http://example.invalid:8087", token=TOKEN)
    assert caplog.text.count("plain http://") == 1
    assert TOKEN not in caplog.text


def test_bad_urls_are_config_errors() -> None:
    for url in ("ftp://x", "http://user:pw@host", "http://", "http://h:notaport"):
        with pytest.raises(ConfigError):
            HttpTransport(url)
    with pytest.raises(ConfigError):
        HttpTransport("http://h", timeout=0)


def test_build_base_url() -> None:
    assert build_base_url("http://a:1/") == "http://a:1"
    assert build_base_url("a:1") == "http://a:1"
    assert build_base_url(None, "127.0.0.1", 8087) == "http://127.0.0.1:8087"
    assert build_base_url(None, "::1", 8087) == "http://[::1]:8087"
    with pytest.raises(ConfigError, match="--url"):
        build_base_url(None, None, None)


def test_pickled_transport_has_no_socket_and_reconnects(server: _Server) -> None:
    t = HttpTransport(server.url, token=TOKEN)
    t.get("/echo")
    t2 = pickle.loads(pickle.dumps(t))
    assert t2.get("/echo").json()["auth"] == f"Bearer {TOKEN}"
    t.close()
    t2.close()


def test_threads_share_a_transport_safely(server: _Server) -> None:
    errors: list[BaseException] = []
    with HttpTransport(server.url) as t:
        def work(i: int) -> None:
            try:
                for _ in range(10):
                    info = t.post("/echo", body=str(i).encode()).json()
                    assert info["body_sha"] == hashlib.sha256(str(i).encode()).hexdigest()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path) -> Iterator[tuple[_Server, str]]:
    import trustme
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    srv = _Server()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv, str(ca_file)
    srv.shutdown()
    srv.server_close()


def test_tls_verifies_with_ca_file_and_refuses_without(tls_server: tuple[_Server, str]) -> None:
    srv, ca_file = tls_server
    url = f"https://127.0.0.1:{srv.server_address[1]}"
    with HttpTransport(url, ca_file=ca_file, token=TOKEN) as t:
        assert t.get("/echo").json()["auth"] == f"Bearer {TOKEN}"
        assert t.get("/echo").status == 200
        assert t.connections_opened == 1
        # A copy sent to a worker process keeps trusting the same CA (and reconnects lazily).
        with pickle.loads(pickle.dumps(t)) as copy:
            assert copy.get("/echo").status == 200
    with HttpTransport(url, timeout=3) as t, pytest.raises(ConnectError) as ei:
        t.get("/echo")
    assert "certificate" in str(ei.value)
    assert "--ca-cert" in (ei.value.hint or "")


# -- uvicorn (what the testbed and the real server run) --------------------------------------


@pytest.fixture
def uvicorn_url() -> Iterator[str]:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        body = await request.body()
        client = request.client
        return JSONResponse({"len": len(body), "port": client.port if client else None})

    async def step(request: Request) -> Response:
        body = await request.body()
        return Response(body * 2, media_type="application/octet-stream")

    app = Starlette(routes=[Route("/echo", echo, methods=["GET", "POST"]),
                            Route("/step", step, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=1, lifespan="off")
    srv = uvicorn.Server(config)
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    srv.should_exit = True
    th.join(5)


def test_uvicorn_keepalive_and_idle_close(uvicorn_url: str) -> None:
    with HttpTransport(uvicorn_url) as t:
        ports = {t.get("/echo").json()["port"] for _ in range(10)}
        assert len(ports) == 1
        r = t.post("/step", body=b"ab" * 1000)
        assert r.body == b"ab" * 2000
        time.sleep(1.6)  # uvicorn's keep-alive timeout here is 1 s
        r = t.post("/step", body=b"z")
        assert r.body == b"zz"
    assert t.connections_opened == 2


# -- hostile replies: body bound, deadline, every status class (tests/reliability for the CLI) --


class _Scripted:
    """A raw socket server: every connection reads one request, then runs ``script(conn)``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.script: Any = None
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while True:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        data += chunk
                    head, _, data = data.partition(b"\r\n\r\n")
                    n = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            n = int(line.split(b":", 1)[1])
                    while len(data) < n:
                        data += conn.recv(65536)
                    data = data[n:]
                    self.requests += 1
                    if not self.script(conn):
                        return
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)


@pytest.fixture
def scripted() -> Iterator[_Scripted]:
    srv = _Scripted()
    yield srv
    srv.close()


def _send(data: bytes, keep: bool = False) -> Any:
    def script(conn: socket.socket) -> bool:
        conn.sendall(data)
        return keep

    return script


def _drip(data: bytes, every: float, head: int = 0) -> Any:
    def script(conn: socket.socket) -> bool:
        conn.sendall(data[:head])
        for i in range(head, len(data)):
            time.sleep(every)
            try:
                conn.sendall(data[i : i + 1])
            except OSError:
                return False
        return False

    return script


def _endless(head: bytes, piece: bytes, every: float = 0.0) -> Any:
    def script(conn: socket.socket) -> bool:
        t0 = time.monotonic()
        try:
            conn.sendall(head)
            while time.monotonic() - t0 < 10:
                conn.sendall(piece)
                if every:
                    time.sleep(every)
        except OSError:
            pass
        return False

    return script


_OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"ok": true}'


def test_a_declared_2_gib_body_is_refused_before_anything_is_allocated(scripted: _Scripted) -> None:
    import tracemalloc

    scripted.script = _send(b"HTTP/1.1 200 OK\r\nContent-Length: 2147483648\r\n\r\n" + b"x" * 1000, keep=True)
    with HttpTransport(scripted.url, timeout=5) as t:
        tracemalloc.start()
        try:
            with pytest.raises(ResponseTooLarge) as ei:
                t.post("/step", body=b"x", route_name="/step")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    e = ei.value
    assert peak < 8 * 1024 * 1024, peak  # (before: a 2 GiB read ending in MemoryError, exit 70)
    assert e.limit == transport_mod.DEFAULT_MAX_REPLY_BYTES and e.declared == 2**31
    assert e.route == "/step" and e.status == 200 and e.sent and e.maybe_executed
    assert e.exit_code == ExitCode.REMOTE_ERROR
    assert "/step" in str(e) and "2,147,483,648" in str(e) and "536,870,912" in str(e)


def test_default_reply_limit_covers_the_largest_legitimate_reply() -> None:
    # lift2 R5a raw (2 x 640x480 + 2 x 1280x720 RGB) for 32 workers, base64-inflated
    largest = (2 * 480 * 640 * 3 + 2 * 720 * 1280 * 3) * 32 * 4 // 3
    assert largest < transport_mod.DEFAULT_MAX_REPLY_BYTES < 2 * largest


@pytest.mark.parametrize("kind", ["chunked", "until close"])
def test_an_endless_body_stops_at_the_limit(scripted: _Scripted, kind: str) -> None:
    if kind == "chunked":
        scripted.script = _endless(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                   b"10000\r\n" + b"a" * 0x10000 + b"\r\n")
    else:
        scripted.script = _endless(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"a" * 65536)
    with HttpTransport(scripted.url, timeout=10) as t:
        t0 = time.monotonic()
        with pytest.raises(ResponseTooLarge) as ei:
            t.get("/status", max_reply_bytes=2 * 1024 * 1024)
        assert time.monotonic() - t0 < 5
        assert ei.value.declared is None and ei.value.limit == 2 * 1024 * 1024
        assert t._connection.http is None  # the rest of the body is never read: the connection is dropped
        scripted.script = _send(_OK)
        assert t.get("/status").json() == {"ok": True}


def test_a_chunked_body_within_the_limit_is_read_whole(scripted: _Scripted) -> None:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b"{\"a\": ", b"1", b"}")) + b"0\r\n\r\n"
    scripted.script = _send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, keep=True)
    with HttpTransport(scripted.url, timeout=5) as t:
        assert t.get("/x").json() == {"a": 1}
        assert t.get("/x", max_reply_bytes=8).body == b'{"a": 1}'
        with pytest.raises(ResponseTooLarge):
            t.get("/x", max_reply_bytes=7)


@pytest.mark.parametrize("size", [b"-1", b"zz", b"FFFFFFFFFFFFFFFF"])
def test_bad_chunk_sizes_are_transport_errors(scripted: _Scripted, size: bytes) -> None:
    # "-1" parses as hex: http.client would then read until the peer closes, without a bound
    scripted.script = _send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n" + b"x" * 100)
    with HttpTransport(scripted.url, timeout=2) as t:
        with pytest.raises(TransportError) as ei:
            t.get("/x")
    assert not isinstance(ei.value, RequestTimeout)


@pytest.mark.parametrize("where", ["status line", "headers", "body"])
def test_a_trickled_reply_is_cut_at_the_deadline(scripted: _Scripted, where: str) -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"p" * 200 + b"\r\nContent-Length: 300\r\n\r\n" + b" " * 300
    head = {"status line": 0, "headers": 20, "body": reply.index(b"\r\n\r\n") + 4}[where]
    scripted.script = _drip(reply, 0.02, head)  # every byte well within any per-recv timeout
    with HttpTransport(scripted.url, timeout=30) as t:
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout) as ei:
            t.post("/step", body=b"x", timeout=0.5, route_name="/step")
        took = time.monotonic() - t0
    assert 0.45 <= took < 1.0, took  # (before: ~11 s, one byte every 20 ms, each "in time")
    assert str(ei.value) == "POST /step timed out after 0.5 s"
    assert ei.value.timeout == 0.5 and ei.value.maybe_executed


def test_endless_interim_replies_are_cut_at_the_deadline(scripted: _Scripted) -> None:
    scripted.script = _endless(b"", b"HTTP/1.1 100 Continue\r\n\r\n", 0.001)
    with HttpTransport(scripted.url) as t:
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout):
            t.get("/protocol", timeout=0.4)
        assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("interim", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 102 Processing\r\n\r\n",
                                     b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"])
def test_interim_replies_before_the_final_one_are_skipped(scripted: _Scripted, interim: bytes) -> None:
    scripted.script = _send(interim + _OK, keep=True)
    with HttpTransport(scripted.url, timeout=5) as t:
        assert t.get("/x").json() == {"ok": True}
        assert t.get("/x").json() == {"ok": True}
        assert t.connections_opened == 1


def test_switching_protocols_is_an_error_and_drops_the_connection(scripted: _Scripted) -> None:
    scripted.script = _send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello", keep=True)
    with HttpTransport(scripted.url, timeout=5, service="a GenManip eval server") as t:
        with pytest.raises(HTTPStatusError) as ei:
            t.get("/protocol")
        assert ei.value.status == 101 and ei.value.maybe_executed
        assert "interim reply" in str(ei.value) and "GenManip eval server" in str(ei.value)
        assert t._connection.http is None
        r = t.get("/protocol", raise_for_status=False)  # inspected by the caller, never reused
        assert r.status == 101 and t._connection.http is None


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed(scripted: _Scripted, code: int) -> None:
    loc = "http://evil.example.invalid/x?token=" + TOKEN
    scripted.script = _send(f"HTTP/1.1 {code} Moved\r\nLocation: {loc}\r\nContent-Length: 0\r\n\r\n".encode(), keep=True)
    with HttpTransport(scripted.url, token=TOKEN, timeout=5) as t:
        with pytest.raises(HTTPStatusError) as ei:
            t.post("/step", body=b"x", route_name="/step")
        r = t.get("/x", raise_for_status=False)
    e = ei.value
    assert e.status == code and not e.maybe_executed and e.exit_code == ExitCode.REMOTE_ERROR
    assert "redirect to 'http://evil.example.invalid/x?token=***'" in str(e)
    assert "not followed" in str(e) and e.hint and "--url" in e.hint
    assert TOKEN not in str(e) and TOKEN not in e.detail
    assert r.status == code  # raise_for_status=False: the caller decides
    assert scripted.requests == 2  # nobody went anywhere else


def test_expect_judges_a_2xx_reply(scripted: _Scripted) -> None:
    cases = [
        (b"HTTP/1.1 204 No Content\r\n\r\n", "application/json", "an empty body"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n", "application/json", "an empty body"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 12\r\n\r\n<html>login!", "application/json", "an HTML page (12 bytes)"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", "application/x-genmanip-msgpack", "application/json (2 bytes"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab", "application/x-genmanip-msgpack", "no Content-Type"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nOK", "application/octet-stream", "text/plain"),
    ]
    with HttpTransport(scripted.url, timeout=5, service="a GenManip eval server") as t:
        for reply, expect, said in cases:
            scripted.script = _send(reply, keep=True)
            with pytest.raises(UnexpectedReply) as ei:
                t.post("/step", body=b"x", route_name="/step", expect=expect)
            e = ei.value
            assert said in str(e) and f"expected {expect}" in str(e), str(e)
            assert "this does not look like a GenManip eval server" in str(e)
            assert e.expected == expect and e.maybe_executed and e.exit_code == ExitCode.REMOTE_ERROR
        # the generic binary type takes any binary label, or none; JSON takes +json
        for reply, expect in [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\x80\x05", "application/octet-stream"),
            (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-pickle\r\nContent-Length: 2\r\n\r\n\x80\x05", "application/octet-stream"),
            (b"HTTP/1.1 200 OK\r\nContent-Type: application/problem+json\r\nContent-Length: 2\r\n\r\n{}", "application/json"),
            (b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 2\r\n\r\n{}", "application/json"),
        ]:
            scripted.script = _send(reply, keep=True)
            assert t.get("/x", expect=expect).status == 200


def test_deep_json_is_a_decode_error(scripted: _Scripted) -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    scripted.script = _send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body, keep=True)
    with HttpTransport(scripted.url, timeout=5) as t:
        with pytest.raises(DecodeError, match="nested too deeply"):
            t.get("/status").json()
    with pytest.raises(ValueError, match="nested too deeply"):
        transport_mod.reply_json(body)


def test_an_upload_to_a_server_that_never_reads_is_cut_at_the_deadline(scripted: _Scripted, tmp_path) -> None:
    big = tmp_path / "bundle.zip"
    big.write_bytes(os.urandom(1024) * 32 * 1024)  # 32 MiB: more than the socket buffers hold

    def never_read(conn: socket.socket) -> bool:
        time.sleep(3)
        return False

    scripted.script = never_read
    # (the request line and headers are read by _Scripted; the body is never read)
    with HttpTransport(scripted.url, timeout=30) as t:
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout) as ei:
            t.request_multipart("/api/upload", {}, {"file": ("b.zip", big, "application/zip")}, timeout=0.5)
        assert time.monotonic() - t0 < 1.5
    assert "of 33" in str(ei.value)  # names how much was sent


def test_bad_timeouts_and_limits_are_config_errors() -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError):
            HttpTransport("http://127.0.0.1:9", timeout=bad)
        with pytest.raises(ConfigError):
            HttpTransport("http://127.0.0.1:9").get("/x", timeout=bad)
    with pytest.raises(ConfigError):
        HttpTransport("http://127.0.0.1:9", max_reply_bytes=-1)


def test_one_exchange_path_tells_a_request_and_an_upload_apart(scripted: _Scripted, tmp_path) -> None:
    # Requests and uploads share one exchange path; what a failure says still depends on which.
    f = tmp_path / "run.zip"
    f.write_bytes(b"z" * 5000)
    scripted.script = _send(b"")  # reads the request, closes without a reply byte
    with HttpTransport(scripted.url, timeout=5) as t:
        with pytest.raises(TransportError) as ei:
            t.post("/step", body=b"x", route_name="/step")
        assert str(ei.value) == (f"POST /step: connection to {t.base_url} lost before a reply "
                                 "(server closed the connection without replying)")
        assert ei.value.sent and ei.value.maybe_executed
        assert ei.value.hint == "the server may have executed the request; it was not resent"
        with pytest.raises(TransportError) as ei:
            t.request_multipart("/api/upload", {"a": "b"}, {"file": ("run.zip", f, "application/zip")})
        total = ei.value.message.split(" of ")[1].split(" ")[0]
        assert str(ei.value) == (f"POST /api/upload: upload to {t.base_url} failed after {total} of "
                                 f"{total} bytes (server closed the connection without replying)")
        assert ei.value.sent and ei.value.maybe_executed and ei.value.hint is None
        assert not isinstance(ei.value, RequestTimeout) and int(total) > 5000
    assert scripted.requests == 2  # neither was resent


def test_names_importable_from_transport_stay_importable() -> None:
    # Other packages import these from genmanip_runtime.transport; they live in private rooms now.
    from genmanip_runtime import _connection, _reply
    from genmanip_runtime.transport import (
        DEFAULT_MAX_REPLY_BYTES,
        IDLE_RECONNECT_S,
        Response,
        build_base_url,
        reply_json,
    )

    assert Response is _reply.Response and reply_json is _reply.reply_json
    assert IDLE_RECONNECT_S == _connection.IDLE_RECONNECT_S == 4.0
    assert DEFAULT_MAX_REPLY_BYTES == 512 * 1024 * 1024 and callable(build_base_url)
    assert transport_mod.__all__ == ["DEFAULT_MAX_REPLY_BYTES", "HttpTransport", "Response",
                                     "build_base_url", "reply_json"]
