"""The one connection of an :class:`~genmanip_runtime.transport.HttpTransport`: everything that
touches its socket.

This room owns:

* opening it (``TCP_NODELAY``, TLS with verification always on, a connect that
  :meth:`_Connection.abort` can cut short) within the call's deadline, and the
  :class:`~genmanip_runtime.errors.ConnectError` of a failed one (refused, not answering, an
  untrusted certificate, ``https://`` to a plain-HTTP server);
* reusing it: a connection idle longer than :data:`IDLE_RECONNECT_S` or closed by the peer is
  replaced *before* anything is sent, and one that can no longer carry a request is dropped;
* the call's deadline (:class:`_Deadline`): every socket operation waits only for what is left of
  it -- each send through :meth:`_Connection.arm`, each ``recv`` of the reply through the
  deadline-bound reply parser (:class:`_DeadlineResponse`) installed on every connection;
* one exchange on it (:meth:`_Connection.exchange`): the request written (a small one in a single
  ``send``), the reply read whole, its body bounded (:class:`_TooLarge`), and a connection that
  died before any reply byte told apart (:class:`_EarlyFailure`);
* abort from any thread: :meth:`_Connection.abort` shuts the socket down and
  :meth:`_Connection.check_aborted` turns that into
  :class:`~genmanip_runtime.errors.RequestAborted`.

What a request carries, whether it may be resent, and what a failed exchange says are
:mod:`genmanip_runtime.transport`'s (a failed connect is told here).
"""

from __future__ import annotations

import errno
import http.client
import io
import logging
import math
import os
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ConnectError, RequestAborted, RequestTimeout, ResponseTooLarge

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "IDLE_RECONNECT_S",
    "_Connection",
    "_Deadline",
    "_EarlyFailure",
    "_TooLarge",
    "_Upload",
    "_describe",
]

# The transport's logger, as before this room was split from it (filters name it).
_log = logging.getLogger("genmanip_runtime.transport")

#: Reconnect before sending when the connection has been idle this long: uvicorn's keep-alive
#: timeout is 5 s, and a request racing the server's close would fail mid-flight.
IDLE_RECONNECT_S = 4.0
#: Buffer of the deadline-bound reader: one ``recv`` takes a small reply and its headers whole.
_READ_BUFFER = 64 * 1024
#: How often a connect in progress looks at the abort flag (a connect is otherwise instantaneous
#: on a reachable host; this bounds how long an abort waits for one to a black-holed address).
_CONNECT_SLICE_S = 0.05
#: Bodies up to this size are appended to the header block and leave in one ``send``.
_SINGLE_SEND_MAX = 256 * 1024
#: A chunked or read-until-close body is read in pieces of this size (each bounded by the limit).
_READ_PIECE = 1024 * 1024
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class _Upload(Protocol):
    """A request body that sends itself after the header block (the transport's multipart
    upload), arming each send (:meth:`_Connection.arm`)."""

    def send(self, connection: _Connection) -> None: ...


class _Connection:
    """A keep-alive connection to ``host:port``, opened on demand and replaced when it went stale.

    :attr:`http` is the ``http.client`` connection (``None`` until the next :meth:`prepare`).
    The transport calls every method under its own lock, so one call uses it at a time; only
    :meth:`abort`, :meth:`rearm` and :attr:`aborted` are for any thread.
    """

    def __init__(
        self, *, host: str, port: int, base_url: str, tls: bool, ca_file: str | None,
        connect_timeout: float,
    ) -> None:
        self.host = host
        self.port = port
        self.base_url = base_url  # named by every connect error
        self.connect_timeout = connect_timeout
        self._tls = tls
        self._ca_file = ca_file
        if not tls and ca_file:
            _log.debug("ca_file ignored for plain http:// URL %s", base_url)
        self.last_used = 0.0
        #: Connections opened so far (1 + reconnects); for diagnostics and tests.
        self.opened = 0
        self._init_live()

    def _init_live(self) -> None:
        """The parts that cannot be pickled, made anew in a copy unpickled in a worker process."""
        self._ssl = ssl.create_default_context(cafile=self._ca_file) if self._tls else None
        self.http: http.client.HTTPConnection | None = None
        self.exchanges = 0  # completed exchanges on the current connection
        # The current call's deadline, read by every connection's reply parser before each recv.
        self.deadline = _Deadline()
        self._response_class = _response_class(self.deadline)
        self._aborted = threading.Event()
        # Guards the sockets abort() shuts down against their closing (never held during I/O).
        self._sock_lock = threading.Lock()
        self._connecting: socket.socket | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to a worker process must not carry a live socket (it reconnects lazily);
        # the locks, the TLS context and the reply parser class (made per connection) cannot be
        # pickled at all.
        state = self.__dict__.copy()
        for name in ("_ssl", "http", "deadline", "_response_class", "_aborted", "_sock_lock",
                     "_connecting"):
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_live()

    # -- abort (any thread) --------------------------------------------------------------------

    def abort(self) -> None:
        """Shut down the socket in use (a connect in progress included); refuse calls until
        :meth:`rearm`."""
        with self._sock_lock:
            self._aborted.set()
            for sock in (self._connecting, self.http.sock if self.http is not None else None):
                if sock is None:
                    continue
                try:
                    # (the base class's shutdown: an SSLSocket's would also drop its TLS state,
                    # which the thread reading through it still uses)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except (OSError, ValueError):
                    pass  # not connected yet, or already closed

    def rearm(self) -> None:
        with self._sock_lock:
            self._aborted.clear()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def check_aborted(
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

    # -- one call's use ------------------------------------------------------------------------

    def prepare(self, route: str) -> bool:
        """Make sure a usable connection exists; return True when it is a reused one."""
        conn = self.http
        if conn is not None and conn.sock is not None:
            idle = time.monotonic() - self.last_used
            if idle > IDLE_RECONNECT_S or _peer_closed(conn.sock):
                _log.debug("reconnecting to %s (idle %.1f s or closed by peer)", self.base_url, idle)
                self.drop()
            else:
                return self.exchanges > 0
        elif conn is not None:
            self.drop()
        self._connect(route)
        return False

    def arm(self) -> None:
        """Let the next socket operation wait only for what is left of the call's deadline."""
        left = self.deadline.remaining()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        assert self.http is not None and self.http.sock is not None
        self.http.sock.settimeout(left)

    def finished(self, status: int, will_close: bool) -> None:
        """Book-keeping after a reply was read whole."""
        self.last_used = time.monotonic()
        self.exchanges += 1
        # After a 1xx that is not followed by a final reply (101 Switching Protocols) the
        # connection no longer speaks HTTP/1.1 to us.
        if will_close or status < 200:
            self.drop()

    def drop(self) -> None:
        """Close the connection: the next call opens a new one."""
        with self._sock_lock:
            if self.http is not None:
                try:
                    self.http.close()
                except OSError:
                    pass
            self.http = None
        self.exchanges = 0

    def exchange(
        self, method: str, target: str, hdrs: dict[str, str], *, body: bytes | None,
        upload: _Upload | None, max_bytes: int,
    ) -> tuple[int, str, http.client.HTTPMessage, bytes, bool]:
        """Send one request on the open connection and read the whole reply: ``(status, reason,
        headers, body, will_close)``.

        Raises :class:`_EarlyFailure` when the connection failed before any byte of the reply
        (the request may not have been processed), :class:`_TooLarge` for a body above
        ``max_bytes``, ``TimeoutError`` at the deadline, and ``OSError`` or
        ``http.client.HTTPException`` for a failure while reading: the transport tells them.
        """
        conn = self.http
        assert conn is not None and conn.sock is not None
        try:
            # sendall() under a timeout bounds the whole send (Python >= 3.5), so one arming
            # covers the request; an upload arms each of its sends, and the reply's every recv
            # is armed by the reply parser (_DeadlineReader).
            self.arm()
            conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            if upload is not None:
                conn.endheaders()
                upload.send(self)
            elif body is not None and len(body) <= _SINGLE_SEND_MAX:
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
            # set again per request, uploads included) removes the stall.
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

    # -- opening -------------------------------------------------------------------------------

    def _connect(self, route: str) -> None:
        # Connecting is part of the call's deadline (a resend after a dead connection included).
        wait = min(self.connect_timeout, self.deadline.remaining())
        if wait <= 0:
            raise RequestTimeout(
                f"{route} timed out after {self.deadline.limit:g} s (before connecting)",
                timeout=self.deadline.limit, route=route,
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
            self.check_aborted("connect", route, exc)
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
        self.http = conn
        self.exchanges = 0
        self.last_used = time.monotonic()
        self.opened += 1

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

