"""A tiny real HTTP server with scripted replies, for reply shapes the testbed never produces
(malformed replies, omitted workers, old float metrics, lock loss)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from genmanip_protocol.codec import LegacyCodec

Reply = tuple[int, str, bytes]
CODEC = LegacyCodec()
EID = "bench/run/bench/task_a/000"


def obs(ts: int, *, reset: bool = False, eid: str = EID) -> dict[str, Any]:
    return {
        "instruction": "do it",
        "state.joints": np.zeros(7, np.float32),
        "state.gripper": np.zeros(2, np.float32),
        "state.base": [0.0, 0.0, 0.0],
        "timestep": ts,
        "reset": reset,
        "episode_id": eid,
        "robot_id": "manip/franka/panda_hand",
    }


def pickled(obj: Any, status: int = 200) -> Reply:
    return status, "application/octet-stream", CODEC.encode(obj)


def js(obj: Any, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(obj).encode()


class Hangup(Exception):
    """Raised by a route: the server reads the request and closes the connection unanswered
    (a server killed mid-request, as the client sees it)."""


PENDING = {"obs": {"reset": True, "reset_pending": True}, "metric": None, "episode_result": None,
           "reset_pending": True}


def default_routes() -> dict[str, Callable[[bytes], Reply]]:
    return {
        "/protocol": lambda b: js({"detail": "Not Found"}, 404),
        "/docs": lambda b: (200, "text/html", b"<html></html>"),
        "/kill": lambda b: js({"data": {"success": True}}),
        "/reset": lambda b: pickled({"0": PENDING}),
        "/reset_result": lambda b: pickled({"0": {"obs": obs(0, reset=True), "metric": None,
                                                  "episode_result": None}}),
        "/status": lambda b: js({"data": {"status": "running", "total_episodes": 1}}),
    }


@contextmanager
def stub_server(routes: dict[str, Callable[[bytes], Reply]]) -> Iterator[tuple[str, list[str]]]:
    calls: list[str] = []
    table = default_routes()
    table.update(routes)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _handle(self) -> None:
            path = self.path.split("?", 1)[0]
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            calls.append(path)
            fn = table.get(path)
            try:
                status, ctype, data = fn(body) if fn else js({"detail": "Not Found"}, 404)
            except Hangup:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _handle
        do_POST = _handle

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", calls
    finally:
        srv.shutdown()
        srv.server_close()
