"""Issue 19 §5: a URL that names the wrong server says so, once, without dumping its page.

Real servers on 127.0.0.1: a small web server answering HTML (what ``gmp viz``'s port or any web
server gives), and a plain-HTTP testbed reached with ``https://``.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

PAGE = (b"<!DOCTYPE html><html><head><title>gmp viz</title></head><body>" + b"<p>episode</p>" * 400
        + b"</body></html>")


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    def _page(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def do_GET(self) -> None:
        self._page(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._page(405)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def html_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def gmp(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GMP_TOKEN"}
    env["NO_COLOR"] = "1"
    return subprocess.run([sys.executable, "-m", "genmanip", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


NOT_GENMANIP = ("this does not look like a GenManip eval server (GET /docs on the server shows what "
                "it is; a GenManip eval server answers JSON, not HTML pages)")


@pytest.mark.parametrize("command", [["status"], ["eval", "--no-record", "--max-episodes", "1"]],
                         ids=["status", "eval"])
def test_an_html_server_is_named_not_dumped(command: list[str], html_server: str) -> None:
    p = gmp(*command, "--url", html_server)
    assert p.returncode == ExitCode.REMOTE_ERROR, p.stderr
    assert NOT_GENMANIP in p.stderr
    assert "with an HTML page titled 'gmp viz'" in p.stderr
    assert p.stderr.count("does not look like") == 1, p.stderr  # said once
    assert "<p>" not in p.stderr and "<!DOCTYPE" not in p.stderr and "<html" not in p.stderr
    assert "hint: check --url / --host / --port: they name some other web server" in p.stderr
    assert len(p.stderr) < 1200, p.stderr


def test_https_to_a_plain_http_server_says_so() -> None:
    with serve_testbed(tasks="testbed/smoke") as tb:
        hostport = tb.url.split("://", 1)[1]
        t0 = time.monotonic()
        p = gmp("status", "--url", f"https://{hostport}")
        elapsed = time.monotonic() - t0
    assert p.returncode == ExitCode.UNREACHABLE, p.stderr
    assert (f"gmp: error: cannot connect to https://{hostport}: the server speaks plain HTTP, not "
            "HTTPS (the TLS handshake got an HTTP reply)") in p.stderr
    assert f"hint: use http://{hostport} (the server has no TLS)" in p.stderr
    assert "is the server running?" not in p.stderr
    assert "gave up after" not in p.stderr  # retrying cannot help: not retried
    assert elapsed < 20, elapsed


def test_a_missing_token_says_which_variable() -> None:
    with serve_testbed(tasks="testbed/smoke", token="mismatch-token-0123456789") as tb:
        p = gmp("status", "--url", tb.url)
    assert p.returncode == ExitCode.AUTH, p.stderr
    assert "hint: the server wants a token and none was sent: set $GMP_TOKEN" in p.stderr
    assert "add token or token_file to the config file, or pass --token" in p.stderr
