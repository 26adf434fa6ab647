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
* the bearer token never appears in ``repr``, errors or logs, and TLS verification cannot be
  turned off (an extra CA file can be trusted instead).

An :class:`HttpTransport` is safe to share between threads, but calls are serialised on its one
connection: give each worker thread its own transport for parallelism.
"""

from __future__ import annotations

import http.client
import json as _json
import logging
import os
import secrets
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from genmanip_protocol.errors import ConfigError, DecodeError

from .__about__ import __version__
from .errors import AuthError, ConnectError, HTTPStatusError, RequestTimeout, TransportError
from .netpolicy import check_plain_http

__all__ = ["HttpTransport", "Response", "build_base_url"]

_log = logging.getLogger(__name__)

#: Reconnect before sending when the connection has been idle this long: uvicorn's keep-alive
#: timeout is 5 s, and a request racing the server's close would fail mid-flight.
IDLE_RECONNECT_S = 4.0
#: Bodies up to this size are appended to the header block and leave in one ``send``.
_SINGLE_SEND_MAX = 256 * 1024
_DETAIL_MAX = 600
_UPLOAD_CHUNK = 1024 * 1024

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)

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
            return _json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            snippet = self.body[:80].decode("utf-8", "replace")
            raise DecodeError(
                f"{self.method} {self.route}: reply is not JSON ({exc.__class__.__name__}: "
                f"{exc}); body starts {snippet!r}",
                codec="json",
            ) from None

    def detail(self) -> str:
        """The server's error text: ``{"detail": ...}`` of a JSON body, else the text body."""
        return _scrub(_extract_detail(self.body, self.content_type), self.scrub_token)

    def raise_for_status(self, *, token: str | None = None) -> Response:
        """Raise :class:`HTTPStatusError` (:class:`AuthError` for 401/403) unless 2xx/3xx."""
        if self.status >= 400:
            raise _status_error(self, token or self.scrub_token)
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
    if len(text) > _DETAIL_MAX:
        # Remote tracebacks (RayTaskError) are long; the head names the error, the tail its cause.
        text = f"{text[: _DETAIL_MAX - 200]} ... {text[-180:]}"
    return text


def _scrub(text: str, token: str | None) -> str:
    if token and token in text:
        text = text.replace(token, "***")
    return text


def _status_error(resp: Response, token: str | None) -> HTTPStatusError:
    detail = _scrub(resp.detail(), token)
    reason = resp.reason or http.client.responses.get(resp.status, "")
    msg = f"{resp.method} {resp.route} failed: HTTP {resp.status} {reason}".rstrip()
    if detail:
        msg += f": {detail}"
    kwargs: dict[str, Any] = {
        "status": resp.status,
        "detail": detail,
        "route": resp.route,
        "sent": True,
        # A 4xx means the server refused the request; a 5xx (504 included) may have acted on it.
        "maybe_executed": resp.status >= 500,
    }
    if resp.status in (401, 403):
        return AuthError(
            msg,
            hint="the token is missing or was rejected: pass --token, set the token environment "
            "variable, or add it to the config file",
            **kwargs,
        )
    return HTTPStatusError(msg, **kwargs)


class HttpTransport:
    """A keep-alive HTTP(S) client for one server.

    Args:
        base_url: ``http://host:port`` or ``https://host[:port]/prefix``; request paths are
            appended to it.
        token: bearer token sent as ``Authorization: Bearer ...``; never shown.
        timeout: default per-call limit in seconds (per socket operation while waiting).
        ca_file: extra PEM CA bundle to trust for ``https`` (verification is always on).
        headers: headers sent with every request.
        user_agent: the ``User-Agent`` header.
        connect_timeout: limit for establishing the connection (default ``min(timeout, 10)``).
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
        if timeout is None or timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
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
        self._ca_file = os.fspath(ca_file) if ca_file else None
        self._ssl: ssl.SSLContext | None = None
        if self.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=self._ca_file)
        elif ca_file:
            _log.debug("ca_file ignored for plain http:// URL %s", self.base_url)
        self._headers: dict[str, str] = {"User-Agent": user_agent, "Accept": "*/*"}
        if headers:
            self._headers.update(headers)
        self._conn: http.client.HTTPConnection | None = None
        self._last_used = 0.0
        self._exchanges = 0  # completed exchanges on the current connection
        self._lock = threading.RLock()
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
    ) -> Response:
        """Send one request and read the whole reply.

        Args:
            method: ``GET``, ``POST``, ...
            path: route below the base URL (``/step``).
            body: raw request body; ``json``: an object to send as JSON instead.
            query: query parameters (``None`` values are left out).
            timeout: this call's limit in seconds (default: the transport's).
            route_name: name used in errors (default: ``path``).
            idempotent: the call may be resent once if a reused connection turns out dead
                before any reply byte arrived. Never set it for ``/step``-like calls.
            raise_for_status: raise :class:`HTTPStatusError` for 4xx/5xx (default) or return
                the response for the caller to inspect.

        Raises:
            ConnectError: could not connect (nothing was sent).
            RequestTimeout: no reply within ``timeout``; the message names route and limit.
            TransportError: the connection failed mid-call (``maybe_executed`` is true).
            HTTPStatusError, AuthError: 4xx/5xx when ``raise_for_status``.
        """
        if json is not None:
            if body is not None:
                raise TypeError("pass body or json, not both")
            body = _json.dumps(json, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        route = route_name or path
        limit = self.timeout if timeout is None else float(timeout)
        target = self._target(path, query)
        hdrs = self._request_headers(headers, content_type, body)
        payload = bytes(body) if isinstance(body, (bytearray, memoryview)) else body

        with self._lock:
            attempt = 0
            while True:
                attempt += 1
                reused = self._prepare(route)
                t0 = time.perf_counter()
                try:
                    resp = self._exchange(method, target, hdrs, payload, limit)
                except _EarlyFailure as exc:
                    # The connection died before any reply byte. On a reused connection this is
                    # usually the server having closed it just now: resend once if allowed.
                    self._drop()
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
                except TimeoutError as exc:
                    self._drop()
                    raise RequestTimeout(
                        f"{method} {route} timed out after {limit:g} s",
                        timeout=limit,
                        route=route,
                        sent=True,
                        maybe_executed=True,
                    ) from exc
                except (OSError, http.client.HTTPException) as exc:
                    self._drop()
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
            self._last_used = time.monotonic()
            self._exchanges += 1
            if will_close:
                self._drop()
        response = Response(status, rheaders, data, elapsed, method, route, reason, self._token)
        if raise_for_status and status >= 400:
            raise _status_error(response, self._token)
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
    ) -> Response:
        """Upload ``multipart/form-data``: text ``fields`` and ``files`` streamed from disk.

        ``files`` maps a field name to ``(filename, path, content_type)``. ``progress`` is called
        with the cumulative number of body bytes sent (after each chunk, up to the total). Uploads
        are never resent automatically.
        """
        route = route_name or path
        limit = self.timeout if timeout is None else float(timeout)
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
            self._prepare(route)
            conn = self._conn
            assert conn is not None
            assert conn.sock is not None
            conn.sock.settimeout(limit)
            t0 = time.perf_counter()
            sent = 0
            try:
                conn.putrequest(method, self._target(path, None), skip_accept_encoding=True)
                for k, v in hdrs.items():
                    conn.putheader(k, v)
                conn.endheaders()
                buf = bytearray(_UPLOAD_CHUNK)
                view = memoryview(buf)
                for piece in pieces:
                    if isinstance(piece, bytes):
                        conn.send(piece)
                        sent += len(piece)
                    else:
                        with open(piece[0], "rb") as fh:
                            while True:
                                n = fh.readinto(buf)
                                if not n:
                                    break
                                conn.send(view[:n])
                                sent += n
                                if progress is not None:
                                    progress(sent)
                if progress is not None:
                    progress(sent)
                rhttp = conn.getresponse()
                data = rhttp.read()
            except TimeoutError as exc:
                self._drop()
                raise RequestTimeout(
                    f"{method} {route} timed out after {limit:g} s ({sent} of {total} bytes sent)",
                    timeout=limit, route=route, sent=sent > 0, maybe_executed=sent >= total,
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise TransportError(
                    f"{method} {route}: upload to {self.base_url} failed after {sent} of {total} "
                    f"bytes ({_describe(exc)})",
                    route=route, sent=sent > 0, maybe_executed=sent >= total,
                ) from exc
            elapsed = time.perf_counter() - t0
            self._last_used = time.monotonic()
            self._exchanges += 1
            if rhttp.will_close:
                self._drop()
        response = Response(
            rhttp.status, rhttp.headers, data, elapsed, method, route, rhttp.reason, self._token
        )
        if raise_for_status and response.status >= 400:
            raise _status_error(response, self._token)
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
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._exchanges = 0
        if self.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=self._ca_file)

    # -- internals -----------------------------------------------------------------------------

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
        conn: http.client.HTTPConnection
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.connect_timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise ConnectError(
                f"cannot connect to {self.base_url}: TLS certificate not trusted "
                f"({exc.verify_message})",
                route=route,
                hint="pass the server's CA certificate (--ca-cert FILE); verification stays on",
            ) from exc
        except TimeoutError as exc:
            conn.close()
            raise ConnectError(
                f"cannot connect to {self.base_url}: no answer within {self.connect_timeout:g} s",
                route=route,
            ) from exc
        except OSError as exc:
            conn.close()
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

    def _exchange(
        self, method: str, target: str, hdrs: dict[str, str], body: bytes | None, limit: float
    ) -> tuple[int, str, http.client.HTTPMessage, bytes, bool]:
        conn = self._conn
        assert conn is not None and conn.sock is not None
        conn.sock.settimeout(limit)
        try:
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
        data = resp.read()
        return resp.status, resp.reason, resp.headers, data, bool(resp.will_close)

    def _drop(self) -> None:
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
