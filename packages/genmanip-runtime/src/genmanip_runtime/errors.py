"""The errors of gmp's runtime plumbing: HTTP exchanges, the network policy, file locks.

Tree (every class carries an ``exit_code``)::

    GenmanipError (genmanip_protocol)
      GenmanipRuntimeError
        InsecureTransportError       9  plain HTTP with a token to a host beyond this machine
        LockTimeout                  7  a file lock was not taken in time
        TransportError               5  an HTTP exchange failed (route, sent, maybe_executed)
          ConnectError               6  the server could not be reached; nothing was sent
          RequestTimeout             7  a call exceeded its time limit (the whole exchange)
          ResponseTooLarge           5  the reply body exceeds the call's size limit
          UnexpectedReply            5  a 2xx reply the caller cannot use (content type, empty)
          HTTPStatusError            5  a non-2xx status (status, detail)
            AuthError                8  401/403

    KeyboardInterrupt (builtin)
      RequestAborted                 a request or retry wait ended by ``HttpTransport.abort()``
"""

from __future__ import annotations

from typing import Any

from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "AuthError",
    "ConnectError",
    "GenmanipRuntimeError",
    "HTTPStatusError",
    "InsecureTransportError",
    "LockTimeout",
    "RequestAborted",
    "RequestTimeout",
    "ResponseTooLarge",
    "TransportError",
    "UnexpectedReply",
]


class GenmanipRuntimeError(GenmanipError):
    """Base exception of genmanip-runtime."""


class InsecureTransportError(GenmanipRuntimeError):
    """Refused: a token would travel over plain ``http://`` to ``host``, which is not this machine.

    Raised by :func:`genmanip_runtime.netpolicy.check_plain_http` in ``"refuse"`` mode; nothing was
    sent. Not a :class:`TransportError`, so no retry loop ever replays it. Packages subclass it to
    keep their own exception tree (``genmanip_online.InsecureURLError``).
    """

    exit_code = ExitCode.REFUSED

    def __init__(self, message: str, *, host: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.host = host


class LockTimeout(GenmanipRuntimeError):
    """A cross-process file lock could not be taken within ``timeout`` seconds."""

    exit_code = ExitCode.TIMEOUT

    def __init__(self, path: str, timeout: float, *, hint: str | None = None) -> None:
        super().__init__(
            f"could not lock {path} within {timeout:g} s (another process holds it)",
            hint=hint or "another gmp process is writing the same file; retry when it is done",
        )
        self.path = path
        self.timeout = timeout

class TransportError(GenmanipRuntimeError):
    """An HTTP exchange failed.

    ``sent`` tells whether the request may have reached the server, and ``maybe_executed`` whether
    the server may have acted on it: a caller must never replay a non-idempotent call (``/step``)
    when ``maybe_executed`` is true.
    """

    exit_code = ExitCode.REMOTE_ERROR
    #: False when trying again cannot help (https:// against a plain-HTTP server, an untrusted
    #: certificate): :func:`genmanip_runtime.retry.retry_call` then raises it at once.
    retryable: bool = True
    #: True when the reply shows that the server is not the service the transport was built for
    #: (an HTML page where a GenManip server answers JSON): a wrong URL, not a failing server.
    not_service: bool = False

    def __init__(
        self,
        message: str,
        *,
        route: str = "",
        sent: bool = False,
        maybe_executed: bool = False,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.route = route
        self.sent = sent
        self.maybe_executed = maybe_executed

class ConnectError(TransportError):
    """The server could not be reached; the request was not sent."""

    exit_code = ExitCode.UNREACHABLE

class RequestTimeout(TransportError):
    """A call exceeded its time limit; the message names the call and the limit.

    The limit is a deadline for the whole exchange (connect, send, status line, headers, body), so
    a server trickling its reply a byte at a time is cut at the limit too.
    """

    exit_code = ExitCode.TIMEOUT

    def __init__(self, message: str, *, timeout: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.timeout = timeout


class ResponseTooLarge(TransportError):
    """The reply body is larger than the call's limit (``limit`` bytes); nothing beyond it was read.

    ``declared`` is the ``Content-Length`` when the server announced the size (refused before a
    byte of the body was read), ``None`` for a chunked or read-until-close body (stopped once it
    passed the limit). ``status`` is the reply's status code.
    """

    def __init__(
        self, message: str, *, limit: int, declared: int | None = None, status: int = 0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sent", True)
        super().__init__(message, **kwargs)
        self.limit = limit
        self.declared = declared
        self.status = status


class UnexpectedReply(TransportError):
    """A 2xx reply the caller cannot use: the wrong ``Content-Type`` or an empty body.

    ``expected`` is the media type the caller asked for, ``content_type`` the one the server sent
    (``""`` when none). The server did answer with success, so it may have acted on the request.
    """

    def __init__(
        self, message: str, *, status: int, content_type: str, expected: str, **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sent", True)
        kwargs.setdefault("maybe_executed", True)
        super().__init__(message, **kwargs)
        self.status = status
        self.content_type = content_type
        self.expected = expected

class HTTPStatusError(TransportError):
    """The server answered with a non-2xx status. ``detail`` is the server's ``detail`` text."""

    def __init__(self, message: str, *, status: int, detail: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("sent", True)
        super().__init__(message, **kwargs)
        self.status = status
        self.detail = detail

class AuthError(HTTPStatusError):
    """401/403: the token is missing or was rejected. The token itself is never in the message."""

    exit_code = ExitCode.AUTH


class RequestAborted(KeyboardInterrupt):
    """A request, or a retry's wait, was ended by :meth:`HttpTransport.abort` (or the interrupt
    event of :func:`~genmanip_runtime.retry.retry_call`), typically called from another thread.

    A :class:`KeyboardInterrupt`, not a :class:`GenmanipRuntimeError`: it means "stop now", exactly
    like a Ctrl-C, so no retry loop or ``except Exception`` swallows it, and code that already
    handles a Ctrl-C mid-request handles it the same way. ``sent``/``maybe_executed`` as for
    :class:`TransportError`: whether the aborted request may have reached the server and run.
    """

    def __init__(
        self, message: str = "aborted", *, route: str = "", sent: bool = False,
        maybe_executed: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.route = route
        self.sent = sent
        self.maybe_executed = maybe_executed

    def __str__(self) -> str:
        return self.message
