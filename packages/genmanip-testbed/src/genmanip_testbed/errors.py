"""The testbed's exception tree (rooted at :class:`genmanip_protocol.errors.GenmanipError`)."""

from __future__ import annotations

from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = [
    "FaultSpecError",
    "GenmanipTestbedError",
    "OptionError",
    "ServerStartError",
    "UnknownConfigError",
]


class GenmanipTestbedError(GenmanipError):
    """Base exception of genmanip-testbed."""


class FaultSpecError(GenmanipTestbedError):
    """A ``--fault`` specification (or a ``faults=`` value) is malformed; the message names the key."""

    exit_code = ExitCode.USAGE


class OptionError(GenmanipTestbedError):
    """A testbed option is invalid (wire, run id, ...); the message names it."""

    exit_code = ExitCode.USAGE


class UnknownConfigError(OptionError):
    """A task config name (``--tasks``) is not one of the testbed's task sets."""


class ServerStartError(GenmanipTestbedError):
    """The HTTP server could not start (port in use, bad TLS files, ...)."""

    exit_code = ExitCode.FAILURE
