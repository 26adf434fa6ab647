"""The testbed's exception tree (rooted at :class:`genmanip_protocol.errors.GenmanipError`)."""

from __future__ import annotations

from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "FaultSpecError",
    "GenmanipTestbedError",
    "ServerStartError",
    "UnknownConfigError",
]


class GenmanipTestbedError(GenmanipError):
    """Base exception of genmanip-testbed."""


class FaultSpecError(GenmanipTestbedError):
    """A ``--fault`` specification (or a ``faults=`` value) is malformed; the message names the key."""

    exit_code = ExitCode.USAGE


class UnknownConfigError(GenmanipTestbedError):
    """A task config name (``--tasks``) is not one of the testbed's task sets."""

    exit_code = ExitCode.USAGE


class ServerStartError(GenmanipTestbedError):
    """The HTTP server could not start (port in use, bad TLS files, ...)."""

    exit_code = ExitCode.FAILURE
