"""Fixtures: an isolated environment, throwaway TLS files (both :mod:`genmanip_runtime.testing`)
and a small scripted HTTP server.

The scripted server is a real HTTP server on 127.0.0.1 (stdlib ``http.server``) whose replies are
set per path by the test. It serves the failure modes the testbed's emulation of the online
service does not produce on purpose: non-JSON bodies, malformed envelopes, slow replies, 404s on
one stop route but not the other.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from genmanip_runtime.testing import TLSFiles, isolate_environment, make_tls_files

Reply = tuple[int, bytes, str]  # status, body, content type


def envelope(data: Any = None, *, code: int = 0, msg: str = "ok") -> Reply:
    return 200, json.dumps({"code": code, "msg": msg, "data": data}).encode(), "application/json"


@dataclass
class ScriptedServer:
    url: str
    # path -> reply, or a callable(body, query) -> reply; a list is consumed one reply per request
    routes: dict[str, Any] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def count(self, path: str) -> int:
        return sum(1 for r in self.requests if r["path"] == path)


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    state = ScriptedServer(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path, _, query = self.path.partition("?")
            state.requests.append({"method": self.command, "path": path, "query": query,
                                   "body": body, "headers": dict(self.headers)})
            time.sleep(state.delay.get(path, 0.0))
            reply = state.routes.get(path)
            if isinstance(reply, list):
                reply = reply.pop(0) if len(reply) > 1 else reply[0]
            if callable(reply):
                reply = reply(body, query)
            if reply is None:
                reply = (404, b'{"detail": "Not Found"}', "application/json")
            status, data, ctype = reply
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _handle
        do_POST = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never read the developer's config file or tokens.
    isolate_environment(monkeypatch, tmp_path)


@pytest.fixture
def env() -> Callable[..., Reply]:
    """The :func:`envelope` reply builder."""
    return envelope


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost (trustme)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))
