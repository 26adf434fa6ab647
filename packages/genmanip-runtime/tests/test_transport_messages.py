"""What the transport says when the URL names the wrong server (issue 19 §5), against real local
servers: an HTML web server, a plain-HTTP server reached with ``https://``, a server wanting a
token."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_runtime.errors import AuthError, ConnectError, HTTPStatusError
from genmanip_runtime.retry import Backoff, retry_call
from genmanip_runtime.transport import HttpTransport

SERVICE = "a GenManip eval server"
PAGE = b"<!doctype html><html><head><title>gmp viz</title></head><body>" + b"<div>x</div>" * 300


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/auth"):
            body, status, ctype = b'{"detail": "Not authenticated"}', 401, "application/json"
        elif self.path.startswith("/gateway"):
            body, status, ctype = b"<html><head><title>502 Bad Gateway</title></head></html>", 502, "text/html"
        else:
            body, status, ctype = PAGE, 404, "text/html; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # an upload: its body is read, then answered as a GET would be
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_html_page_is_named_once_and_never_dumped(server: str) -> None:
    with HttpTransport(f"http://{server}", service=SERVICE) as t:
        with pytest.raises(HTTPStatusError) as ei:
            t.get("/status")
        e = ei.value
        assert e.not_service and e.exit_code == ExitCode.REMOTE_ERROR
        assert str(e) == (
            "GET /status failed: HTTP 404 Not Found with an HTML page titled 'gmp viz': this does not "
            "look like a GenManip eval server (GET /docs on the server shows what it is; a GenManip "
            "eval server answers JSON, not HTML pages)"
        )
        assert e.hint == "check --url / --host / --port: they name some other web server"
        assert e.detail == ""
        # The next failure against the same server (a cleanup call) says it briefly.
        with pytest.raises(HTTPStatusError) as ei:
            t.get("/kill")
        assert str(ei.value) == (f"GET /kill failed: HTTP 404 (the server at http://{server} is not "
                                 "a GenManip eval server)")
        assert ei.value.hint is None


def test_an_html_page_without_a_service_is_still_not_dumped(server: str) -> None:
    with HttpTransport(f"http://{server}") as t, pytest.raises(HTTPStatusError) as ei:
        t.get("/status")
    assert str(ei.value) == "GET /status failed: HTTP 404 Not Found: an HTML page titled 'gmp viz'"
    assert not ei.value.not_service


def test_a_gateways_html_page_does_not_blame_the_url(server: str) -> None:
    with HttpTransport(f"http://{server}", service=SERVICE) as t, pytest.raises(HTTPStatusError) as ei:
        t.get("/gateway")
    assert str(ei.value) == "GET /gateway failed: HTTP 502 Bad Gateway: an HTML page titled '502 Bad Gateway'"
    assert not ei.value.not_service


@pytest.mark.parametrize(("token", "hint"), [
    (None, "the server wants a token and none was sent: set $GMP_TOKEN, add token or token_file to "
           "the config file, or pass --token"),
    ("wrong-token-0123456789", "the token was rejected: check the one in $GMP_TOKEN, the config file "
                               "(token / token_file) or --token"),
], ids=["missing", "rejected"])
def test_the_auth_hint_names_the_token_variable(server: str, token: str | None, hint: str) -> None:
    with HttpTransport(f"http://{server}", token=token, token_env="GMP_TOKEN") as t, \
            pytest.raises(AuthError) as ei:
        t.get("/auth")
    assert ei.value.hint == hint and ei.value.exit_code == ExitCode.AUTH


def test_an_upload_is_told_as_a_request_is(server: str, tmp_path: Path) -> None:
    # (one shared path: an upload's 401 names the token variable, and "not the service" is said
    # in full once per transport, then briefly)
    f = tmp_path / "run.zip"
    f.write_bytes(b"PK" + b"x" * 1000)
    with HttpTransport(f"http://{server}", token_env="GMP_TOKEN") as t, pytest.raises(AuthError) as ei:
        t.request_multipart("/auth", {"a": "b"}, {"file": ("run.zip", f, "application/zip")})
    assert ei.value.hint is not None and ei.value.hint.startswith(
        "the server wants a token and none was sent: set $GMP_TOKEN")
    with HttpTransport(f"http://{server}", service=SERVICE) as t:
        with pytest.raises(HTTPStatusError) as ei2:
            t.get("/status")
        assert "titled 'gmp viz'" in str(ei2.value)
        with pytest.raises(HTTPStatusError) as ei2:
            t.request_multipart("/upload", {}, {"file": ("run.zip", f, "application/zip")})
        assert str(ei2.value) == (f"POST /upload failed: HTTP 404 (the server at http://{server} is "
                                  "not a GenManip eval server)")
        assert ei2.value.hint is None


def test_the_auth_hint_without_a_variable_name(server: str) -> None:
    with HttpTransport(f"http://{server}") as t, pytest.raises(AuthError) as ei:
        t.get("/auth")
    assert ei.value.hint is not None and "set the token environment variable" in ei.value.hint


def test_https_to_a_plain_http_server_is_named_and_not_retried(server: str) -> None:
    calls = 0

    def call() -> object:
        nonlocal calls
        calls += 1
        with HttpTransport(f"https://{server}", service=SERVICE) as t:
            return t.get("/status")

    with pytest.raises(ConnectError) as ei:
        retry_call(call, retry_on=ConnectError, backoff=Backoff(initial=0.01, max_attempts=5))
    e = ei.value
    assert calls == 1 and e.retryable is False and e.exit_code == ExitCode.UNREACHABLE
    assert str(e) == (f"cannot connect to https://{server}: the server speaks plain HTTP, not HTTPS "
                      "(the TLS handshake got an HTTP reply)")
    assert e.hint == f"use http://{server} (the server has no TLS), or give the server a certificate"


def test_a_refused_connection_is_still_retried() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    calls = 0

    def call() -> object:
        nonlocal calls
        calls += 1
        with HttpTransport(f"http://127.0.0.1:{port}") as t:
            return t.get("/status")

    with pytest.raises(ConnectError) as ei:
        retry_call(call, retry_on=ConnectError, backoff=Backoff(initial=0.01, max_attempts=3))
    assert calls > 1 and ei.value.retryable is True
    assert ei.value.hint == "is the server running? check --url / --host / --port"
