"""genmanip-runtime: the plumbing every gmp client shares, on the standard library alone.

The HTTP transport (keep-alive ``http.client`` with typed errors), retry with backoff, the config
file and secret lookup, the terminal console (styling, progress lines, tables), the one function
that makes foreign text safe to print (:func:`safe_text`: registered secrets scrubbed, control
characters escaped), atomic files and cross-process locks, and the network policy (loopback
detection, the plain-HTTP/token rule).
Its only dependency is genmanip-protocol, for the root of the exception tree.
"""

from __future__ import annotations

from .__about__ import __version__
from .atomic import (
    FileLock,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    merge_json,
    read_json,
)
from .config import (
    Secret,
    config_path,
    load_config,
    resolve_secret,
    resolve_setting,
    resolve_token,
)
from .console import Console, Progress, StatusLine, format_duration, table
from .errors import (
    AuthError,
    ConnectError,
    GenmanipRuntimeError,
    HTTPStatusError,
    InsecureTransportError,
    LockTimeout,
    RequestTimeout,
    ResponseTooLarge,
    TransportError,
    UnexpectedReply,
)
from .netpolicy import check_plain_http, is_loopback_host
from .redact import register_secret, scrub_secrets
from .retry import Backoff, retry_call
from .text import SafeFormatter, escape_controls, safe_text
from .transport import HttpTransport, Response, build_base_url

__all__ = [
    "AuthError",
    "Backoff",
    "ConnectError",
    "Console",
    "FileLock",
    "GenmanipRuntimeError",
    "HTTPStatusError",
    "HttpTransport",
    "InsecureTransportError",
    "LockTimeout",
    "Progress",
    "RequestTimeout",
    "Response",
    "ResponseTooLarge",
    "SafeFormatter",
    "Secret",
    "StatusLine",
    "TransportError",
    "UnexpectedReply",
    "__version__",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "build_base_url",
    "check_plain_http",
    "config_path",
    "escape_controls",
    "format_duration",
    "is_loopback_host",
    "load_config",
    "merge_json",
    "read_json",
    "register_secret",
    "resolve_secret",
    "resolve_setting",
    "resolve_token",
    "retry_call",
    "safe_text",
    "scrub_secrets",
    "table",
]
