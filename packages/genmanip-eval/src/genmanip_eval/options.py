"""What an :class:`~genmanip_eval.client.EvalClient` is configured with: three frozen dataclasses,
validated once, and the translation from the reference-compatible constructor's keywords.

* :class:`ConnectionOptions`: where and how to talk (URL, run id, token, codec, frames, CA file,
  per-call time limits);
* :class:`StepOptions`: how actions are sent (validation, robot, ``/step_chunk`` query, parallel
  chunks);
* :class:`RecoveryOptions`: the life cycle around failures (max recoveries, adopt/kill on start,
  kill on close, ``/reset_result`` polling).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from genmanip_protocol.errors import ValidationError, Violation
from genmanip_protocol.robots import RobotSpec, get_robot
from genmanip_runtime.netpolicy import is_loopback_host
from genmanip_runtime.transport import build_base_url

__all__ = [
    "DEFAULT_TIMEOUTS",
    "DEFAULT_URL",
    "TOKEN_ENV",
    "ConnectionOptions",
    "RecoveryOptions",
    "StepOptions",
    "options_from_reference",
    "parse_worker_ids",
]

log = logging.getLogger("genmanip_eval.client")

DEFAULT_URL = "http://127.0.0.1:8087"
#: Environment variable holding the server token (after ``token=``/``--token``).
TOKEN_ENV = "GMP_TOKEN"  # noqa: S105 - an env var name, not a secret

#: Per-call time limits in seconds (the real server's limits, facts §1.2). ``step_chunk`` is per
#: action of the chunk. ``reset_deadline`` bounds the whole polling loop; ``server_wait`` is how
#: long a client waits for an unreachable server (a restart takes seconds) before it gives up.
DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "step": 600.0,
    "step_chunk": 600.0,
    "reset": 600.0,
    "reset_result": 600.0,
    "reset_deadline": 600.0,
    "kill": 120.0,
    "create_workers": 600.0,
    "start_new_job": 60.0,
    "status": 30.0,
    "docs": 5.0,
    "protocol": 5.0,
    "server_wait": 60.0,
}

#: Reference-client keywords accepted and ignored (with a warning).
REFERENCE_IGNORED = frozenset(
    {
        "save_result",
        "web_view",
        "web_view_port",
        "web_view_interval",
        "web_view_scale",
        "frame_save_interval",
        "plot_on_episode_end",
        "chunk_size",
        "control_type",
    }
)


def _bad(field_: str, expected: str, actual: str) -> ValidationError:
    return ValidationError(Violation(field_, expected, actual))


def _check_timeout_keys(timeouts: Mapping[str, float]) -> None:
    bad = set(timeouts) - set(DEFAULT_TIMEOUTS)
    if bad:
        raise _bad("timeouts", f"keys among {sorted(DEFAULT_TIMEOUTS)}", repr(sorted(bad)))


@dataclass(frozen=True)
class ConnectionOptions:
    """Where the server is and how to talk to it.

    ``timeouts`` may name a subset of :data:`DEFAULT_TIMEOUTS`; the rest keep their defaults.
    ``token`` is used as given (the client resolves ``GMP_TOKEN`` / the config file when None).
    """

    base_url: str = DEFAULT_URL
    run_id: str | None = None
    token: str | None = field(default=None, repr=False)
    codec: str = "auto"
    frames: str = "auto"
    ca_file: str | None = None
    timeouts: Mapping[str, float] = field(default_factory=lambda: MappingProxyType(dict(DEFAULT_TIMEOUTS)))

    def __post_init__(self) -> None:
        url = self.base_url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _bad("base_url", "an http:// or https:// URL with a host", repr(self.base_url))
        object.__setattr__(self, "base_url", url)
        object.__setattr__(self, "run_id", self.run_id or None)
        if self.codec not in ("auto", "msgpack", "legacy"):
            raise _bad("codec", "auto, msgpack or legacy", repr(self.codec))
        if self.frames not in ("auto", "raw", "jpeg"):
            raise _bad("frames", "auto, raw or jpeg", repr(self.frames))
        _check_timeout_keys(self.timeouts)
        merged = {**DEFAULT_TIMEOUTS, **{k: float(v) for k, v in self.timeouts.items()}}
        object.__setattr__(self, "timeouts", MappingProxyType(merged))

    @property
    def loopback(self) -> bool:
        """Whether the server is on this machine (raw camera frames are then the default)."""
        return is_loopback_host(urlsplit(self.base_url).hostname or "")


@dataclass(frozen=True)
class StepOptions:
    """How actions are checked and sent. ``render_mode``/``subframes``/``render_suffix`` are the
    ``/step_chunk`` query (server defaults when None)."""

    validate: bool = True
    robot: RobotSpec | None = None
    render_mode: str | None = None
    subframes: int | None = None
    render_suffix: int | None = None
    parallel_chunks: bool = True

    def __post_init__(self) -> None:
        if self.render_mode is not None and self.render_mode not in ("lite", "always"):
            raise _bad("render_mode", "lite or always", repr(self.render_mode))

    def chunk_query(self) -> dict[str, Any]:
        return {"render_mode": self.render_mode, "subframes": self.subframes,
                "render_suffix": self.render_suffix}


@dataclass(frozen=True)
class RecoveryOptions:
    """The worker life cycle around failures, starts and stops (see ``EvalClient``'s Args)."""

    max_recoveries: int = 5
    kill_on_start: bool = True
    adopt_on_start: bool = True
    kill_on_close: bool = True
    poll_initial: float = 0.01
    poll_max: float = 0.5
    reset_grace: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_recoveries", max(0, int(self.max_recoveries)))


def parse_worker_ids(worker_ids: Iterable[str | int] | str | int) -> list[str]:
    """Worker ids as distinct non-empty strings (ints and a comma-separated string accepted)."""
    if isinstance(worker_ids, (str, int)):
        items = [s.strip() for s in str(worker_ids).split(",")]
    else:
        items = [str(w).strip() for w in worker_ids]
    if not items or any(not w for w in items):
        raise _bad("worker_ids", "a non-empty list of non-empty ids", repr(worker_ids))
    if len(set(items)) != len(items):
        raise _bad("worker_ids", "distinct ids", repr(items))
    return items


def options_from_reference(
    *,
    base_url: str | None,
    host: str | None,
    port: int | None,
    run_id: str | None,
    token: str | None,
    codec: str,
    frames: str,
    ca_file: str | None,
    timeouts: Mapping[str, float] | None,
    default_timeouts: Mapping[str, float],
    robot: str | RobotSpec | None,
    validate: bool,
    render_mode: str | None,
    subframes: int | None,
    render_suffix: int | None,
    parallel_chunks: bool,
    max_recoveries: int,
    kill_on_start: bool,
    adopt_on_start: bool,
    kill_on_close: bool,
    poll_initial: float,
    poll_max: float,
    reset_grace: float,
    reference_options: Mapping[str, Any],
) -> tuple[ConnectionOptions, StepOptions, RecoveryOptions]:
    """The options of the reference-compatible constructor's keywords, validated (in the order
    the constructor always checked them). ``reference_options``: the reference client's other
    keywords (ignored with a warning; an unknown one is a ``TypeError``)."""
    unknown = set(reference_options) - REFERENCE_IGNORED
    if unknown:
        raise TypeError(f"EvalClient got unexpected keyword argument(s): {sorted(unknown)}")
    if reference_options:
        log.warning(
            "EvalClient: reference-client option(s) %s have no effect here (see docs/eval.md)",
            ", ".join(sorted(reference_options)),
        )
    if base_url is None:
        base_url = build_base_url(None, host, port or 8087) if host else DEFAULT_URL
    if timeouts:
        _check_timeout_keys(timeouts)
    merged = {**default_timeouts, **(timeouts or {})}
    conn = ConnectionOptions(base_url=base_url, run_id=run_id, token=token, codec=codec,
                             frames=frames, ca_file=ca_file, timeouts=merged)
    spec = get_robot(robot) if isinstance(robot, str) else robot
    step = StepOptions(validate=validate, robot=spec, render_mode=render_mode,
                       subframes=subframes, render_suffix=render_suffix,
                       parallel_chunks=parallel_chunks)
    recovery = RecoveryOptions(max_recoveries=max_recoveries, kill_on_start=kill_on_start,
                               adopt_on_start=adopt_on_start, kill_on_close=kill_on_close,
                               poll_initial=poll_initial, poll_max=poll_max, reset_grace=reset_grace)
    return conn, step, recovery
