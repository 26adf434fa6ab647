"""The exception tree of genmanip-online.

Every failure of a call to the online service has its own class, so a script (and the ``gmp``
exit code) can tell them apart: the service said no (``code != 0``), the HTTP exchange failed
(status, timeout, unreachable), the reply was not the documented envelope, the task did not get an
endpoint before the deadline, or the URL was refused for safety. Messages never contain the token.
"""

from __future__ import annotations

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.errors import InsecureTransportError

__all__ = [
    "GenmanipOnlineError",
    "InsecureURLError",
    "MissingTokenError",
    "OnlineAuthError",
    "OnlineDeadlineError",
    "OnlineHTTPError",
    "OnlineReplyError",
    "OnlineServiceError",
    "OnlineTimeout",
    "OnlineUnreachable",
]


class GenmanipOnlineError(GenmanipError):
    """Base exception of genmanip-online."""


class OnlineServiceError(GenmanipOnlineError):
    """The service answered with its envelope and ``code != 0``; ``msg`` is the service's message."""

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(self, call: str, code: object, msg: str, *, hint: str | None = None) -> None:
        super().__init__(f"online service {call}: error code {code}: {msg or '(no message)'}", hint=hint)
        self.call = call
        self.code = code
        self.msg = msg


class OnlineHTTPError(GenmanipOnlineError):
    """The service answered with a non-2xx HTTP status; ``status`` and the reply text are kept."""

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(self, call: str, status: int, text: str, *, hint: str | None = None) -> None:
        shown = f": {text}" if text else ""
        super().__init__(f"online service {call}: HTTP {status}{shown}", hint=hint)
        self.call = call
        self.status = status
        self.text = text


class OnlineAuthError(OnlineHTTPError):
    """HTTP 401/403: the token is missing or was rejected (the token itself is never shown)."""

    exit_code = ExitCode.AUTH


class OnlineTimeout(GenmanipOnlineError):
    """One request exceeded the per-request ``--timeout``."""

    exit_code = ExitCode.TIMEOUT

    def __init__(self, call: str, timeout: float, *, hint: str | None = None) -> None:
        super().__init__(
            f"online service {call}: no reply within {timeout:g} s (--timeout)", hint=hint
        )
        self.call = call
        self.timeout = timeout


class OnlineUnreachable(GenmanipOnlineError):
    """The service could not be reached (refused, DNS, TLS verification)."""

    exit_code = ExitCode.UNREACHABLE


class OnlineReplyError(GenmanipOnlineError):
    """The reply is not the documented ``{code, msg, data}`` JSON envelope; ``field`` names what is wrong."""

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(self, call: str, field: str, problem: str, *, hint: str | None = None) -> None:
        super().__init__(f"online service {call}: malformed reply: {field}: {problem}", hint=hint)
        self.call = call
        self.field = field


class OnlineDeadlineError(GenmanipOnlineError):
    """The task got no endpoint before ``--deadline`` passed. The task itself is left as it is."""

    exit_code = ExitCode.TIMEOUT

    def __init__(
        self, task_id: str, deadline: float, polls: int, *, hint: str | None = None
    ) -> None:
        super().__init__(
            f"task {task_id} got no endpoint within the {deadline:g} s deadline ({polls} polls)",
            hint=hint,
        )
        self.task_id = task_id
        self.deadline = deadline
        self.polls = polls


class InsecureURLError(GenmanipOnlineError, InsecureTransportError):
    """A plain-HTTP URL to a non-loopback host (the token would travel in clear text).

    Also an :class:`~genmanip_runtime.errors.InsecureTransportError`, the runtime's class for the
    same refusal, so one ``except`` catches it from every package.
    """

    exit_code = ExitCode.REFUSED


class MissingTokenError(GenmanipOnlineError):
    """No token was found (``--token``, ``GMP_ONLINE_TOKEN`` or the config file's ``[online] token``)."""

    exit_code = ExitCode.AUTH
