"""A hostile GenManip server for the reliability suite: a real testbed behind a rewriting proxy.

:class:`HostileProxy` forwards every request to an upstream testbed over HTTP and, for the eval
routes, decodes the msgpack reply, passes it through ``mutate(route, tree) -> tree`` and re-encodes
it. So the client under test speaks the real wire to a server that does the real work, but lies
about exactly the fields a test chooses (episode ids, task names, metric, episode_result...).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["HostileProxy", "rewrite_key"]

Mutator = Callable[[str, Any], Any]


def rewrite_key(tree: Any, key: str, fn: Callable[[Any], Any]) -> Any:
    """Replace the value of every mapping entry named ``key`` in ``tree`` by ``fn(old)`` (in place)."""
    if isinstance(tree, dict):
        for k in list(tree):
            if k == key:
                tree[k] = fn(tree[k])
            else:
                rewrite_key(tree[k], key, fn)
    elif isinstance(tree, list):
        for v in tree:
            rewrite_key(v, key, fn)
    return tree


class HostileProxy:
    """``with HostileProxy(upstream_url, mutate) as url:`` serves on 127.0.0.1 (ephemeral port)."""

    ROUTES = ("/reset", "/reset_result", "/step", "/step_chunk")

    def __init__(self, upstream: str, mutate: Mutator) -> None:
        self.upstream = urlsplit(upstream)
        self.mutate = mutate
        self.replies = 0
        self.mutated = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                ctype = resp.getheader("Content-Type") or ""
                route = self.path.split("?", 1)[0]
                if resp.status == 200 and route in proxy.ROUTES and "msgpack" in ctype:
                    data = proxy._rewrite(route, data)
                with proxy._lock:
                    proxy.replies += 1
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _rewrite(self, route: str, data: bytes) -> bytes:
        from genmanip_protocol.codec import MsgpackCodec

        codec = MsgpackCodec()
        tree = _plain(codec.decode(data))
        new = self.mutate(route, tree)
        with self._lock:
            self.mutated += 1
        return codec.encode(new)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _plain(node: Any) -> Any:
    """Observations -> plain dicts (frames stay encoded), recursively, so mutators see dicts."""
    if hasattr(node, "raw_items"):
        return {k: _plain(v) for k, v in node.raw_items()}
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node
