"""genmanip-online: client of the hosted GenManip online evaluation service.

``OnlineClient`` creates a task, polls it until the service assigns an evaluation endpoint (with
backoff, jitter and a hard deadline) and stops it; ``gmp online create|ready|submit|stop`` are the
command-line handlers in :mod:`genmanip_online.cli`, and ``gmp online run`` (meta package) drives a
whole evaluation through it.
"""

from __future__ import annotations

from .__about__ import __version__
from .client import (
    CREATE_FIELDS,
    CREATE_PATH,
    READY_PATH,
    OnlineClient,
    PollEvent,
    ReadyStatus,
    StopResult,
)
from .errors import (
    GenmanipOnlineError,
    InsecureURLError,
    MissingTokenError,
    OnlineAuthError,
    OnlineDeadlineError,
    OnlineHTTPError,
    OnlineReplyError,
    OnlineServiceError,
    OnlineTimeout,
    OnlineUnreachable,
)
from .urls import check_url, stop_candidates

__all__ = [
    "CREATE_FIELDS",
    "CREATE_PATH",
    "READY_PATH",
    "GenmanipOnlineError",
    "InsecureURLError",
    "MissingTokenError",
    "OnlineAuthError",
    "OnlineClient",
    "OnlineDeadlineError",
    "OnlineHTTPError",
    "OnlineReplyError",
    "OnlineServiceError",
    "OnlineTimeout",
    "OnlineUnreachable",
    "PollEvent",
    "ReadyStatus",
    "StopResult",
    "__version__",
    "check_url",
    "stop_candidates",
]
