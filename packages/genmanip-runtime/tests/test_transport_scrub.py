"""The transport's detail extraction: a hostile server's reason phrase and error body come out
scrubbed (the transport's own token, every registered secret, in every form, before the cut) and
with their control characters escaped."""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator

import pytest
from genmanip_runtime.errors import AuthError, HTTPStatusError
from genmanip_runtime.redact import forget_secrets, register_secret
from genmanip_runtime.transport import HttpTransport

TOKEN = "tp-" + "51c0ffee8d2b4a97" * 2
OTHER = "reg-" + "0a1b2c3d4e5f6a7b" * 2  # registered elsewhere in the process, not this transport's


class _RawServer:
    """Answers every request with one canned raw HTTP reply (any reason phrase, any body)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.reply: tuple[int, bytes, bytes, bytes] = (200, b"OK", b"{}", b"application/json")
        self.auth = ""
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                for line in data.split(b"\r\n"):
                    if line.lower().startswith(b"authorization:"):
                        self.auth = line.split(b":", 1)[1].strip().decode()
                status, reason, body, ctype = (
                    x.replace(b"{AUTH}", self.auth.encode()) if isinstance(x, bytes) else x
                    for x in self.reply
                )
                conn.sendall(b"HTTP/1.1 %d " % status + reason + b"\r\nContent-Type: " + ctype
                             + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                             + body)

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def raw_server() -> Iterator[_RawServer]:
    forget_secrets()
    srv = _RawServer()
    yield srv
    srv.close()
    forget_secrets()


def _reply(status: int, reason: bytes, body: bytes,
           ctype: bytes = b"application/json") -> tuple[int, bytes, bytes, bytes]:
    """A canned reply; ``{AUTH}`` anywhere is replaced by the request's Authorization header."""
    return status, reason, body, ctype


def _call(srv: _RawServer, token: str | None = TOKEN) -> HTTPStatusError:
    with HttpTransport(f"http://127.0.0.1:{srv.port}", token=token, timeout=10) as t, \
            pytest.raises(HTTPStatusError) as ei:
        t.get("/step")
    return ei.value


def _clean(text: str, *tokens: str) -> None:
    assert "\x1b" not in text and "\r" not in text and "\n" not in text
    assert not any(0x80 <= ord(c) < 0xA0 or c in "\u202e\u2066\u200b" for c in text), text
    for tok in tokens:
        for i in range(len(tok) - 7):
            assert tok[i : i + 8] not in text, (tok[i : i + 8], text)


def test_reason_phrase_with_token_and_escapes(raw_server: _RawServer) -> None:
    raw_server.reply = _reply(500, b"Oops {AUTH} \x1b]52;c;Zm9v\x07\x1b[2J\xc2\x9b1A", b"{}")
    exc = _call(raw_server)
    _clean(str(exc), TOKEN)
    assert "HTTP 500 Oops Bearer ***" in str(exc)


def test_json_detail_with_token_cut_at_the_limit(raw_server: _RawServer) -> None:
    # The token straddles the 400-character head of the cut: its prefix must not survive.
    detail = "x" * 390 + TOKEN + "y" * 1000 + "\x1b[1A\rok: all episodes passed\u202e"
    raw_server.reply = _reply(500, b"Internal Server Error", json.dumps({"detail": detail}).encode())
    exc = _call(raw_server)
    _clean(str(exc), TOKEN)
    _clean(exc.detail or "", TOKEN)
    assert " ... " in str(exc) and "\\rok: all episodes passed\\u202e" in str(exc)


def test_non_json_body_and_encoded_echoes(raw_server: _RawServer) -> None:
    b64 = base64.b64encode(f"Bearer {TOKEN}".encode()).decode()
    # (plain text: an HTML page is never quoted at all, see test_transport's HTML tests)
    body = f"<p>\x1b]0;pwned\x07 {{AUTH}} {b64} {TOKEN.encode().hex()} %s</p>\u2066"
    body = body % TOKEN.replace("-", "%2D")
    raw_server.reply = _reply(401, b"Unauthorized", body.encode(), b"text/plain")
    exc = _call(raw_server)
    assert isinstance(exc, AuthError)
    _clean(str(exc), TOKEN, base64.b64encode(TOKEN.encode()).decode()[:-4], TOKEN.encode().hex())
    assert "QmVhcmVyIH***" in str(exc)  # base64("Bearer <token>"): only "Bearer " is left
    assert "pwned" in str(exc)  # the text stays readable, only neutralised


def test_registered_secret_of_another_client_is_scrubbed_too(raw_server: _RawServer) -> None:
    register_secret(OTHER)
    raw_server.reply = _reply(403, b"Forbidden " + OTHER[:20].encode(),
                              json.dumps({"detail": {"echo": OTHER, "nested": [OTHER[5:]]}}).encode())
    exc = _call(raw_server, token=None)
    _clean(str(exc), OTHER)


def test_short_transport_token_is_still_replaced_exactly(raw_server: _RawServer) -> None:
    raw_server.reply = _reply(500, b"Error", json.dumps({"detail": "tok=abc! again abc"}).encode())
    exc = _call(raw_server, token="abc")
    assert exc.detail == "tok=***! again ***"


def test_response_detail_without_raising(raw_server: _RawServer) -> None:
    raw_server.reply = _reply(500, b"Error", json.dumps({"detail": "{AUTH}\n\x1b[31mred"}).encode())
    with HttpTransport(f"http://127.0.0.1:{raw_server.port}", token=TOKEN, timeout=10) as t:
        resp = t.get("/x", raise_for_status=False)
    assert resp.detail() == "Bearer ***\\n\\x1b[31mred"


def test_a_huge_error_body_is_made_safe_quickly(raw_server: _RawServer) -> None:
    import time

    register_secret(OTHER)
    body = ("\x1b[2J" * 2_000_000 + "x" * 390 + OTHER + "\x00" * 3_000_000).encode()
    raw_server.reply = _reply(500, b"Error", body, b"text/plain")
    t0 = time.perf_counter()
    exc = _call(raw_server)
    assert time.perf_counter() - t0 < 10  # only the part that can be shown is worked on
    _clean(str(exc), OTHER)
    assert len(exc.detail or "") <= 600
