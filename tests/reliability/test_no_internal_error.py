"""Exit 70 must be unreachable from input: every client command against a hostile HTTP server.

Exit 70 means "a bug in gmp". Whatever a server sends -- any status family, a redirect, a 1xx, a
204, a truncated or endless body, a 2 GiB ``Content-Length``, a reply trickled a byte at a time,
a reset, an HTML page, garbage JSON/msgpack/pickle, wrong types in every field -- must end in a
*named* exit code, one ``gmp: error:`` line and no traceback, within the call's deadline plus a
margin.

The server (:class:`HostileServer`, raw sockets on 127.0.0.1, every connection bounded in time)
answers each route well -- replaying a real testbed session recorded once per module, or canned
replies of the online service and the leaderboard -- except the route under attack, which gets the
hostile script. Every command runs in-process through ``genmanip.cli.main.main(argv)`` with short
limits (``--timeout`` where the command has it; the eval client's per-call limits and retry
deadlines are shortened, since ``gmp eval`` has no flag for them); a few run as real processes.

The battery: :data:`TRANSPORT_ATTACKS` (wire-level replies, any route) x every (command, route)
pair of :data:`TARGETS`, plus field-by-field wrong types in the JSON and msgpack replies of
``/status``, ``/protocol``, ``/reset_result`` and ``/step`` and in the online service's and the
leaderboard's replies.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from genmanip.cli.main import main

pytestmark = pytest.mark.slow

# -- limits ------------------------------------------------------------------------------------

#: Per-call limit of every request in the battery (seconds).
CALL_S = 0.2
#: Retry/poll deadlines of the eval client in the battery (seconds).
RETRY_S = 0.4
#: A command must finish within this: a handful of calls of CALL_S and retry loops of RETRY_S
#: (the slowest, a /reset under attack, takes ~1 s), with a wide margin for a loaded machine.
BOUND_S = 6.0
#: The reply-size limit in-process (the default, 512 MiB, is tested once with a declared length:
#: streaming 512 MiB per endless-body case would only load the machine).
MAX_REPLY = 32 * 1024 * 1024
#: No connection (and so no hostile script) outlives this, whatever the client does.
CONNECTION_LIFETIME_S = 6.0

TOKEN = "battery-token-3f9a1c7e5b2d4068"


# -- the server --------------------------------------------------------------------------------


@dataclass
class Request:
    """One parsed request."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def route(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class Good:
    """A well-formed reply: status, headers (Content-Length is added) and body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def content_type(self) -> str:
        return dict((k.lower(), v) for k, v in self.headers).get("content-type", "")


#: ``script(sock, request, good) -> keep_alive``: writes the hostile reply; ``good`` is what a
#: well-behaved server would have sent (content attacks mutate it).
Script = Callable[[socket.socket, Request, Good], bool]

_REASONS = {
    100: "Continue", 101: "Switching Protocols", 102: "Processing", 103: "Early Hints",
    200: "OK", 204: "No Content", 205: "Reset Content", 206: "Partial Content",
    300: "Multiple Choices", 301: "Moved Permanently", 302: "Found", 303: "See Other",
    304: "Not Modified", 307: "Temporary Redirect", 308: "Permanent Redirect",
}


def http_reply(status: int, body: bytes = b"", headers: Any = (), *, reason: str | None = None,
               length: bool = True) -> bytes:
    """The bytes of an HTTP/1.1 reply (with ``Content-Length`` unless ``length`` is False)."""
    phrase = reason if reason is not None else _REASONS.get(status, "Whatever")
    lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers)]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class HostileServer:
    """Answers with ``good(request)`` unless ``attack`` (route suffix, script) matches."""

    def __init__(self, good: Callable[[HostileServer, Request], Good]) -> None:
        self.good = good
        self.attack: tuple[str, Script] | None = None
        self.counts: dict[str, int] = {}
        self.requests: list[str] = []
        self.flavour = "msgpack"
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.1)
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refuse_all(self) -> None:
        """From now until the next case, reset every connection (the watchdog's way out)."""
        with self.lock:
            self.attack = ("", rst())
        self.drop_connections()

    def start_case(self, attack: tuple[str, Script] | None, flavour: str = "msgpack") -> None:
        self.drop_connections()
        with self.lock:
            self.attack = attack
            self.counts = {}
            self.requests = []
            self.flavour = flavour

    def next_index(self, key: str) -> int:
        with self.lock:
            i = self.counts.get(key, 0)
            self.counts[key] = i + 1
            return i

    def alive(self, started: float) -> bool:
        return not self._stop.is_set() and time.monotonic() - started < CONNECTION_LIFETIME_S

    def drop_connections(self) -> None:
        with self.lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._listener.close()
        self.drop_connections()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self._conns.add(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        started = time.monotonic()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = sock.makefile("rb")
            while self.alive(started):
                sock.settimeout(max(0.05, CONNECTION_LIFETIME_S - (time.monotonic() - started)))
                req = _read_request(reader)
                if req is None:
                    return
                with self.lock:
                    self.requests.append(f"{req.method} {req.route}")
                    attack = self.attack
                good = self.good(self, req)
                if attack is None or not req.route.endswith(attack[0]):
                    sock.sendall(http_reply(good.status, good.body, good.headers))
                    continue
                if not attack[1](sock, req, good):
                    return
        except (OSError, ValueError):
            return
        finally:
            with self.lock:
                self._conns.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()


def _read_request(reader: Any) -> Request | None:
    line = reader.readline(65537)
    if not line:
        return None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) < 2:
        return None
    headers: dict[str, str] = {}
    for _ in range(200):
        h = reader.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length") or 0)
    body = reader.read(n) if n else b""
    return Request(parts[0], parts[1], headers, body)


# -- hostile scripts ---------------------------------------------------------------------------


def _hold(sock: socket.socket, started: float | None = None) -> bool:
    """Say nothing more; wait until the client hangs up (or the connection's lifetime ends)."""
    started = time.monotonic() if started is None else started
    sock.settimeout(0.1)
    while time.monotonic() - started < CONNECTION_LIFETIME_S:
        try:
            if not sock.recv(65536):
                return False
        except TimeoutError:
            continue
        except OSError:
            return False
    return False


def raw(data: bytes | Callable[[Good], bytes], then: str = "close") -> Script:
    """Send ``data`` (or ``data(good)``), then ``close``, ``hold`` or ``keep`` (keep-alive)."""

    def script(sock: socket.socket, req: Request, good: Good) -> bool:
        sock.sendall(data(good) if callable(data) else data)
        if then == "hold":
            return _hold(sock)
        return then == "keep"

    return script


def status(code: int, body: bytes = b"", ctype: str | None = "application/json",
           extra: tuple[tuple[str, str], ...] = (), then: str = "keep") -> Script:
    hdrs = ((("Content-Type", ctype),) if ctype else ()) + extra
    return raw(http_reply(code, body, hdrs), then)


def rst(prefix: bytes | Callable[[Good], bytes] = b"") -> Script:
    """Send ``prefix``, then close with RST (the client sees ECONNRESET)."""

    def script(sock: socket.socket, req: Request, good: Good) -> bool:
        data = prefix(good) if callable(prefix) else prefix
        if data:
            sock.sendall(data)
            time.sleep(0.02)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    return script


def trickle(data: Callable[[Good], bytes], every: float, *, body: bool = False) -> Script:
    """One byte per ``every`` seconds; with ``body``, the status line and headers at once first."""

    def script(sock: socket.socket, req: Request, good: Good) -> bool:
        started = time.monotonic()
        payload = data(good)
        head = payload.index(b"\r\n\r\n") + 4 if body else 0
        sock.sendall(payload[:head])
        for i in range(head, len(payload)):
            if time.monotonic() - started > CONNECTION_LIFETIME_S:
                return False
            time.sleep(every)
            try:
                sock.sendall(payload[i : i + 1])
            except OSError:
                return False
        return False

    return script


def forever(head: bytes, piece: bytes, every: float = 0.0) -> Script:
    """``head``, then ``piece`` again and again until the client hangs up."""

    def script(sock: socket.socket, req: Request, good: Good) -> bool:
        started = time.monotonic()
        try:
            sock.sendall(head)
            while time.monotonic() - started < CONNECTION_LIFETIME_S:
                sock.sendall(piece)
                if every:
                    time.sleep(every)
        except OSError:
            pass
        return False

    return script


def good_then(prefix: bytes) -> Script:
    """``prefix`` (e.g. an interim reply), then the good reply."""
    return raw(lambda g: prefix + http_reply(g.status, g.body, g.headers), "keep")


def with_body(fn: Callable[[Good], bytes], ctype: str | None = None, then: str = "keep") -> Script:
    """The good reply's status and content type with another body."""

    def build(g: Good) -> bytes:
        ct = g.content_type if ctype is None else ctype
        return http_reply(g.status, fn(g), (("Content-Type", ct),) if ct else ())

    return raw(build, then)


def chunked(g: Good, chunks: list[bytes] | None = None, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (chunks if chunks is not None else [g.body]))
    head = http_reply(g.status, b"", [("Content-Type", g.content_type), ("Transfer-Encoding", "chunked")],
                      length=False)
    return head + body + (b"0\r\n\r\n" if end else b"")


_HTML = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>...</form></body></html>"
_NGINX = b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>"
_EVIL = "http://evil.example.invalid/steal"
_DEEP_JSON = b"[" * 200_000 + b"]" * 200_000
_HUGE_INT_JSON = b'{"data": ' + b"9" * 4000 + b"}"
_TOO_MANY_DIGITS_JSON = b'{"data": ' + b"9" * 5000 + b"}"


def _cl(value: str, body: bytes = b"x" * 100, ctype: str = "application/json") -> Script:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {value}\r\n\r\n".encode()
    return raw(head + body, "hold")


#: Wire-level replies: any route. (name, script)
TRANSPORT_ATTACKS: list[tuple[str, Script]] = [
    # 1xx
    ("100 then close", raw(b"HTTP/1.1 100 Continue\r\n\r\n")),
    ("100 forever", forever(b"", b"HTTP/1.1 100 Continue\r\n\r\n", 0.005)),
    ("101 switching protocols", raw(http_reply(101, headers=[("Upgrade", "websocket"), ("Connection", "Upgrade")], length=False), "hold")),
    ("102 then good", good_then(b"HTTP/1.1 102 Processing\r\n\r\n")),
    ("103 early hints then good", good_then(b"HTTP/1.1 103 Early Hints\r\nLink: </x.css>; rel=preload\r\n\r\n")),
    ("199 then close", raw(b"HTTP/1.1 199 Odd\r\nX: y\r\n\r\n")),
    # 2xx that are not the reply
    ("204 no content", raw(http_reply(204, length=False), "keep")),
    ("205 reset content", raw(http_reply(205), "keep")),
    ("200 empty body", with_body(lambda g: b"")),
    ("200 no content type", with_body(lambda g: g.body, ctype="")),
    ("200 html page", status(200, _HTML, "text/html; charset=utf-8")),
    ("200 text ok", status(200, b"OK", "text/plain")),
    ("200 json detail", status(200, b'{"detail": "ok"}')),
    ("200 msgpack garbage", status(200, b"\xc1\xc1\xc1garbage", "application/x-genmanip-msgpack")),
    ("200 octet garbage", status(200, b"\x80\x05garbage", "application/octet-stream")),
    ("206 partial content", raw(lambda g: http_reply(206, g.body[: len(g.body) // 2], [("Content-Type", g.content_type), ("Content-Range", "bytes 0-9/99")]), "keep")),
    # 3xx: never followed (the request carries the token)
    ("300 multiple choices", status(300, b"", extra=(("Location", _EVIL),))),
    ("301 to another host", status(301, b"", extra=(("Location", _EVIL),))),
    ("302 to another host", status(302, _HTML, "text/html", (("Location", _EVIL),))),
    ("303 see other", status(303, b"", extra=(("Location", "/elsewhere"),))),
    ("304 not modified", raw(http_reply(304, length=False), "keep")),
    ("307 temporary redirect", status(307, b"", extra=(("Location", _EVIL + "?token=" + TOKEN),))),
    ("308 permanent redirect", status(308, b"", extra=(("Location", "https://127.0.0.1:1/x"),))),
    ("302 without location", status(302)),
    # 4xx / 5xx / odd codes
    ("400 json detail", status(400, b'{"detail": "Invalid pickle in request body: ..."}')),
    ("401 with token echo", status(401, json.dumps({"detail": f"bad token Bearer {TOKEN}"}).encode())),
    ("403 html", status(403, _HTML, "text/html")),
    ("404 html", status(404, _HTML, "text/html")),
    ("405 method not allowed", status(405, b'{"detail": "Method Not Allowed"}')),
    ("413 too large", status(413, b"")),
    ("418 teapot", status(418, b"short and stout", "text/plain")),
    ("429 retry after", status(429, b"slow down", "text/plain", (("Retry-After", "99999999999"),))),
    ("500 text", status(500, b"Internal Server Error", "text/plain")),
    ("502 nginx", status(502, _NGINX, "text/html")),
    ("503 json", status(503, b'{"detail": "restarting"}')),
    ("504 gateway timeout", status(504, b'{"detail": "Step timed out after 600s"}')),
    ("599 odd", status(599, b"?", "text/plain")),
    ("999 odd", status(999, b"?", "text/plain")),
    # broken status lines and headers
    ("garbage status line", raw(b"HELLO WORLD\r\n\r\n")),
    ("HTTP/2 status line", raw(b"HTTP/2 200\r\ncontent-length: 2\r\n\r\n{}")),
    ("non-numeric status", raw(b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}")),
    ("status below 100", raw(b"HTTP/1.1 99 Low\r\nContent-Length: 2\r\n\r\n{}")),
    ("ssh banner", raw(b"SSH-2.0-OpenSSH_9.6\r\n")),
    ("http/0.9 body", raw(_HTML)),
    ("nothing then close", raw(b"")),
    ("reset before reply", rst()),
    ("reset mid-body", rst(lambda g: http_reply(200, b"x" * 10, [("Content-Type", g.content_type)])[:-5])),
    ("70 KB header line", raw(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")),
    ("150 headers", raw(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n")),
    ("binary header bytes", raw(lambda g: b"HTTP/1.1 200 \xff\xfe\x00OK\r\nContent-Type: \xff\x00\xfe\r\nContent-Length: 2\r\n\r\n{}", "keep")),
    # lengths and bodies
    ("declares 2 GiB", _cl("2147483648")),
    ("declares 10**30", _cl("1" + "0" * 30)),
    ("negative length", _cl("-5")),
    ("non-numeric length", _cl("lots")),
    ("two lengths", raw(lambda g: b"HTTP/1.1 200 OK\r\nContent-Type: " + g.content_type.encode() + b"\r\nContent-Length: 5\r\nContent-Length: %d\r\n\r\n" % len(g.body) + g.body, "keep")),
    ("truncated body then close", raw(lambda g: http_reply(g.status, g.body, g.headers)[: -max(1, len(g.body) // 2)])),
    ("body longer than length", raw(lambda g: http_reply(g.status, g.body, g.headers) + b"HTTP/1.1 500 junk\r\n\r\n" * 3, "keep")),
    ("half body", with_body(lambda g: g.body[: len(g.body) // 2])),
    ("body plus junk", with_body(lambda g: g.body + b"\x00junk" * 100)),
    ("random bytes", with_body(lambda g: bytes(range(256)) * 40)),
    ("gzip claimed", raw(lambda g: http_reply(g.status, b"\x1f\x8b\x08garbage", [*g.headers, ("Content-Encoding", "gzip")]), "keep")),
    ("read until close, good body", raw(lambda g: http_reply(g.status, g.body, [*g.headers, ("Connection", "close")], length=False) + g.body)),
    ("chunked good body", raw(chunked, "keep")),
    ("chunked endless", forever(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", b"10000\r\n" + b"[" * 0x10000 + b"\r\n")),
    ("chunked endless slow", forever(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n", 0.02)),
    ("chunked bad size", raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")),
    ("chunked negative size", raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n" + b"x" * 1000, "hold")),
    ("chunked huge size", raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n" + b"x" * 1000)),
    ("chunked no end", raw(lambda g: chunked(g, end=False))),
    ("chunked trailer forever", forever(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", b"X-Trailer: y\r\n", 0.001)),
    # time: trickles and stalls, cut at the deadline
    ("trickled headers", trickle(lambda g: http_reply(g.status, g.body, g.headers), 0.05)),
    ("trickled body", trickle(lambda g: http_reply(g.status, g.body, g.headers), 0.05, body=True)),
    ("stall after status line", raw(b"HTTP/1.1 200 OK\r\n", "hold")),
    ("stall before reply", raw(b"", "hold")),
    # bodies a JSON reader chokes on
    ("deep json", status(200, _DEEP_JSON)),
    ("huge int json", status(200, _HUGE_INT_JSON)),
    ("too many digits json", status(200, _TOO_MANY_DIGITS_JSON)),
    ("nan json", status(200, b'{"data": NaN, "x": Infinity}')),
]


# -- good replies ------------------------------------------------------------------------------

ONLINE = "/api/v1/benchmark/onlineEvaluation"


def _json_good(obj: Any) -> Good:
    return Good(200, [("Content-Type", "application/json")], json.dumps(obj).encode())


def _canned(srv: HostileServer, req: Request) -> Good | None:
    route = req.route
    if route == f"{ONLINE}/createTask":
        return _json_good({"code": 0, "msg": "success", "data": {"task_id": "task-1"}})
    if route == f"{ONLINE}/ready":
        return _json_good({"code": 0, "msg": "success",
                           "data": {"ready": True, "endpoint": f"{srv.url}/online/task-1"}})
    if route.endswith("/stop"):
        return _json_good({"code": 0, "msg": "success", "data": {}})
    if route == "/api/upload":
        return _json_good({"status": "success", "submission_id": "sub-1"})
    if route.startswith("/upload_status/"):
        return _json_good({"status": "processing", "submission_id": "sub-1"})
    if route == "/start_new_job":
        return _json_good({"data": {"success": True}})
    return None


@dataclass
class Recording:
    """Replies of a real testbed session, per flavour and ``"METHOD /route"``, in order."""

    replies: dict[str, dict[str, list[Good]]] = field(default_factory=dict)


#: Routes whose last recorded reply may be repeated (queries and idempotent control calls); any
#: other route answers a request beyond the recording with a 400, so a client driven past the
#: recorded session stops instead of stepping the replayed episode forever.
_REPEATABLE = ("GET /status", "GET /protocol", "GET /docs", "POST /kill")


def _replay(rec: Recording) -> Callable[[HostileServer, Request], Good]:
    def good(srv: HostileServer, req: Request) -> Good:
        canned = _canned(srv, req)
        if canned is not None:
            return canned
        key = f"{req.method} {req.route}"
        seq = rec.replies.get(srv.flavour, {}).get(key)
        if not seq:
            return Good(404, [("Content-Type", "application/json")], b'{"detail":"Not Found"}')
        i = srv.next_index(key)
        if i >= len(seq) and key not in _REPEATABLE:
            return Good(400, [("Content-Type", "application/json")], b'{"detail":"replay exhausted"}')
        return seq[min(i, len(seq) - 1)]

    return good


def _pending_only(g: Good, flavour: str) -> bool:
    """A reply in which every worker is still resetting (dropped from the replay)."""
    from genmanip_protocol.codec import get_codec

    if g.status != 200:
        return False
    try:
        tree = get_codec("legacy" if flavour == "legacy" else "msgpack").decode(g.body)
    except Exception:
        return False
    return isinstance(tree, dict) and bool(tree) and all(
        isinstance(e, dict) and e.get("reset_pending") for e in tree.values())


_CHUNK_FLAGS = ("--chunk-size", "2", "--step-chunk")


def _eval_argv(url: str, flavour: str, *extra: str) -> list[str]:
    codec = ["--codec", "legacy"] if flavour == "legacy" else []
    return ["eval", "--url", url, "--max-episodes", "1", "--no-record", "--max-recoveries", "0",
            "--frames", "jpeg", *codec, *extra]


def _record(tmp: Path) -> Recording:
    """Record one eval session per flavour through a forwarding server in front of a testbed."""
    import http.client

    from genmanip_testbed import serve_testbed

    rec = Recording()
    with serve_testbed(tasks="testbed/all", run_id="battery", num_steps=3,
                       results_root=tmp / "srv") as tb:
        up = tb.url.rsplit(":", 1)

        def forward(srv: HostileServer, req: Request) -> Good:
            conn = http.client.HTTPConnection(up[0].split("//")[1], int(up[1]), timeout=30)
            hdrs = {k: v for k, v in req.headers.items() if k not in ("host", "connection", "content-length")}
            conn.request(req.method, req.target, body=req.body or None, headers=hdrs)
            r = conn.getresponse()
            data = r.read()
            conn.close()
            keep = [(k, v) for k, v in r.getheaders() if k.lower() == "content-type"]
            g = Good(r.status, keep, data)
            rec.replies.setdefault(srv.flavour, {}).setdefault(f"{req.method} {req.route}", []).append(g)
            return g

        srv = HostileServer(forward)
        try:
            for flavour, extra in (("msgpack", ()), ("legacy", ()), ("chunk", _CHUNK_FLAGS)):
                srv.start_case(None, flavour)
                with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
                    rc = main(_eval_argv(srv.url, flavour, *extra))
                assert rc == 0, err.getvalue()
        finally:
            srv.close()
    # Polls that only said "still resetting" make a replay slower, not different: drop them.
    for flavour, routes in rec.replies.items():
        seq = routes.get("POST /reset_result", [])
        routes["POST /reset_result"] = [g for g in seq if not _pending_only(g, flavour)] or seq
    return rec


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return _record(tmp_path_factory.mktemp("recording"))


@pytest.fixture(scope="module")
def server(recording: Recording) -> Iterator[HostileServer]:
    srv = HostileServer(_replay(recording))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete server-layout run for ``gmp leaderboard submit``."""
    from genmanip_results.testing import make_server_run

    root = tmp_path_factory.mktemp("project")
    make_server_run(root, run_id="lbrun", videos=False)
    return root


# -- running a command -------------------------------------------------------------------------


@dataclass
class Outcome:
    rc: int
    stderr: str
    stdout: str
    elapsed: float
    requests: list[str]


class _CappedBackoff:
    """The eval client's Backoff with every deadline cut to :data:`RETRY_S` (its retry loops wait
    up to 60 s for a flaky server by design; the battery only needs them to end)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from genmanip_runtime.retry import Backoff

        if kwargs.get("deadline") is not None:
            kwargs["deadline"] = min(float(kwargs["deadline"]), RETRY_S)
        kwargs["initial"] = min(float(kwargs.get("initial", 0.2)), 0.05)
        self._b = Backoff(*args, **kwargs)

    def __iter__(self) -> Iterator[float]:
        return iter(self._b)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._b, name)


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Short limits for every client, an isolated environment, a small reply limit."""
    fast_limits(monkeypatch, tmp_path)


def fast_limits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What :func:`fast` does (also for running one case by hand)."""
    import genmanip_eval.client as eval_client
    import genmanip_leaderboard.client as lb_client
    import genmanip_runtime.transport as transport
    from genmanip_runtime.testing import isolate_environment

    isolate_environment(monkeypatch, tmp_path)
    monkeypatch.setattr(eval_client, "DEFAULT_TIMEOUTS",
                        {k: (RETRY_S * 2 if k == "reset_deadline" else CALL_S) for k in eval_client.DEFAULT_TIMEOUTS})
    monkeypatch.setattr(eval_client, "Backoff", _CappedBackoff)
    monkeypatch.setattr(lb_client, "upload_timeout", lambda size: CALL_S)
    kw = dict(lb_client.LeaderboardClient.__init__.__kwdefaults__ or {})
    kw["timeout"] = CALL_S
    monkeypatch.setattr(lb_client.LeaderboardClient.__init__, "__kwdefaults__", kw)
    monkeypatch.setattr(transport, "DEFAULT_MAX_REPLY_BYTES", MAX_REPLY, raising=False)
    init_kw = dict(transport.HttpTransport.__init__.__kwdefaults__ or {})
    init_kw["max_reply_bytes"] = MAX_REPLY
    monkeypatch.setattr(transport.HttpTransport.__init__, "__kwdefaults__", init_kw)
    monkeypatch.setenv("GMP_ONLINE_TOKEN", TOKEN)
    monkeypatch.setenv("USER_TOKEN", TOKEN)
    monkeypatch.setenv("GMP_TOKEN", TOKEN)


def run_inprocess(srv: HostileServer, argv: list[str]) -> Outcome:
    err, out = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    # A watchdog, so that a command that would never end fails this case instead of hanging the
    # suite: past twice the bound the server resets every connection (check() reports the time).
    watchdog = threading.Timer(2 * BOUND_S, srv.refuse_all)
    watchdog.start()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)
    finally:
        watchdog.cancel()
    elapsed = time.monotonic() - t0
    with srv.lock:
        reqs = list(srv.requests)
    return Outcome(rc, err.getvalue(), out.getvalue(), elapsed, reqs)


def check(o: Outcome, label: str) -> None:
    """The battery's one assertion: a named, non-internal exit, one clean error line, in time."""
    from genmanip_protocol.errors import ExitCode

    what = f"{label}: exit {o.rc} after {o.elapsed:.2f} s\nrequests: {o.requests[-8:]}\n{o.stderr[-1500:]}"
    assert o.rc != ExitCode.INTERNAL, what
    assert o.rc in {int(c) for c in ExitCode}, what
    assert "Traceback" not in o.stderr, what
    if o.rc != 0:
        assert "gmp: error:" in o.stderr, what
    assert TOKEN not in o.stderr and TOKEN not in o.stdout, what
    assert o.elapsed < BOUND_S, what


# -- the commands and their routes -------------------------------------------------------------


def _online(action: str, *extra: str) -> Callable[[HostileServer, Path], list[str]]:
    def argv(srv: HostileServer, project: Path) -> list[str]:
        return ["online", action, "--base-url", srv.url, "--timeout", str(CALL_S), *extra]

    return argv


def _lb(action: str) -> Callable[[HostileServer, Path], list[str]]:
    def argv(srv: HostileServer, project: Path) -> list[str]:
        common = ["--host", "127.0.0.1", "--port", str(srv.port), "--insecure-http"]
        if action == "status":
            return ["leaderboard", "status", "sub-1", *common]
        return ["leaderboard", "submit", "--root", str(project), "--run-id", "lbrun", "-n", "exp",
                "-l", "lb", "--force", *common]

    return argv


def _cmd(*words: str) -> Callable[[HostileServer, Path], list[str]]:
    def argv(srv: HostileServer, project: Path) -> list[str]:
        return [*words, "--url", srv.url]

    return argv


def _eval(flavour: str, *extra: str) -> Callable[[HostileServer, Path], list[str]]:
    def argv(srv: HostileServer, project: Path) -> list[str]:
        return _eval_argv(srv.url, flavour, *extra)

    return argv


#: (label, flavour, argv builder, attacked route suffixes)
COMMANDS: list[tuple[str, str, Callable[[HostileServer, Path], list[str]], tuple[str, ...]]] = [
    ("status", "msgpack", _cmd("status"), ("/status",)),
    ("submit", "msgpack", _cmd("submit", "testbed/smoke"), ("/status", "/start_new_job")),
    ("eval", "msgpack", _eval("msgpack"), ("/status", "/protocol", "/kill", "/reset", "/reset_result", "/step")),
    ("eval-chunk", "chunk", _eval("chunk", *_CHUNK_FLAGS), ("/step_chunk",)),
    ("eval-legacy", "legacy", _eval("legacy"), ("/docs", "/reset_result", "/step")),
    ("online create", "msgpack", _online("create"), ("/createTask",)),
    ("online ready", "msgpack", _online("ready", "--task-id", "task-1"), ("/ready",)),
    ("online submit", "msgpack", _online("submit", "--deadline", str(RETRY_S), "--interval", "0.1"), ("/createTask", "/ready")),
    ("online stop", "msgpack", _online("stop", "--task-id", "task-1"), ("/ready", "/stop")),
    ("leaderboard status", "msgpack", _lb("status"), ("/upload_status/sub-1",)),
    ("leaderboard submit", "msgpack", _lb("submit"), ("/api/upload",)),
]

_BY_LABEL = {label: (flavour, argv) for label, flavour, argv, _ in COMMANDS}
#: One (command, route) per client family gets every transport attack: the eval client's JSON
#: and wire replies, the online service, the leaderboard's upload (multipart) and status.
PRIMARY = [("status", "/status"), ("eval", "/protocol"), ("eval", "/step"),
           ("online create", "/createTask"), ("leaderboard submit", "/api/upload")]
#: Every other (command, route) gets the core of them: one per status family and failure kind.
CORE = [
    "100 forever", "101 switching protocols", "103 early hints then good", "204 no content",
    "200 empty body", "200 html page", "302 to another host", "304 not modified",
    "401 with token echo", "502 nginx", "garbage status line", "reset mid-body",
    "declares 2 GiB", "chunked endless", "chunked negative size", "truncated body then close",
    "trickled headers", "deep json", "nan json",
]
_ATTACK = dict(TRANSPORT_ATTACKS)
assert set(CORE) <= set(_ATTACK) and len(_ATTACK) == len(TRANSPORT_ATTACKS)
CASES = [(c, r, name) for c, r in PRIMARY for name in _ATTACK] + [
    (label, route, name)
    for label, _, _, routes in COMMANDS for route in routes if (label, route) not in PRIMARY
    for name in CORE
]


@pytest.mark.parametrize(("command", "route", "name"), CASES, ids=[f"{c} {r} <- {n}" for c, r, n in CASES])
def test_transport_attack(command: str, route: str, name: str, server: HostileServer,
                          project: Path, fast: None) -> None:
    flavour, argv = _BY_LABEL[command]
    server.start_case((route, _ATTACK[name]), flavour)
    check(run_inprocess(server, argv(server, project)), f"{command} {route} <- {name}")


# -- wrong types in every field ----------------------------------------------------------------

_DELETE = object()
#: (label, value) put into one field of a JSON reply; NaN/Infinity/10**400 are what a Python
#: server's json.dumps writes, and json.loads reads them back.
JSON_VALUES: list[tuple[str, Any]] = [
    ("missing", _DELETE), ("null", None), ("controls", "\x1b]52;c;eA==\x07\u202e"), ("negative", -1),
    ("huge int", 10**400), ("NaN", math.nan), ("Infinity", math.inf), ("list", [1, "x"]),
    ("object", {"a": 1}), ("true", True),
]
#: (label, value) for a field of a msgpack reply (msgpack has no int beyond 64 bits)
WIRE_VALUES: list[tuple[str, Any]] = [
    ("missing", _DELETE), ("null", None), ("controls", "\x1b[2J\u202e"), ("max uint64", 2**64 - 1),
    ("NaN", math.nan), ("object", {"a": 1}),
]
#: (label, value) for a field of a pickle reply: ints of any size
PICKLE_VALUES: list[tuple[str, Any]] = [("huge int", 10**400), ("5000-digit int", 10**5000), ("negative", -1)]

_OBS_KEYS = ("instruction", "timestep", "reset", "episode_id", "robot_id", "state.joints",
             "state.base", "state.ee_pose", "video.left_camera_view")
_ENTRY = [(), ("0",), ("0", "obs"), ("0", "metric"), ("0", "episode_result"), ("0", "reset_pending"),
          ("0", "lock_lost"), ("0", "metric", "*testbed/reach/red_block_easy", "score"),
          *(("0", "obs", k) for k in _OBS_KEYS)]

#: (command, route, paths, values, codec): codec None = JSON
FIELD_TARGETS: list[tuple[str, str, list[tuple[str, ...]], list[tuple[str, Any]], str | None]] = [
    ("status", "/status", [("data",), *(("data", k) for k in (
        "status", "benchmark_id", "run_id", "total_episodes", "completed_episodes",
        "in_progress_episodes", "active_workers", "results")),
        ("data", "results", "task"), ("data", "active_workers", "0")], JSON_VALUES, None),
    ("eval", "/protocol", [(), *((k,) for k in ("server", "version", "protocol_versions", "codecs",
        "frames", "robot_id", "auth")), ("codecs", "0"), ("frames", "0")], JSON_VALUES, None),
    ("submit", "/start_new_job", [(), ("data",), ("data", "success")], JSON_VALUES, None),
    ("online create", "/createTask", [(), ("code",), ("msg",), ("data",), ("data", "task_id")], JSON_VALUES, None),
    ("online ready", "/ready", [("code",), ("data",), *(("data", k) for k in (
        "ready", "endpoint", "queue_position", "eta_s", "status"))], JSON_VALUES, None),
    ("online stop", "/stop", [(), ("code",), ("data",)], JSON_VALUES, None),
    ("leaderboard submit", "/api/upload", [(), ("status",), ("submission_id",), ("error",)], JSON_VALUES, None),
    ("leaderboard status", "/upload_status/sub-1", [(), ("status",)], JSON_VALUES, None),
    ("eval", "/step", _ENTRY, WIRE_VALUES, "msgpack"),
    ("eval", "/reset_result", _ENTRY, WIRE_VALUES, "msgpack"),
    ("eval-chunk", "/step_chunk", [("obs",), ("executed_steps",), ("stopped_early",),
                                   ("obs", "0", "obs", "timestep")], WIRE_VALUES, "msgpack"),
    ("eval-legacy", "/step", [("0", "obs", "timestep"), ("0", "metric", "*testbed/reach/red_block_easy", "score"),
                              ("0", "obs", "state.base")], PICKLE_VALUES, "legacy"),
    ("eval-legacy", "/reset_result", [("0", "obs", "timestep"), ("0", "episode_result")], PICKLE_VALUES, "legacy"),
]


def _put(tree: Any, path: tuple[str, ...], value: Any) -> Any:
    """``tree`` with ``value`` at ``path`` (created if absent, removed for ``_DELETE``)."""
    if not path:
        return {} if value is _DELETE else value
    node = tree
    for key in path[:-1]:
        if isinstance(node, list):
            node = node[int(key)] if node else node
        elif isinstance(node, dict):
            node = node.setdefault(key, {})
        else:
            return tree
    last = path[-1]
    if isinstance(node, list):
        if value is _DELETE:
            node.clear()
        elif node:
            node[0] = value
        else:
            node.append(value)
    elif isinstance(node, dict):
        if value is _DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return tree


def _mutate(path: tuple[str, ...], value: Any, codec: str | None) -> Script:
    """The good reply with one field replaced (a reply that does not decode is sent unchanged:
    the adopt probe's 500, for instance)."""

    def body(g: Good) -> bytes:
        if g.status != 200:
            return g.body
        if codec is None:
            try:
                tree = json.loads(g.body)
            except ValueError:
                return g.body
            return json.dumps(_put(tree, path, value)).encode()
        from genmanip_protocol.codec import get_codec

        c = get_codec(codec)
        try:
            tree = _plain(c.decode(g.body))
        except Exception:
            return g.body
        return bytes(c.encode(_put(tree, path, value)))

    def script(sock: socket.socket, req: Request, good: Good) -> bool:
        sock.sendall(http_reply(good.status, body(good), good.headers))
        return True

    return script


def _plain(node: Any) -> Any:
    """Observations -> plain dicts (frames stay encoded), recursively."""
    if hasattr(node, "raw_items"):
        return {k: _plain(v) for k, v in node.raw_items()}
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


FIELD_CASES = [(c, r, p, label, v, codec) for c, r, paths, values, codec in FIELD_TARGETS
               for p in paths for label, v in values]


@pytest.mark.parametrize(("command", "route", "path", "label", "value", "codec"), FIELD_CASES,
                         ids=[f"{c} {r} {'.'.join(p) or '<body>'}={lbl}" for c, r, p, lbl, _, _ in FIELD_CASES])
def test_wrong_field(command: str, route: str, path: tuple[str, ...], label: str, value: Any,
                     codec: str | None, server: HostileServer, project: Path, fast: None) -> None:
    flavour, argv = _BY_LABEL[command]
    server.start_case((route, _mutate(path, value, codec)), flavour)
    check(run_inprocess(server, argv(server, project)),
          f"{command} {route} {'.'.join(path) or '<body>'} = {label}")


# -- a few as real processes, the redirect target, huge ints in actions ------------------------


def _gmp_process(argv: list[str], timeout: float) -> Outcome:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("GMP_TOKEN", "GENMANIP_RESULT_DIR")}
    env.update({"NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "GMP_TOKEN": TOKEN,
                "GMP_ONLINE_TOKEN": TOKEN, "GMP_CONFIG": os.devnull})
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "genmanip", *argv], capture_output=True, text=True,
                       timeout=timeout, env=env, check=False)
    return Outcome(p.returncode, p.stderr, p.stdout, time.monotonic() - t0, [])


#: (command argv builder, route, attack, exit code): the real defaults (no patched limits).
PROCESS_CASES = [
    ("status", "/status", "declares 2 GiB", 5),
    ("eval", "/protocol", "302 to another host", 5),
    ("online ready", "/ready", "trickled headers", 7),
    ("online create", "/createTask", "100 forever", 7),
    ("leaderboard status", "/upload_status/sub-1", "101 switching protocols", 5),
]


@pytest.mark.parametrize(("command", "route", "name", "code"), PROCESS_CASES,
                         ids=[f"{c} {r} <- {n}" for c, r, n, _ in PROCESS_CASES])
def test_as_a_process(command: str, route: str, name: str, code: int, server: HostileServer,
                      project: Path) -> None:
    """A real ``gmp`` process: the exit status is the named code (not 70, not a signal)."""
    flavour, argv = _BY_LABEL[command]
    server.start_case((route, _ATTACK[name]), flavour)
    args = [a if a != str(CALL_S) else "1.0" for a in argv(server, project)]
    o = _gmp_process(args, timeout=60)
    check(Outcome(o.rc, o.stderr, o.stdout, 0.0, []), f"process {command} {route} <- {name}")
    assert o.rc == code, o.stderr
    assert o.elapsed < 20, o.elapsed


def test_a_redirect_is_never_followed(server: HostileServer, fast: None) -> None:
    """A 307 to another server: that server never hears from gmp (the request carries the token)."""
    hits: list[Request] = []

    def target(srv: HostileServer, req: Request) -> Good:
        hits.append(req)
        return _json_good({"data": {"status": "idle"}})

    other = HostileServer(target)
    try:
        redirect = status(307, b"", extra=(("Location", other.url + "/status"),))
        server.start_case(("/status", redirect))
        o = run_inprocess(server, ["status", "--url", server.url])
        check(o, "status <- 307 to a live server")
        assert o.rc == 5 and "redirect" in o.stderr and other.url in o.stderr, o.stderr
        assert hits == []
    finally:
        other.close()


@pytest.mark.parametrize("value", [10**400, 10**5000, -(10**400)], ids=["400 digits", "5000 digits", "negative"])
def test_huge_int_in_an_action_is_a_validation_error(value: int, tmp_path: Path, fast: None) -> None:
    """Input, not a server: an action whose joint value is an int beyond the float range."""
    from genmanip_protocol.errors import ExitCode, ValidationError
    from genmanip_protocol.schema import validate_action, validate_chunk

    action = {"action": [value] + [0.0] * 15, "control_type": "joint_position"}
    for call in (lambda: validate_action("manip/lift2/R5a", action),
                 lambda: validate_chunk("manip/lift2/R5a", [action, action])):
        with pytest.raises(ValidationError) as ei:
            call()
        assert ei.value.exit_code == ExitCode.INVALID_INPUT
        assert "action[0]" in str(ei.value) and "digits" in str(ei.value), str(ei.value)
    # the same through `gmp validate` (a JSON file can hold a 400-digit int; 5000 digits do not
    # parse as JSON, and are covered by the API above)
    if value.bit_length() < 4000:
        f = tmp_path / "action.json"
        f.write_text(json.dumps(action))
        o = run_inprocess(_NO_SERVER, ["validate", "--robot", "manip/lift2/R5a", "--kind", "action", str(f)])
        assert o.rc == ExitCode.INVALID_INPUT and "Traceback" not in o.stderr, o.stdout + o.stderr
        assert "action[0]" in o.stdout, o.stdout


class _NoServer:
    """``run_inprocess`` for a command that talks to no server."""

    lock = threading.Lock()
    requests: list[str] = []

    def refuse_all(self) -> None:
        pass


_NO_SERVER: Any = _NoServer()
