"""genmanip-protocol: GenManip observation/action schemas, robot specs and safe wire codecs.

Small on purpose (numpy + msgpack): model repos, servers and validation tools can all depend on it.
"""

from __future__ import annotations

from .__about__ import __version__
from .errors import (
    AuthError,
    ConfigError,
    ConnectError,
    DecodeError,
    EncodeError,
    ExitCode,
    GenmanipError,
    GenmanipProtocolError,
    HTTPStatusError,
    RequestTimeout,
    ResponseError,
    TransportError,
    UnsafePayloadError,
    ValidationError,
    Violation,
)
from .robots import CAMERA_ORDER, ROBOTS, RobotSpec, get_robot, resolve_robot

# --- exports added by other modules go below this line (keep each block sorted) ---

__all__ = [
    "CAMERA_ORDER",
    "ROBOTS",
    "AuthError",
    "ConfigError",
    "ConnectError",
    "DecodeError",
    "EncodeError",
    "ExitCode",
    "GenmanipError",
    "GenmanipProtocolError",
    "HTTPStatusError",
    "RequestTimeout",
    "ResponseError",
    "RobotSpec",
    "TransportError",
    "UnsafePayloadError",
    "ValidationError",
    "Violation",
    "__version__",
    "get_robot",
    "resolve_robot",
]
