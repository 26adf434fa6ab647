"""The exception tree of genmanip-serve.

``GenmanipServeError`` is the package base (a :class:`genmanip_protocol.errors.GenmanipError`).

* Server side: :class:`ServeConfigError` (bad flags, a port that cannot be bound) and
  :class:`WireError` (a frame that is not a valid request: its ``field`` names the offending
  key path; the server answers it with a text frame and goes on serving).
* Client side (``--policy ws://...``): :class:`RemotePolicyError` and its subclasses are also
  :class:`genmanip_eval.PolicyError`, so ``gmp eval`` stops with one message and the right exit
  code when the policy server is unreachable, refuses the key, times out, dies mid-run or
  answers with an error; :class:`KeyMapError` names the key of a wrong ``keymap=`` file.
"""

from __future__ import annotations

from genmanip_eval.errors import PolicyError
from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "GenmanipServeError",
    "KeyMapError",
    "PolicyServerAuthError",
    "PolicyServerGone",
    "PolicyServerRejected",
    "PolicyServerTimeout",
    "PolicyServerUnreachable",
    "RemotePolicyError",
    "ServeConfigError",
    "WireError",
]


class GenmanipServeError(GenmanipError):
    """Base exception of genmanip-serve."""


class ServeConfigError(GenmanipServeError):
    """``gmp policy serve`` cannot start as asked (a bad flag value, a port in use)."""

    exit_code = ExitCode.USAGE


class WireError(GenmanipServeError):
    """A message that is not a valid frame of the policy-server wire.

    Attributes:
        field: the key path of the offending value (``"video.top_camera_view"``,
            ``"gmp/worker_id"``; ``"<message>"`` for the frame as a whole).
    """

    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, message: str, *, field: str = "<message>", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.field = field


class RemotePolicyError(GenmanipServeError, PolicyError):
    """A policy server (``--policy ws://...``) failed, refused a request or answered badly.

    Attributes:
        url: the policy server's URL.
        worker_id: the worker whose request failed (None when not about one request).
    """

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(
        self, message: str, *, url: str = "", worker_id: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.url = url
        self.worker_id = worker_id


class PolicyServerUnreachable(RemotePolicyError):
    """The policy server could not be reached (refused, DNS, TLS, handshake)."""

    exit_code = ExitCode.UNREACHABLE


class PolicyServerAuthError(RemotePolicyError):
    """The policy server refused the API key (or wants one and none was given)."""

    exit_code = ExitCode.AUTH


class PolicyServerTimeout(RemotePolicyError):
    """A reply did not arrive within the deadline (``--policy-arg timeout=SECONDS``)."""

    exit_code = ExitCode.TIMEOUT

    def __init__(
        self, message: str, *, timeout: float, url: str = "",
        worker_id: str | None = None, hint: str | None = None,
    ) -> None:
        super().__init__(message, url=url, worker_id=worker_id, hint=hint)
        self.timeout = timeout


class PolicyServerGone(RemotePolicyError):
    """The connection to the policy server was lost mid-run (the server died or closed it).

    Attributes:
        code: the WebSocket close code (1006 for a connection that just dropped), or None.
    """

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(
        self, message: str, *, code: int | None = None, url: str = "",
        worker_id: str | None = None, hint: str | None = None,
    ) -> None:
        super().__init__(message, url=url, worker_id=worker_id, hint=hint)
        self.code = code


class PolicyServerRejected(RemotePolicyError):
    """The server answered a request with an error (an openpi-style text frame).

    Attributes:
        kind: the error's tag when a gmp server sent it (``"invalid-request"``,
            ``"policy-failed"``, ``"server-closing"``), else ``""``.
        detail: the server's text (made safe to print).
    """

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(
        self, message: str, *, kind: str = "", detail: str = "", url: str = "",
        worker_id: str | None = None, hint: str | None = None,
    ) -> None:
        super().__init__(message, url=url, worker_id=worker_id, hint=hint)
        self.kind = kind
        self.detail = detail


class KeyMapError(RemotePolicyError):
    """A ``keymap=`` file is wrong, or does not fit the observation or the server's actions.

    Attributes:
        key: the key map entry at fault (``"observation.video.left_camera_view"``,
            ``"action.gripper"``).
    """

    exit_code = ExitCode.USAGE

    def __init__(
        self, message: str, *, key: str, url: str = "",
        worker_id: str | None = None, hint: str | None = None,
    ) -> None:
        super().__init__(message, url=url, worker_id=worker_id, hint=hint)
        self.key = key
