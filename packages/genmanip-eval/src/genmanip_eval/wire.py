"""The client's side of the wire: transports (one main connection, one per worker for parallel
chunks), the headers and query every call carries, codec negotiation, JSON and wire-encoded
calls, the safe-retry policy, and the interrupt that aborts all of it from any thread."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from genmanip_protocol.codec import get_codec
from genmanip_protocol.errors import GenmanipError, ResponseError, Violation
from genmanip_runtime.errors import (
    ConnectError,
    HTTPStatusError,
    RequestAborted,
    ResponseTooLarge,
    TransportError,
    UnexpectedReply,
)
from genmanip_runtime.retry import Backoff, retry_call
from genmanip_runtime.text import safe_text
from genmanip_runtime.transport import HttpTransport

from .options import TOKEN_ENV, ConnectionOptions

__all__ = ["BackoffFactory", "Wire", "header", "server_ms"]

log = logging.getLogger("genmanip_eval.client")

#: What the server should be, in the message about a reply that is not one's.
SERVICE = "a GenManip eval server"
#: how long a call that is safe to repeat is retried, by default (seconds)
RETRY_DEADLINE_S = 30.0

#: Builds every retry loop's :class:`Backoff` (keyword arguments of ``Backoff``).
BackoffFactory = Callable[..., Backoff]


def header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    val = getter(name)
    if val is None:
        val = getter(name.lower())
    return None if val is None else str(val)


def server_ms(resp: Any) -> float | None:
    """The server's own time for a reply (``X-Genmanip-Server-Ms``), if it says."""
    raw = header(getattr(resp, "headers", None), "X-Genmanip-Server-Ms")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


class Wire:
    """Every request of one client goes through here.

    ``requests`` is the client's per-route counter (``stats["requests"]``). ``new_backoff``
    builds the retry schedules. :meth:`abort` (any thread) ends the request in progress on every
    transport and makes later requests and waits raise
    :class:`~genmanip_runtime.errors.RequestAborted` until :meth:`rearm`.
    """

    def __init__(
        self, options: ConnectionOptions, *, requests: dict[str, int], new_backoff: BackoffFactory
    ) -> None:
        self.options = options
        self.timeouts = options.timeouts
        self.new_backoff = new_backoff
        self._requests = requests
        self._count_lock = threading.Lock()
        self._transport_lock = threading.Lock()
        #: set by :meth:`abort`: every wait of the client wakes up on it
        self.interrupted = threading.Event()
        self.codec: Any = None
        self.codec_name: str | None = None
        self.frames: str | None = None
        self.server_info: dict[str, Any] | None = None
        self._http: HttpTransport | None = None
        self._worker_http: dict[str, HttpTransport] = {}

    # -- transports ---------------------------------------------------------------------------

    def _new_transport(self) -> HttpTransport:
        # (service: named when a reply is not a GenManip server's -- a redirect, an HTML page)
        t = HttpTransport(self.options.base_url, token=self.options.token,
                          ca_file=self.options.ca_file, service=SERVICE, token_env=TOKEN_ENV)
        if self.interrupted.is_set():
            t.abort()
        return t

    @property
    def http(self) -> HttpTransport:
        """The main keep-alive connection (created on first use)."""
        with self._transport_lock:
            if self._http is None:
                self._http = self._new_transport()
            return self._http

    def transport_for(self, wid: str) -> HttpTransport:
        """The worker's own connection (parallel ``/step_chunk`` calls)."""
        with self._transport_lock:
            t = self._worker_http.get(wid)
            if t is None:
                t = self._worker_http[wid] = self._new_transport()
            return t

    def _transports(self) -> list[HttpTransport]:
        return [t for t in [self._http, *self._worker_http.values()] if t is not None]

    def abort(self) -> None:
        """End every request in progress and refuse later ones (any thread; idempotent)."""
        with self._transport_lock:
            self.interrupted.set()
            transports = self._transports()
        for t in transports:
            t.abort()

    def rearm(self) -> None:
        """Accept requests and waits again after :meth:`abort`."""
        with self._transport_lock:
            self.interrupted.clear()
            transports = self._transports()
        for t in transports:
            t.rearm()

    def wait(self, seconds: float) -> None:
        """Sleep, unless interrupted: then raise ``RequestAborted`` at once."""
        if self.interrupted.wait(seconds):
            raise RequestAborted("interrupted while waiting")

    def close(self) -> None:
        for t in self._transports():
            t.close()

    # -- calls --------------------------------------------------------------------------------

    def count(self, route: str) -> None:
        with self._count_lock:
            self._requests[route] = self._requests.get(route, 0) + 1

    def headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.options.run_id:
            h["run_id"] = self.options.run_id
        if self.codec_name == "msgpack" and self.frames:
            h["X-Genmanip-Frames"] = self.frames
        return h

    def query(self, extra: Mapping[str, Any] | None = None) -> dict[str, str] | None:
        q: dict[str, str] = {}
        if self.options.run_id:
            q["run_id"] = self.options.run_id
        if extra:
            q.update({k: str(v) for k, v in extra.items() if v is not None})
        return q or None

    def retry(self, fn: Callable[[], Any], *, deadline: float = RETRY_DEADLINE_S, idempotent: bool = False) -> Any:
        """``fn()`` repeated while it fails in a way that is safe to repeat: nothing executed, or
        ``idempotent`` (``/kill``, ``GET /status``: running twice is running once), then also a
        connection lost after sending."""

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, ConnectError):
                return True
            if isinstance(exc, HTTPStatusError):
                return exc.status in (502, 503)
            if isinstance(exc, (ResponseTooLarge, UnexpectedReply)) or not getattr(exc, "retryable", True):
                return False  # (the same reply again: a server's answer, not a lost connection)
            return isinstance(exc, TransportError) and (idempotent or not exc.maybe_executed)

        return retry_call(
            fn,
            retry_on=retryable,
            backoff=self.new_backoff(initial=0.2, factor=2.0, max_delay=2.0, jitter=0.2,
                                     deadline=deadline),
            interrupt=self.interrupted,
        )

    def json_call(
        self, route: str, payload: Any, *, method: str = "POST", timeout_key: str, retry: bool,
        retry_deadline: float = RETRY_DEADLINE_S,
    ) -> Any:
        def call() -> Any:
            self.count(route)
            body = None if method == "GET" else json.dumps(payload).encode()
            return self.http.request(
                method,
                route,
                body=body,
                content_type=None if body is None else "application/json",
                query=self.query(payload if method == "GET" else None),
                headers=self.headers(),
                timeout=self.timeouts[timeout_key],
                route_name=route,
                idempotent=retry,
                expect="application/json",
            )

        # (retry=True is for the routes that are safe to repeat: /kill, /status, /docs)
        resp = self.retry(call, deadline=retry_deadline, idempotent=True) if retry else call()
        return resp.json()

    def call(
        self,
        http: HttpTransport,
        route: str,
        obj: Any,
        *,
        timeout: float,
        query: Mapping[str, Any] | None = None,
        idempotent: bool = False,
    ) -> tuple[Any, Any]:
        """POST a wire-encoded body; return (decoded reply, response)."""
        codec = self.codec
        body = codec.encode(obj, tag_arrays=False) if self.codec_name == "legacy" else codec.encode(obj)
        self.count(route)
        resp = http.request(
            "POST",
            route,
            body=body,
            content_type=codec.content_type,
            query=self.query(query),
            headers=self.headers(),
            timeout=timeout,
            route_name=route,
            idempotent=idempotent,
            # a 2xx that is not this codec's (an HTML page, a JSON error, an empty 204) is
            # refused by the transport, naming what came instead of a decoder's complaint
            expect=codec.content_type,
        )
        return codec.decode(resp.body), resp

    def docs(self) -> Any:
        """``GET /docs`` once (liveness; the real server's only one)."""
        return self.http.request(
            "GET", "/docs", timeout=self.timeouts["docs"], route_name="/docs", idempotent=True
        )

    # -- connection setup ---------------------------------------------------------------------

    def connect(self) -> None:
        """Check the server is alive and pick the codec (``GET /protocol`` once). Idempotent."""
        if self.codec is not None:
            return
        opts = self.options
        token = opts.token
        info: dict[str, Any] | None = None
        if opts.codec == "auto":

            def probe() -> Any:
                self.count("/protocol")
                return self.http.request(
                    "GET",
                    "/protocol",
                    query=self.query(),
                    headers=self.headers(),
                    timeout=self.timeouts["protocol"],
                    route_name="/protocol",
                    idempotent=True,
                    raise_for_status=False,
                )

            # (a GET: asked again even after a connection lost mid-request, e.g. a server
            # killed while another lane's /reset was in flight)
            resp = self.retry(probe, deadline=self.timeouts["docs"], idempotent=True)
            if resp.status == 404:
                name = "legacy"  # the real server has no /protocol: legacy wire
            else:
                # Any other answer is judged like every reply (the transport's one place): a
                # redirect, a 1xx, a 204, an HTML page or an error raise, naming what came.
                resp.raise_for_status(expect="application/json")
                try:
                    info = resp.json()
                except GenmanipError as exc:
                    raise ResponseError(
                        Violation("GET /protocol", "a JSON object", f"undecodable body ({exc})")
                    ) from exc
                if not isinstance(info, dict) or not isinstance(info.get("codecs"), list):
                    raise ResponseError(
                        Violation("GET /protocol.codecs", "a list of codec names",
                                  safe_text(repr(info), limit=80, tokens=(token,)))
                    )
                name = "msgpack" if "msgpack" in info["codecs"] else "legacy"
        else:
            name = opts.codec

            def docs() -> Any:
                self.count("/docs")
                return self.docs()

            self.retry(docs, deadline=self.timeouts["docs"], idempotent=True)
        self.server_info = info
        self.codec = get_codec(name)
        self.codec_name = name
        if name == "msgpack":
            # Without /protocol (codec forced) the user's choice stands. Only the kinds gmp
            # knows are taken from the server (the choice goes back to it in a header).
            offered = (info or {}).get("frames") or ["raw", "jpeg"]
            offered = [f for f in offered if f in ("raw", "jpeg")] if isinstance(offered, list) else []
            if not offered:
                raise ResponseError(Violation(
                    "GET /protocol.frames", "a list of frame kinds among raw, jpeg",
                    safe_text(repr((info or {}).get("frames")), limit=80, tokens=(token,)),
                ))
            want = opts.frames
            if want == "auto":
                want = "raw" if opts.loopback else "jpeg"
            if want not in offered:
                want = offered[0]
            self.frames = want
        else:
            self.frames = "jpeg"
        log.debug("connected to %s: codec=%s frames=%s", opts.base_url, name, self.frames)
