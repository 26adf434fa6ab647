"""Exit codes, the root of every gmp exception, and the errors of the wire vocabulary.

Every package defines exactly one base exception that derives from :class:`GenmanipError`
(``GenmanipProtocolError`` here, ``GenmanipEvalError`` in genmanip-eval, ...). The ``gmp`` command
has a single place that turns a :class:`GenmanipError` into a message on stderr and the exception's
``exit_code``; anything else is a bug and exits with :attr:`ExitCode.INTERNAL`.
"""

from __future__ import annotations

import enum
from typing import ClassVar

__all__ = [
    "ConfigError",
    "DecodeError",
    "DecodeLimitError",
    "EncodeError",
    "ExitCode",
    "GenmanipError",
    "GenmanipProtocolError",
    "ResponseError",
    "UnsafePayloadError",
    "ValidationError",
    "Violation",
]


class ExitCode(enum.IntEnum):
    """Process exit codes of ``gmp``. Stable: scripts may test for them."""

    OK = 0
    #: The command ran but its outcome is a failure (a worker died, an upload was rejected, ...).
    FAILURE = 1
    #: The command line was wrong.
    USAGE = 2
    #: The subcommand's package (or extra) is not installed.
    NOT_INSTALLED = 3
    #: An input (action, file, config) failed validation.
    INVALID_INPUT = 4
    #: The server answered with an error, or with a reply this client cannot accept.
    REMOTE_ERROR = 5
    #: The server could not be reached (refused, DNS, TLS).
    UNREACHABLE = 6
    #: A call exceeded its time limit.
    TIMEOUT = 7
    #: Missing or rejected credentials.
    AUTH = 8
    #: Refused for safety (deleting unsubmitted results, bundling an incomplete run, ...).
    REFUSED = 9
    #: Nothing to do (nothing to clean, already submitted, ...).
    NOTHING_TO_DO = 10
    #: An unexpected exception: a bug in gmp.
    INTERNAL = 70
    #: Interrupted by Ctrl-C.
    INTERRUPTED = 130
    #: Stopped by SIGTERM (a batch scheduler, ``kill``, ``timeout``), after cleaning up like Ctrl-C.
    TERMINATED = 143


class GenmanipError(Exception):
    """Root of every error raised on purpose by a ``genmanip-*`` package.

    ``hint`` is an optional one-line suggestion shown after the message by the CLI.
    """

    exit_code: ClassVar[ExitCode] = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class GenmanipProtocolError(GenmanipError):
    """Base exception of genmanip-protocol."""


class ConfigError(GenmanipProtocolError):
    """A configuration file or setting is invalid."""

    exit_code = ExitCode.USAGE



class EncodeError(GenmanipProtocolError):
    """A value cannot be put on the wire (object dtype, unsupported type, ...)."""

    exit_code = ExitCode.INVALID_INPUT


class DecodeError(GenmanipProtocolError):
    """Bytes from the wire or from a file are not a valid payload of the named codec."""

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(self, message: str, *, codec: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.codec = codec


class DecodeLimitError(DecodeError):
    """A payload exceeds one of the decoders' bounds (nesting depth, container or element count,
    copied bytes, array shape, image size); refused before the memory was allocated.

    ``limit`` names the constant (``"MAX_DEPTH"``, ``"MAX_CONTAINERS"``, ... of
    ``genmanip_protocol.codec.limits``) and ``bound`` is its value.
    """

    def __init__(
        self, message: str, *, limit: str, bound: int, codec: str = "", hint: str | None = None
    ) -> None:
        super().__init__(message, codec=codec, hint=hint)
        self.limit = limit
        self.bound = bound


class UnsafePayloadError(DecodeError):
    """A pickle tried to reach a global outside the allow-list. Nothing was executed."""

    def __init__(self, global_name: str, *, codec: str = "legacy") -> None:
        super().__init__(
            f"refused to unpickle {global_name!r}: not on the allow-list "
            "(builtin containers, scalars and numpy arrays only); nothing was executed",
            codec=codec,
        )
        self.global_name = global_name


class Violation:
    """One problem found by a validator: where, which field, what was expected, what was found."""

    __slots__ = ("actual", "expected", "field", "location", "step", "worker")

    def __init__(
        self,
        field: str,
        expected: str,
        actual: str,
        *,
        worker: str | None = None,
        step: int | None = None,
        location: str | None = None,
    ) -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        self.worker = worker
        self.step = step
        self.location = location

    def __str__(self) -> str:
        where = []
        if self.location:
            where.append(self.location)
        if self.worker is not None:
            where.append(f"worker {self.worker}")
        if self.step is not None:
            where.append(f"step {self.step}")
        prefix = f"{', '.join(where)}: " if where else ""
        return f"{prefix}{self.field}: expected {self.expected}, got {self.actual}"

    def __repr__(self) -> str:
        return f"Violation({self!s})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Violation):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, s) for s in self.__slots__))


class ValidationError(GenmanipProtocolError):
    """A value does not match its schema. ``violations`` lists every problem found (at least one)."""

    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, violations: list[Violation] | Violation, *, hint: str | None = None) -> None:
        vs = [violations] if isinstance(violations, Violation) else list(violations)
        if not vs:
            raise ValueError("ValidationError needs at least one violation")
        self.violations = vs
        first = vs[0]
        if len(vs) == 1:
            message = str(first)
        else:
            # Name the other fields: a missing "action" must not hide behind "(and 1 more)".
            others = list(dict.fromkeys(v.field for v in vs[1:]))
            shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
            message = f"{first} (and {len(vs) - 1} more: {shown})"
        super().__init__(message, hint=hint)

    # Convenience accessors for the (usual) single-violation case.
    @property
    def field(self) -> str:
        return self.violations[0].field

    @property
    def expected(self) -> str:
        return self.violations[0].expected

    @property
    def actual(self) -> str:
        return self.violations[0].actual

    @property
    def worker(self) -> str | None:
        return self.violations[0].worker

    @property
    def step(self) -> int | None:
        return self.violations[0].step


class ResponseError(ValidationError):
    """A server reply does not have the documented shape; the message names the field."""

    exit_code = ExitCode.REMOTE_ERROR
