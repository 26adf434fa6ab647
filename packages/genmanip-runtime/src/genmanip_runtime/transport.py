"""The one HTTP implementation of gmp: a keep-alive ``http.client`` connection with typed errors.

Why not requests/httpx: on loopback a 2.7 MB observation costs 1.3 ms through ``http.client``
against 6.8 ms through ``requests`` (which joins 10 KiB chunks in Python), and a new connection
per call (the reference client) costs more again. What this module adds over bare ``http.client``:

* one persistent connection with ``TCP_NODELAY``; small requests leave in a single ``send`` so
  Nagle + delayed ACK cannot add 40 ms per call;
* transparent reconnect when the peer closed an idle connection (uvicorn closes keep-alive
  connections after 5 s idle) — checked *before* sending, so nothing is resent blindly;
* a resend after a failure on a reused connection only for calls declared ``idempotent``; a
  ``/step`` is never replayed behind the caller's back (``TransportError.maybe_executed``);
* typed errors (:class:`ConnectError`, :class:`RequestTimeout` naming route and limit,
  :class:`HTTPStatusError` / :class:`AuthError` carrying the server's ``detail``);
* a deadline for the whole exchange: a call's ``timeout`` bounds connect + send + status line +
  headers + body, enforced before every ``recv`` (a server trickling its reply a byte at a time is
  cut at the limit, which a per-``recv`` timeout alone never does);
* a bound on the reply body (``max_reply_bytes``), checked against ``Content-Length`` before
  anything is allocated and while a chunked or read-until-close body arrives
  (:class:`ResponseTooLarge`);
* one place that judges a reply (:meth:`Response.raise_for_status`): anything but 2xx is an
  error -- a redirect is never followed (the request carries the token), a 1xx without a final
  reply is refused -- and a 2xx must carry the media type the caller expects (``expect``) and a
  body (:class:`UnexpectedReply`);
* the bearer token never appears in ``repr``, errors or logs, and TLS verification cannot be
  turned off (an extra CA file can be trusted instead).

An :class:`HttpTransport` is safe to share between threads, but calls are serialised on its one
connection: give each worker thread its own transport for parallelism. :meth:`HttpTransport.abort`
(from any thread) ends the call in progress at once and refuses later ones, raising
:class:`~genmanip_runtime.errors.RequestAborted`, until :meth:`HttpTransport.rearm`.
"""

from __future__ import annotations

import errno
import http.client
import io
import json as _json
import logging
import math
import os
import re
import secrets
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genmanip_protocol.errors import ConfigError, DecodeError

from .__about__ import __version__
from .errors import (
    AuthError,
    ConnectError,
    HTTPStatusError,
    RequestAborted,
    RequestTimeout,
    ResponseTooLarge,
    TransportError,
    UnexpectedReply,
)
from .netpolicy import check_plain_http
from .redact import register_secret
from .text import safe_text

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["DEFAULT_MAX_REPLY_BYTES", "HttpTransport", "Response", "build_base_url", "reply_json"]

_log = logging.getLogger(__name__)

#: Reconnect before sending when the connection has been idle this long: uvicorn's keep-alive
#: timeout is 5 s, and a request racing the server's close would fail mid-flight.
IDLE_RECONNECT_S = 4.0
#: Bodies up to this size are appended to the header block and leave in one ``send``.
_SINGLE_SEND_MAX = 256 * 1024
_DETAIL_MAX = 600
_REASON_MAX = 80
_SCRUB_MARGIN = 4096
_UPLOAD_CHUNK = 1024 * 1024

#: The largest reply body a call accepts unless it says otherwise (``max_reply_bytes``): 512 MiB.
#: Derived from the largest legitimate reply, a ``/step`` or ``/reset_result`` for every worker of
#: a run with raw camera frames:
#:
#: * one observation of the biggest robot, lift2 R5a on EBench: two 640x480 wrist cameras and two
#:   1280x720 cameras, raw RGB = 2*480*640*3 + 2*720*1280*3 = 7,372,800 bytes (state is ~100 B);
#: * times 32 workers, the most one run may drive (reference facts section 10): 236 MB;
#: * times the chunk factor: 1, because a ``/step_chunk`` reply carries only the last executed
#:   step's observation per worker (facts section 4), however long the chunk;
#: * times 4/3 for a server that sends frames base64-encoded (tagged arrays of the legacy wire):
#:   315 MB, rounded up to a power of two for headroom.
#:
#: A body above it is refused before a byte of it is allocated (a declared ``Content-Length``) or
#: as soon as it passes the limit (chunked, read-until-close), instead of ending in MemoryError.
DEFAULT_MAX_REPLY_BYTES = 512 * 1024 * 1024
#: A chunked or read-until-close body is read in pieces of this size (each bounded by the limit).
_READ_PIECE = 1024 * 1024
#: Buffer of the deadline-bound reader: one ``recv`` takes a small reply and its headers whole.
_READ_BUFFER = 64 * 1024
#: How much of an unexpected body a message quotes.
_SNIPPET = 80

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
#: How often a connect in progress looks at the abort flag (a connect is otherwise instantaneous
#: on a reachable host; this bounds how long an abort waits for one to a black-holed address).
_CONNECT_SLICE_S = 0.05

def build_base_url(url: str | None = None, host: str | None = None, port: int | None = None,
                   *, scheme: str = "http") -> str:
    """The base URL from ``--url`` or ``--host``/``--port`` (``--url`` wins).

    A URL without a scheme gets ``scheme://``; an IPv6 host is bracketed. Raises
    :class:`ConfigError` naming the flag when neither gives a host.
    """
    if url:
        url = url.strip()
        if "://" not in url:
            url = f"{scheme}://{url}"
        return url.rstrip("/")
    if not host:
        raise ConfigError("no server given: pass --url, or --host and --port")
    h = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{h}:{port}" if port else f"{scheme}://{h}"


def reply_json(body: bytes | str) -> Any:
    """A reply body parsed as JSON: the one JSON reader of every client (via :meth:`Response.json`
    or directly). Raises ``ValueError`` for anything that is not JSON -- invalid UTF-8, an int of
    more than 4300 digits, and nesting deeper than the interpreter's stack (100k ``[``), which
    ``json.loads`` reports as ``RecursionError``."""
    try:
        return _json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


@dataclass
class Response:
    """One HTTP reply. ``body`` is the whole body (bytes); ``elapsed_s`` is send-to-last-byte time.

    ``headers`` is case-insensitive (``headers["content-type"]``).
    """

    status: int
    headers: http.client.HTTPMessage
    body: bytes
    elapsed_s: float
    method: str = "GET"
    route: str = ""
    reason: str = field(default="", repr=False)
    # The sending transport's token, so that detail() and raise_for_status() scrub a server that
    # echoes credentials back even when the caller does not pass it (found by tests/reliability).
    scrub_token: str | None = field(default=None, repr=False, compare=False)
    #: What the server should be ("a GenManip eval server"), named when a reply is not one's.
    service: str | None = field(default=None, repr=False, compare=False)
    #: The environment variable the token comes from (``"GMP_TOKEN"``), named by a 401's hint.
    token_env: str | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True for 2xx."""
        return 200 <= self.status < 300

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower case (``"application/json"``), or ``""``."""
        return (self.headers.get("content-type") or "").split(";", 1)[0].strip().lower()

    def json(self) -> Any:
        """The body parsed as JSON; :class:`DecodeError` naming the route when it is not JSON."""
        try:
            return reply_json(self.body)
        except ValueError as exc:
            raise DecodeError(
                f"{self.method} {self.route}: reply is not JSON ({exc.__class__.__name__}: "
                f"{safe_text(str(exc), limit=120)}); body starts "
                f"{_snippet(self.body, self.scrub_token)!r}",
                codec="json",
            ) from None

    def detail(self) -> str:
        """The server's error text: ``{"detail": ...}`` of a JSON body, else the text body."""
        return _scrub(_extract_detail(self.body, self.content_type), self.scrub_token)

    def raise_for_status(self, *, token: str | None = None, expect: str | None = None) -> Response:
        """Judge the reply; return it when it is a usable success. The one place of every status class:

        * 1xx (an interim reply with no final one after it, e.g. 101 Switching Protocols), 3xx (a
          redirect is never followed: the request carries the token) and 4xx/5xx raise
          :class:`HTTPStatusError` (:class:`AuthError` for 401/403) saying what the server answered;
        * a 2xx is returned -- unless ``expect`` names the media type the caller decodes and the
          body is empty (204 included) or of another type: :class:`UnexpectedReply`.
          ``"application/octet-stream"`` (RFC 2046: any binary data) accepts every non-textual
          type and a reply without one; ``"application/json"`` accepts ``*/*+json`` too.
        """
        tok = token or self.scrub_token
        if not 200 <= self.status < 300:
            raise _status_error(self, tok)
        if expect is not None:
            got = self.content_type
            if not self.body or not _media_matches(got, expect):
                raise _unexpected_reply(self, expect, tok)
        return self


def _extract_detail(body: bytes, content_type: str) -> str:
    text = body.decode("utf-8", "replace").strip()
    if content_type.endswith("json") or text.startswith("{"):
        try:
            obj = _json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "detail" in obj:
            d = obj["detail"]
            text = d if isinstance(d, str) else _json.dumps(d, ensure_ascii=False)
    # Made safe (registered secrets out, controls escaped) *before* the cut, so that no token's
    # prefix survives at the cut; the caller scrubs its own token in _scrub.
    return _scrub(text, None)


def _scrub(text: str, token: str | None) -> str:
    """Server text as it may appear in a message: :func:`~genmanip_runtime.text.safe_text` (every
    registered secret and ``token`` in all their forms, controls escaped, one line), then cut to
    about ``_DETAIL_MAX`` characters. Idempotent, so details may pass through it twice."""
    if len(text) > _DETAIL_MAX + 2 * _SCRUB_MARGIN:
        # Only what can be shown is made safe (a huge error body costs no time); the margins keep
        # a token that crosses a cut whole, so that it is scrubbed rather than its prefix shown.
        text = f"{text[: _DETAIL_MAX + _SCRUB_MARGIN]} ... {text[-(_DETAIL_MAX + _SCRUB_MARGIN):]}"
    text = safe_text(text, tokens=(token,))
    if len(text) > _DETAIL_MAX:
        # Remote tracebacks (RayTaskError) are long; the head names the error, the tail its cause.
        text = f"{text[: _DETAIL_MAX - 200]} ... {text[-180:]}"
    return text


def _media_matches(got: str, expect: str) -> bool:
    if got == expect:
        return True
    if expect == "application/octet-stream":
        # The generic binary type: whatever a binary wire is labelled (or not), but never a page
        # or a document (an HTML error page, a JSON error, plain text from a proxy).
        return not (got.startswith(("text/", "multipart/"))
                    or got.endswith(("json", "xml", "html", "javascript")))
    return expect.endswith("/json") and got.endswith("+json")


def _snippet(body: bytes, token: str | None) -> str:
    text = safe_text(body[: _SNIPPET * 4].decode("utf-8", "replace"), tokens=(token,))
    return text[:_SNIPPET] + ("..." if len(text) > _SNIPPET or len(body) > _SNIPPET * 4 else "")


def _reason(resp: Response, token: str | None) -> str:
    # The reason phrase is the server's text too (a hostile one puts escapes or the token there).
    reason = safe_text(resp.reason, limit=_REASON_MAX, tokens=(token,)) if resp.reason else ""
    return reason or http.client.responses.get(resp.status, "")


_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)


def _html_page(resp: Response) -> str | None:
    """``"an HTML page"`` (with its title) when the body is one, else None: never quoted whole."""
    head = resp.body[:512].lstrip().lower()
    if not (resp.content_type in ("text/html", "application/xhtml+xml")
            or head.startswith((b"<!doctype html", b"<html"))):
        return None
    m = _TITLE.search(resp.body[:4096])
    title = safe_text(m.group(1).decode("utf-8", "replace").strip(), limit=60) if m else ""
    return f"an HTML page titled {title!r}" if title else "an HTML page"


#: Statuses that say something about the request or a gateway rather than about which server this
#: is: an HTML page with one of them is a proxy's or a login's, not proof of a wrong server.
_NOT_IDENTIFYING = frozenset({401, 403, 407, 429, 502, 503, 504})


def _not_service_text(service: str) -> str:
    return (f"this does not look like {service} (GET /docs on the server shows what it is; "
            "a GenManip eval server answers JSON, not HTML pages)")


def _unexpected_reply(resp: Response, expect: str, token: str | None) -> UnexpectedReply:
    got = resp.content_type
    page = _html_page(resp) if resp.body else None
    if not resp.body:
        sent = "an empty body"
    elif page is not None:
        sent = f"{page} ({len(resp.body):,} bytes)"
    else:
        shown = safe_text(got, limit=_REASON_MAX) if got else "no Content-Type"
        sent = f"{shown} ({len(resp.body):,} bytes, starting {_snippet(resp.body, token)!r})"
    msg = (f"{resp.method} {resp.route}: the server answered HTTP {resp.status} "
           f"{_reason(resp, token)} with {sent}, expected {expect}")
    if resp.service:
        msg += ": " + (_not_service_text(resp.service) if page is not None
                       else f"this does not look like {resp.service}")
    err = UnexpectedReply(
        msg, status=resp.status, content_type=got, expected=expect, route=resp.route,
        hint="check the URL: is it the server itself (not a proxy's login or error page)?",
    )
    err.not_service = resp.service is not None and page is not None
    return err


def _status_error(resp: Response, token: str | None) -> HTTPStatusError:
    page = _html_page(resp)
    # An HTML page is never dumped into a message (it is a page, not an error text).
    detail = page or _scrub(resp.detail(), token)
    status = resp.status
    msg = f"{resp.method} {resp.route} failed: HTTP {status} {_reason(resp, token)}".rstrip()
    hint: str | None = None
    not_service = False
    if page is not None and resp.service and 400 <= status and status not in _NOT_IDENTIFYING:
        # A wrong port (gmp viz, a web server): say so instead of blaming the server.
        not_service = True
        msg += f" with {page}: {_not_service_text(resp.service)}"
        hint = "check --url / --host / --port: they name some other web server"
        detail = ""
    if 300 <= status < 400:
        location = resp.headers.get("location")
        if location:
            # Never followed: the request carries the token, and a GenManip server never
            # redirects; the target is named so that the user can decide.
            detail = safe_text(location, limit=200, tokens=(token,))
            msg += f", a redirect to {detail!r} (not followed: the request carries credentials)"
            hint = "if that address is the right server, pass it instead (--url / --base-url / --host)"
        else:
            msg += ", expected a 2xx reply"
            if detail:
                msg += f": {detail}"
    elif status < 200:
        msg += ", an interim reply with no final reply after it"
    elif detail:
        msg += f": {detail}"
    if resp.service and status < 400:
        msg += f"; this does not look like {resp.service}"
    kwargs: dict[str, Any] = {
        "status": status,
        "detail": detail,
        "route": resp.route,
        "sent": True,
        # A 4xx means the server refused the request; a 5xx (504 included) may have acted on it;
        # so may one that answered "still processing" (1xx); a redirect came before any work.
        "maybe_executed": status >= 500 or status < 200,
    }
    if hint is not None:
        kwargs["hint"] = hint
    if resp.status in (401, 403):
        env = f"${resp.token_env}" if resp.token_env else "the token environment variable"
        if token:
            hint = (f"the token was rejected: check the one in {env}, the config file "
                    "(token / token_file) or --token")
        else:
            hint = (f"the server wants a token and none was sent: set {env}, add token or "
                    "token_file to the config file, or pass --token")
        return AuthError(msg, hint=hint, **kwargs)
    err = HTTPStatusError(msg, **kwargs)
    err.not_service = not_service
    return err


class HttpTransport:
    """A keep-alive HTTP(S) client for one server.

    Args:
        base_url: ``http://host:port`` or ``https://host[:port]/prefix``; request paths are
            appended to it.
        token: bearer token sent as ``Authorization: Bearer ...``; never shown.
        timeout: default per-call limit in seconds: a deadline for the whole exchange (connect,
            send, status line, headers and body), not per socket operation.
        ca_file: extra PEM CA bundle to trust for ``https`` (verification is always on).
        headers: headers sent with every request.
        user_agent: the ``User-Agent`` header.
        connect_timeout: limit for establishing the connection (default ``min(timeout, 10)``),
            within the call's deadline.
        max_reply_bytes: default largest reply body accepted (:data:`DEFAULT_MAX_REPLY_BYTES`).
        service: what the server should be, e.g. ``"a GenManip eval server"``: named in the
            error about a reply that is not one's (a redirect, an HTML page). Said in full once
            per transport; later errors from the same server refer to it briefly.
        token_env: the environment variable the token is read from (``"GMP_TOKEN"``): named in
            the hint of a 401/403.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        ca_file: str | os.PathLike[str] | None = None,
        headers: Mapping[str, str] | None = None,
        user_agent: str = f"gmp/{__version__}",
        connect_timeout: float | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        service: str | None = None,
        token_env: str | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https"):
            raise ConfigError(
                f"server URL must start with http:// or https://, got {parts.scheme or 'no scheme'!r}"
            )
        if parts.username or parts.password:
            raise ConfigError("credentials in the server URL are not supported; use a token")
        if not parts.hostname:
            raise ConfigError(f"server URL has no host: {base_url!r}")
        _check_timeout(timeout)
        _check_max_bytes(max_reply_bytes)
        self.scheme = parts.scheme
        self.host = parts.hostname
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"server URL has an invalid port: {base_url!r}") from None
        self.port = port or (443 if self.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        host_repr = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"{self.scheme}://{host_repr}:{self.port}{self._prefix}"
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout) if connect_timeout else min(self.timeout, 10.0)
        self._token = token or None
        if self._token:
            # Whatever a server echoes of it (a reply, a redirect target) is scrubbed at every
            # output, whoever built this transport (the config's resolve_token does the same).
            register_secret(self._token)
        self._ca_file = os.fspath(ca_file) if ca_file else None
        self._ssl: ssl.SSLContext | None = None
        if self.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=self._ca_file)
        elif ca_file:
            _log.debug("ca_file ignored for plain http:// URL %s", self.base_url)
        self._headers: dict[str, str] = {"User-Agent": user_agent, "Accept": "*/*"}
        if headers:
            self._headers.update(headers)
        self.max_reply_bytes = int(max_reply_bytes)
        self.service = service
        self.token_env = token_env
        self._said_not_service = False
        self._conn: http.client.HTTPConnection | None = None
        # The current call's deadline, read by every connection's reply parser before each recv.
        self._deadline = _Deadline()
        self._response_class = _response_class(self._deadline)
        self._last_used = 0.0
        self._exchanges = 0  # completed exchanges on the current connection
        self._lock = threading.RLock()
        self._init_abort()
        #: Connections opened so far (1 + reconnects); for diagnostics and tests.
        self.connections_opened = 0
        # Evaluation servers often run on a private network without TLS (as the reference client
        # expects), so a token over plain HTTP is warned about, not refused; once per URL.
        check_plain_http(self.base_url, has_token=self._token is not None, mode="warn",
                         what="server URL")

    # -- public API ----------------------------------------------------------------------------

    @property
    def has_token(self) -> bool:
        """Whether requests carry an ``Authorization`` header."""
        return self._token is not None

    def set_header(self, name: str, value: str | None) -> None:
        """Set (or with ``None`` remove) a header sent with every later request."""
        with self._lock:
            if value is None:
                self._headers.pop(name, None)
            else:
                self._headers[name] = value

    def abort(self) -> None:
        """End the request in progress now and refuse every later one, until :meth:`rearm`.

        Callable from any thread, idempotent. The socket of the exchange in progress is shut down,
        so a blocked connect, send or receive returns at once; that call, and every later call of
        this transport, raises :class:`~genmanip_runtime.errors.RequestAborted` (its ``sent`` and
        ``maybe_executed`` say whether the request may have reached the server). A reply already
        read whole is returned normally.
        """
        with self._sock_lock:
            self._aborted.set()
            for sock in (self._connecting, self._conn.sock if self._conn is not None else None):
                if sock is None:
                    continue
                try:
                    # (the base class's shutdown: an SSLSocket's would also drop its TLS state,
                    # which the thread reading through it still uses)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except (OSError, ValueError):
                    pass  # not connected yet, or already closed

    def rearm(self) -> None:
        """Accept requests again after :meth:`abort` (the next one opens a new connection)."""
        with self._sock_lock:
            self._aborted.clear()

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called (and not followed by :meth:`rearm`)."""
        return self._aborted.is_set()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | bytearray | memoryview | None = None,
        content_type: str | None = None,
        json: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        route_name: str | None = None,
        idempotent: bool = False,
        raise_for_status: bool = True,
        expect: str | None = None,
        max_reply_bytes: int | None = None,
    ) -> Response:
        """Send one request and read the whole reply.

        Args:
            method: ``GET``, ``POST``, ...
            path: route below the base URL (``/step``).
            body: raw request body; ``json``: an object to send as JSON instead.
            query: query parameters (``None`` values are left out).
            timeout: this call's deadline in seconds, for the whole exchange (default: the
                transport's); a resend after a dead reused connection stays within it.
            route_name: name used in errors (default: ``path``).
            idempotent: the call may be resent once if a reused connection turns out dead
                before any reply byte arrived. Never set it for ``/step``-like calls.
            raise_for_status: judge the reply (:meth:`Response.raise_for_status`: anything but
                2xx raises; default) or return it for the caller to inspect.
            expect: the media type the caller decodes; with ``raise_for_status`` a 2xx reply of
                another type, or with an empty body, raises :class:`UnexpectedReply`.
            max_reply_bytes: largest reply body accepted (default: the transport's).

        Raises:
            ConnectError: could not connect (nothing was sent).
            RequestTimeout: no complete reply within ``timeout``; names route and limit.
            ResponseTooLarge: the body is larger than ``max_reply_bytes`` (not read).
            TransportError: the connection failed mid-call (``maybe_executed`` is true).
            HTTPStatusError, AuthError, UnexpectedReply: when ``raise_for_status``.
        """
        if json is not None:
            if body is not None:
                raise TypeError("pass body or json, not both")
            body = _json.dumps(json, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        route = route_name or path
        limit = self.timeout if timeout is None else _check_timeout(float(timeout))
        max_bytes = self.max_reply_bytes if max_reply_bytes is None else _check_max_bytes(max_reply_bytes)
        target = self._target(path, query)
        hdrs = self._request_headers(headers, content_type, body)
        payload = bytes(body) if isinstance(body, (bytearray, memoryview)) else body

        with self._lock:
            self._deadline.start(limit)
            attempt = 0
            while True:
                attempt += 1
                self._check_aborted(method, route)
                reused = self._prepare(route)
                t0 = time.perf_counter()
                try:
                    resp = self._exchange(method, target, hdrs, payload, max_bytes)
                except _EarlyFailure as exc:
                    # The connection died before any reply byte. On a reused connection this is
                    # usually the server having closed it just now: resend once if allowed.
                    self._drop()
                    self._check_aborted(method, route, exc.cause, sent=True)
                    if reused and idempotent and attempt == 1:
                        _log.debug("%s %s: reused connection was dead (%s); resending",
                                   method, route, exc.cause)
                        continue
                    raise TransportError(
                        f"{method} {route}: connection to {self.base_url} lost before a reply "
                        f"({_describe(exc.cause)})",
                        route=route,
                        sent=True,
                        maybe_executed=True,
                        hint=None if idempotent else "the server may have executed the request; "
                        "it was not resent",
                    ) from exc.cause
                except _TooLarge as exc:
                    self._drop()
                    raise exc.error(method, route, max_bytes) from None
                except TimeoutError as exc:
                    self._drop()
                    self._check_aborted(method, route, exc, sent=True)
                    raise RequestTimeout(
                        f"{method} {route} timed out after {limit:g} s",
                        timeout=limit,
                        route=route,
                        sent=True,
                        maybe_executed=True,
                    ) from exc
                except (OSError, http.client.HTTPException) as exc:
                    self._drop()
                    self._check_aborted(method, route, exc, sent=True)
                    raise TransportError(
                        f"{method} {route}: connection to {self.base_url} failed while reading "
                        f"the reply ({_describe(exc)})",
                        route=route,
                        sent=True,
                        maybe_executed=True,
                    ) from exc
                except BaseException:
                    # Ctrl-C (or anything else) mid-exchange: the reply may still be on its way,
                    # so this connection can never carry another request.
                    self._drop()
                    raise
                break
            status, reason, rheaders, data, will_close = resp
            elapsed = time.perf_counter() - t0
            self._finished(status, will_close)
        response = Response(status, rheaders, data, elapsed, method, route, reason, self._token,
                            self.service, self.token_env)
        if raise_for_status:
            try:
                response.raise_for_status(expect=expect)
            except TransportError as exc:
                if exc.not_service:
                    if self._said_not_service:
                        # Once is enough: a cleanup call after the first error says it briefly.
                        exc.message = (f"{method} {route} failed: HTTP {status} (the server at "
                                       f"{self.base_url} is not {self.service})")
                        exc.hint = None
                    self._said_not_service = True
                raise
        return response

    def get(self, path: str, **kwargs: Any) -> Response:
        """``request("GET", path, idempotent=True, ...)``."""
        kwargs.setdefault("idempotent", True)
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Response:
        """``request("POST", path, ...)`` (not idempotent unless said so)."""
        return self.request("POST", path, **kwargs)

    def request_multipart(
        self,
        path: str,
        fields: Mapping[str, str],
        files: Mapping[str, tuple[str, str | os.PathLike[str], str]],
        progress: Callable[[int], None] | None = None,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        route_name: str | None = None,
        raise_for_status: bool = True,
        expect: str | None = None,
        max_reply_bytes: int | None = None,
    ) -> Response:
        """Upload ``multipart/form-data``: text ``fields`` and ``files`` streamed from disk.

        ``files`` maps a field name to ``(filename, path, content_type)``. ``progress`` is called
        with the cumulative number of body bytes sent (after each chunk, up to the total). Uploads
        are never resent automatically. ``timeout`` is the deadline of the whole upload and its
        reply; ``raise_for_status``, ``expect`` and ``max_reply_bytes`` as for :meth:`request`.
        """
        route = route_name or path
        limit = self.timeout if timeout is None else _check_timeout(float(timeout))
        max_bytes = self.max_reply_bytes if max_reply_bytes is None else _check_max_bytes(max_reply_bytes)
        boundary = "gmp-" + secrets.token_hex(16)
        pieces: list[bytes | tuple[str, int]] = []
        for name, value in fields.items():
            pieces.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{_quote(name)}"\r\n\r\n'
                .encode()
                + str(value).encode()
                + b"\r\n"
            )
        for name, (filename, fpath, ctype) in files.items():
            p = os.fspath(fpath)
            size = os.stat(p).st_size
            pieces.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{_quote(name)}"; '
                f'filename="{_quote(filename)}"\r\nContent-Type: {ctype}\r\n\r\n'.encode()
            )
            pieces.append((p, size))
            pieces.append(b"\r\n")
        pieces.append(f"--{boundary}--\r\n".encode())
        total = sum(len(x) if isinstance(x, bytes) else x[1] for x in pieces)
        hdrs = self._request_headers(headers, f"multipart/form-data; boundary={boundary}", None)
        hdrs["Content-Length"] = str(total)

        with self._lock:
            self._deadline.start(limit)
            self._check_aborted(method, route)
            self._prepare(route)
            conn = self._conn
            assert conn is not None
            assert conn.sock is not None
            t0 = time.perf_counter()
            sent = 0
            try:
                self._arm(conn)
                conn.putrequest(method, self._target(path, None), skip_accept_encoding=True)
                for k, v in hdrs.items():
                    conn.putheader(k, v)
                conn.endheaders()
                buf = bytearray(_UPLOAD_CHUNK)
                view = memoryview(buf)
                for piece in pieces:
                    if isinstance(piece, bytes):
                        self._arm(conn)
                        conn.send(piece)
                        sent += len(piece)
                    else:
                        with open(piece[0], "rb") as fh:
                            while True:
                                n = fh.readinto(buf)
                                if not n:
                                    break
                                # Each send may wait only for what is left of the deadline: a
                                # server reading a byte at a time is cut at the limit too.
                                self._arm(conn)
                                conn.send(view[:n])
                                sent += n
                                if progress is not None:
                                    progress(sent)
                if progress is not None:
                    progress(sent)
                rhttp = conn.getresponse()
                data = _read_body(rhttp, max_bytes)
            except _TooLarge as exc:
                self._drop()
                raise exc.error(method, route, max_bytes) from None
            except TimeoutError as exc:
                self._drop()
                self._check_aborted(method, route, exc, sent=sent > 0, executed=sent >= total)
                raise RequestTimeout(
                    f"{method} {route} timed out after {limit:g} s ({sent} of {total} bytes sent)",
                    timeout=limit, route=route, sent=sent > 0, maybe_executed=sent >= total,
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                self._check_aborted(method, route, exc, sent=sent > 0, executed=sent >= total)
                raise TransportError(
                    f"{method} {route}: upload to {self.base_url} failed after {sent} of {total} "
                    f"bytes ({_describe(exc)})",
                    route=route, sent=sent > 0, maybe_executed=sent >= total,
                ) from exc
            except BaseException:
                self._drop()  # Ctrl-C mid-upload: this connection cannot carry another request
                raise
            elapsed = time.perf_counter() - t0
            self._finished(rhttp.status, bool(rhttp.will_close))
        response = Response(
            rhttp.status, rhttp.headers, data, elapsed, method, route, rhttp.reason, self._token,
            self.service,
        )
        if raise_for_status:
            response.raise_for_status(expect=expect)
        return response

    def close(self) -> None:
        """Close the connection (a later request opens a new one)."""
        with self._lock:
            self._drop()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        tok = "***" if self._token else None
        return f"HttpTransport({self.base_url!r}, token={tok}, timeout={self.timeout:g})"

    def __getstate__(self) -> dict[str, Any]:
        # Pickling a transport into a worker process must not carry a live socket (nor leak
        # the token into some cache); the child reconnects lazily.
        state = self.__dict__.copy()
        state["_conn"] = None
        state["_lock"] = None
        state["_ssl"] = None
        state["_deadline"] = None
        state["_response_class"] = None  # a class made per transport: not picklable
        for name in ("_aborted", "_sock_lock", "_connecting"):
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._init_abort()
        self._deadline = _Deadline()
        self._response_class = _response_class(self._deadline)
        self._exchanges = 0
        if self.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=self._ca_file)

    # -- internals -----------------------------------------------------------------------------

    def _init_abort(self) -> None:
        self._aborted = threading.Event()
        # Guards the sockets abort() shuts down against their closing (never held during I/O).
        self._sock_lock = threading.Lock()
        self._connecting: socket.socket | None = None

    def _check_aborted(
        self, method: str, route: str, cause: BaseException | None = None, *, sent: bool = False,
        executed: bool | None = None,
    ) -> None:
        """Raise :class:`RequestAborted` if :meth:`abort` was called (``cause``: what the abort
        made the exchange fail with; ``sent``: whether the request may have reached the server)."""
        if not self._aborted.is_set():
            return
        when = "while waiting for the reply" if sent else "before sending"
        raise RequestAborted(
            f"{method} {route}: aborted {when}", route=route, sent=sent,
            maybe_executed=sent if executed is None else executed,
        ) from cause

    def _open_socket(
        self, address: tuple[str, int], timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        """``socket.create_connection`` that :meth:`abort` can cut short (http.client's hook)."""
        host, port = address
        limit = self.connect_timeout if timeout is None else timeout
        last: OSError | None = None
        for af, socktype, proto, _, sa in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(af, socktype, proto)
            with self._sock_lock:
                self._connecting = sock
            try:
                if source_address:
                    sock.bind(source_address)
                sock.setblocking(False)
                end = time.monotonic() + limit
                rc = sock.connect_ex(sa)
                while rc in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY, errno.EINTR):
                    if self._aborted.is_set():
                        raise OSError(errno.ECONNABORTED, "aborted while connecting")
                    left = end - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("timed out while connecting")
                    _, writable, failed = select.select([], [sock], [sock], min(left, _CONNECT_SLICE_S))
                    if writable or failed:
                        rc = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if rc:
                    raise OSError(rc, os.strerror(rc))
                sock.settimeout(limit)
                return sock
            except TimeoutError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                last = exc
                if self._aborted.is_set():
                    break
            finally:
                with self._sock_lock:
                    self._connecting = None
        raise last if last is not None else OSError(f"no address for {host!r}")

    def _target(self, path: str, query: Mapping[str, Any] | None) -> str:
        if not path.startswith("/"):
            path = "/" + path
        target = self._prefix + path
        if query:
            q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
            if q:
                target += ("&" if "?" in target else "?") + q
        return target

    def _request_headers(
        self, extra: Mapping[str, str] | None, content_type: str | None,
        body: bytes | bytearray | memoryview | None,
    ) -> dict[str, str]:
        hdrs = dict(self._headers)
        if self._token:
            hdrs["Authorization"] = f"Bearer {self._token}"
        if extra:
            hdrs.update(extra)
        if content_type:
            hdrs["Content-Type"] = content_type
        if body is not None:
            hdrs["Content-Length"] = str(len(body))
        return hdrs

    def _prepare(self, route: str) -> bool:
        """Make sure a usable connection exists; return True when it is a reused one."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            idle = time.monotonic() - self._last_used
            if idle > IDLE_RECONNECT_S or _peer_closed(conn.sock):
                _log.debug("reconnecting to %s (idle %.1f s or closed by peer)", self.base_url, idle)
                self._drop()
            else:
                return self._exchanges > 0
        elif conn is not None:
            self._drop()
        self._connect(route)
        return False

    def _connect(self, route: str) -> None:
        # Connecting is part of the call's deadline (a resend after a dead connection included).
        wait = min(self.connect_timeout, self._deadline.remaining())
        if wait <= 0:
            raise RequestTimeout(
                f"{route} timed out after {self._deadline.limit:g} s (before connecting)",
                timeout=self._deadline.limit, route=route,
            )
        conn: http.client.HTTPConnection
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=wait, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=wait)
        # Replies are parsed through the deadline-bound reader (see _DeadlineResponse); the
        # connect can be cut short by abort() (http.client's hook, stable since Python 3.0).
        conn.response_class = self._response_class
        conn._create_connection = self._open_socket  # type: ignore[attr-defined]
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            err = ConnectError(
                f"cannot connect to {self.base_url}: TLS certificate not trusted "
                f"({exc.verify_message})",
                route=route,
                hint="pass the server's CA certificate (--ca-cert FILE); verification stays on",
            )
            err.retryable = False
            raise err from exc
        except ssl.SSLError as exc:
            conn.close()
            raise self._tls_failed(route, exc) from exc
        except TimeoutError as exc:
            conn.close()
            raise ConnectError(
                f"cannot connect to {self.base_url}: no answer within {wait:g} s",
                route=route,
            ) from exc
        except OSError as exc:
            conn.close()
            self._check_aborted("connect", route, exc)
            raise ConnectError(
                f"cannot connect to {self.base_url} ({_describe(exc)})",
                route=route,
                hint="is the server running? check --url / --host / --port",
            ) from exc
        assert conn.sock is not None
        try:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not TCP (tests may use other sockets); nothing to tune
            pass
        self._conn = conn
        self._exchanges = 0
        self._last_used = time.monotonic()
        self.connections_opened += 1

    def _tls_failed(self, route: str, exc: ssl.SSLError) -> ConnectError:
        """The error of a failed TLS handshake; says so when the server speaks plain HTTP."""
        plain = _speaks_plain_http(self.host, self.port, min(self.connect_timeout, 3.0))
        if plain:
            err = ConnectError(
                f"cannot connect to {self.base_url}: the server speaks plain HTTP, not HTTPS "
                "(the TLS handshake got an HTTP reply)",
                route=route,
                hint=f"use http://{self.base_url.split('://', 1)[1]} (the server has no TLS), "
                "or give the server a certificate",
            )
        else:
            err = ConnectError(
                f"cannot connect to {self.base_url}: TLS handshake failed ({_describe(exc)})",
                route=route,
                hint="is it an https:// server? check --url",
            )
        err.retryable = False
        return err

    def _arm(self, conn: http.client.HTTPConnection) -> None:
        """Let the next socket operation wait only for what is left of the call's deadline."""
        left = self._deadline.remaining()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        assert conn.sock is not None
        conn.sock.settimeout(left)

    def _finished(self, status: int, will_close: bool) -> None:
        """Book-keeping after a reply was read whole."""
        self._last_used = time.monotonic()
        self._exchanges += 1
        # After a 1xx that is not followed by a final reply (101 Switching Protocols) the
        # connection no longer speaks HTTP/1.1 to us.
        if will_close or status < 200:
            self._drop()

    def _exchange(
        self, method: str, target: str, hdrs: dict[str, str], body: bytes | None, max_bytes: int
    ) -> tuple[int, str, http.client.HTTPMessage, bytes, bool]:
        conn = self._conn
        assert conn is not None and conn.sock is not None
        try:
            # sendall() under a timeout bounds the whole send (Python >= 3.5), so one arming
            # covers the request; the reply's every recv is armed by _DeadlineReader.
            self._arm(conn)
            conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            if body is not None and len(body) <= _SINGLE_SEND_MAX:
                # http.client appends a bytes body to the header block: one send, no Nagle stall.
                conn.endheaders(body)
            else:
                conn.endheaders()
                if body is not None:
                    conn.sock.sendall(body)
        except TimeoutError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise _EarlyFailure(exc) from exc
        if _QUICKACK is not None:
            # Linux delays ACKs of a reply that arrives in several segments after the connection
            # was idle; the sender then stalls ~40 ms per request. Quick-ACK mode (not sticky:
            # set again per request) removes the stall. (Added by the eval helper, see report.)
            try:
                conn.sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass
        try:
            resp = conn.getresponse()
        except TimeoutError:
            raise
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
            # Closed without a single reply byte: the request may not have been processed.
            raise _EarlyFailure(exc) from exc
        data = _read_body(resp, max_bytes)
        return resp.status, resp.reason, resp.headers, data, bool(resp.will_close)

    def _drop(self) -> None:
        with self._sock_lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except OSError:
                    pass
            self._conn = None
        self._exchanges = 0


class _EarlyFailure(Exception):
    """The connection failed before any byte of the reply arrived."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _TooLarge(Exception):
    """The reply body passed the call's limit (``declared``: its Content-Length, if any)."""

    def __init__(self, status: int, declared: int | None) -> None:
        super().__init__(status, declared)
        self.status = status
        self.declared = declared

    def error(self, method: str, route: str, limit: int) -> ResponseTooLarge:
        if self.declared is not None:
            what = f"declares {self.declared:,} bytes (Content-Length)"
        else:
            what = "passed that size (chunked or read until close; the rest was not read)"
        return ResponseTooLarge(
            f"{method} {route}: the reply (HTTP {self.status}) is larger than the {limit:,}-byte "
            f"limit: it {what}",
            limit=limit, declared=self.declared, status=self.status, route=route,
            # the server answered: it may have acted, unless it refused (4xx)
            maybe_executed=not 400 <= self.status < 500,
        )


class _Deadline:
    """The end of the current call on a transport (``time.monotonic()`` seconds) and its limit."""

    __slots__ = ("at", "limit")

    def __init__(self) -> None:
        self.at = math.inf
        self.limit = math.inf

    def start(self, limit: float) -> None:
        self.limit = limit
        self.at = time.monotonic() + limit

    def remaining(self) -> float:
        return self.at - time.monotonic()


class _DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose every ``recv`` waits at most until the deadline.

    http.client reads the status line and the headers line by line and a body in large reads; a
    per-recv timeout never fires while a server sends one byte per second. Arming each recv with
    what is left of the call makes the call's limit a deadline for all of it. Does not own the
    socket: it reads through the socket's own raw file (``makefile``), which keeps the socket open
    until the reply is read even when http.client closes the connection right after the headers
    (``Connection: close``), exactly as http.client's own reader does.
    """

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        left = self._deadline.remaining()
        if left <= 0:
            raise TimeoutError("the call's deadline passed while reading the reply")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's reply parser, reading through :class:`_DeadlineReader`.

    Also: interim replies other than ``100 Continue`` (102, 103) are skipped like 100 is, and a
    negative chunk size is refused (``int("-1", 16)`` would make http.client read until the peer
    closes, without any bound).
    """

    deadline: _Deadline  # set by _response_class

    def __init__(
        self, sock: socket.socket, debuglevel: int = 0, method: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(sock, debuglevel, method, url)
        reader = _DeadlineReader(sock, self.deadline)
        self.fp.close()  # http.client's reader, replaced before a byte was read
        self.fp = io.BufferedReader(reader, _READ_BUFFER)

    # http.client's private hooks: stable since Python 3.0 (the only way to change how the
    # status line and the chunk sizes are read without copying the parser).
    def _read_status(self) -> tuple[str, int, str]:
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 101 < status < 200:
                return version, status, reason
            # RFC 9110 15.2: a client must accept interim replies before the final one. Their
            # headers are read like any (at most 100 lines of 64 KiB), an endless run of them is
            # cut by the deadline.
            http.client.parse_headers(self.fp)

    def _read_next_chunk_size(self) -> int:
        size: int = super()._read_next_chunk_size()  # type: ignore[misc]
        if size < 0:
            raise ValueError(f"negative chunk size {size}")  # -> IncompleteRead
        return size


def _response_class(deadline: _Deadline) -> type[http.client.HTTPResponse]:
    """A reply parser class bound to one transport's deadline (http.client builds the reply)."""
    return type("_TransportResponse", (_DeadlineResponse,), {"deadline": deadline})


def _read_body(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The whole body, never more than ``max_bytes``: refused from ``Content-Length`` before
    anything is allocated, otherwise (chunked, read until close) read in bounded pieces."""
    declared = resp.length  # None when chunked or delimited by the close
    if declared is not None:
        if declared > max_bytes:
            raise _TooLarge(resp.status, declared)
        return resp.read()  # one read: the fast path of every GenManip reply
    parts: list[bytes] = []
    total = 0
    while True:
        piece = resp.read(min(_READ_PIECE, max_bytes + 1 - total))
        if not piece:
            return b"".join(parts)
        parts.append(piece)
        total += len(piece)
        if total > max_bytes:
            raise _TooLarge(resp.status, None)


def _check_timeout(timeout: float) -> float:
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def _check_max_bytes(max_bytes: int) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ConfigError(f"max_reply_bytes must be an int >= 0, got {max_bytes!r}")
    return max_bytes


def _speaks_plain_http(host: str, port: int, timeout: float) -> bool:
    """Does ``host:port`` answer a plain ``HEAD / HTTP/1.0`` with an HTTP status line? (Asked only
    after a TLS handshake failed: it tells "https:// to a plain-HTTP server" from other failures.)"""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"HEAD / HTTP/1.0\r\nHost: " + host.encode("ascii", "ignore") + b"\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/")
    except (OSError, UnicodeError):
        return False


def _peer_closed(sock: socket.socket) -> bool:
    """True when the idle socket is readable (EOF or unexpected data) or already broken."""
    try:
        readable, _, errored = select.select([sock], [], [sock], 0)
    except (OSError, ValueError):
        return True
    return bool(readable or errored)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, http.client.RemoteDisconnected):
        return "server closed the connection without replying"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"host name not found: {exc.strerror or exc}"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _quote(value: str) -> str:
    # The HTML form encoding of names in Content-Disposition: no raw quotes or line breaks.
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
