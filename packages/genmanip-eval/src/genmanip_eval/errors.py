"""The exception tree of genmanip-eval.

``GenmanipEvalError`` is the package base (a :class:`genmanip_protocol.errors.GenmanipError`).
Protocol-level problems keep their protocol types (``ValidationError`` for an invalid action,
``ResponseError`` for a malformed reply, ``ConnectError``/``RequestTimeout``/``HTTPStatusError`` for
calls that are safe to describe without step semantics); a failed ``/step`` or ``/step_chunk`` is
always a :class:`StepError`, because the caller must know whether the action may have run.
"""

from __future__ import annotations

from typing import Any

from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "EpisodeIdError",
    "GenmanipEvalError",
    "Interrupted",
    "JobComplete",
    "PolicyCodeError",
    "PolicyError",
    "RecordingError",
    "ResetTimeout",
    "StepError",
    "StepTimeout",
    "WorkerProcessError",
]


class GenmanipEvalError(GenmanipError):
    """Base exception of genmanip-eval."""


class StepError(GenmanipEvalError):
    """A ``/step`` or ``/step_chunk`` call failed. It is never replayed automatically.

    Attributes:
        route: ``"/step"`` or ``"/step_chunk"``.
        workers: the worker ids the request was for.
        sent: the request may have reached the server.
        maybe_executed: the server may have applied the action(s); do not resend blindly.
        status: the HTTP status when the server answered, else None.
        detail: the server's ``detail`` text (may be empty).
        transient: the failure says nothing against the request itself (a timeout, a lost
            connection, 502/503/504, a 500 that is not an exception raised by the request's
            content): :class:`~genmanip_eval.EvalClient` recovers from it. A rejected request or a
            malformed reply is not transient.
    """

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(
        self,
        message: str,
        *,
        route: str,
        workers: list[str],
        sent: bool,
        maybe_executed: bool,
        status: int | None = None,
        detail: str = "",
        hint: str | None = None,
        transient: bool = False,
    ) -> None:
        super().__init__(message, hint=hint)
        self.route = route
        self.workers = list(workers)
        self.sent = sent
        self.maybe_executed = maybe_executed
        self.status = status
        self.detail = detail
        self.transient = transient


class StepTimeout(StepError):
    """A ``/step`` or ``/step_chunk`` call exceeded its time limit (the server may still run it)."""

    exit_code = ExitCode.TIMEOUT

    def __init__(self, message: str, *, timeout: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.timeout = timeout


class ResetTimeout(GenmanipEvalError):
    """A worker stayed ``reset_pending`` past the polling deadline."""

    exit_code = ExitCode.TIMEOUT

    def __init__(self, message: str, *, workers: list[str], deadline: float) -> None:
        super().__init__(message, hint="the server may still be booting a worker; raise reset_deadline")
        self.workers = list(workers)
        self.deadline = deadline


class Interrupted(KeyboardInterrupt):
    """:meth:`EvalClient.interrupt() <genmanip_eval.client.EvalClient.interrupt>` stopped the
    client's request or wait in progress (from another thread).

    A :class:`KeyboardInterrupt`, not a :class:`GenmanipEvalError`: it is handled like a Ctrl-C
    (``gmp`` exits 130) and no ``except Exception`` swallows it. The workers whose request went
    unanswered are settled by ``close()``.
    """


class JobComplete(GenmanipEvalError):
    """The server's job has nothing left to evaluate (exit 10, "nothing to do"): ``gmp eval``
    against a finished job, or the compatibility client's ``reset()`` there."""

    exit_code = ExitCode.NOTHING_TO_DO


class EpisodeIdError(GenmanipEvalError):
    """A server-supplied episode id would leave the results root; nothing was written."""

    exit_code = ExitCode.REMOTE_ERROR


class PolicyError(GenmanipEvalError):
    """The policy could not be loaded, or it returned something that is not an action."""

    exit_code = ExitCode.USAGE


class PolicyCodeError(PolicyError):
    """The user's policy code (its factory, ``reset``, ``get_action``, ...) raised: a failed run,
    not a usage error and not a bug in gmp.

    Attributes:
        where: ``file:line`` of the innermost traceback frame in the user's code, or None.
    """

    exit_code = ExitCode.FAILURE

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.where = where


class RecordingError(GenmanipEvalError):
    """The background recorder failed (disk full, encoder crash); the run stops."""

    exit_code = ExitCode.FAILURE


class WorkerProcessError(GenmanipEvalError):
    """A worker process of ``gmp eval --processes N`` died or failed."""

    exit_code = ExitCode.FAILURE
