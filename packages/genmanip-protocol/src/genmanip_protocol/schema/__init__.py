"""Schemas of the GenManip wire: actions, observations, server replies, metric keys, episode ids.

Validators come in pairs: ``check_*`` returns every :class:`~genmanip_protocol.errors.Violation`
found (empty list = valid), ``validate_*`` raises :class:`~genmanip_protocol.errors.ValidationError`
carrying all of them. Server replies are parsed by ``parse_*`` functions into small frozen
dataclasses; a reply of the wrong shape raises :class:`~genmanip_protocol.errors.ResponseError`
whose field names the exact place, e.g. ``response["1"].metric``.

The rules are the real server's (``docs/protocol.md``): the server itself validates nothing and
answers a bad action with a 500 while the episode goes on, so the client checks first.

Submodules (everything public is re-exported here; import from ``genmanip_protocol.schema``):

* :mod:`.actions` -- ``ACTION_KEYS``, ``CONTROL_TYPES``, ``check_action``, ``validate_action``,
  ``validate_chunk``.
* :mod:`.observations` -- ``check_observation``, ``validate_observation``.
* :mod:`.ids` -- ``safe_relative_path``, ``split_episode_id``: the rules for server-supplied ids.
* :mod:`.metrics` -- ``SUCCESS_TOL``, ``is_success``, ``MetricKey``, ``parse_metric_key``,
  ``TaskMetric``, ``normalize_metric``, ``parse_metric``, ``merge_metrics``, ``EpisodeResult``,
  ``parse_episode_result``.
* :mod:`.replies` -- ``WorkerEntry``, ``parse_worker_entry``, ``parse_step_response``,
  ``ChunkResponse``, ``parse_chunk_response``, ``parse_success_response``, ``STATUS_VALUES``,
  ``ServerStatus``, ``parse_status``.
* ``._checks`` (private) -- the helpers they share: value descriptions and the violation context.
"""

from __future__ import annotations

from .actions import ACTION_KEYS, CONTROL_TYPES, check_action, validate_action, validate_chunk
from .ids import safe_relative_path, split_episode_id
from .metrics import (
    SUCCESS_TOL,
    EpisodeResult,
    MetricKey,
    TaskMetric,
    is_success,
    merge_metrics,
    normalize_metric,
    parse_episode_result,
    parse_metric,
    parse_metric_key,
)
from .observations import check_observation, validate_observation
from .replies import (
    STATUS_VALUES,
    ChunkResponse,
    ServerStatus,
    WorkerEntry,
    parse_chunk_response,
    parse_status,
    parse_step_response,
    parse_success_response,
    parse_worker_entry,
)

__all__ = [
    "ACTION_KEYS",
    "CONTROL_TYPES",
    "STATUS_VALUES",
    "SUCCESS_TOL",
    "ChunkResponse",
    "EpisodeResult",
    "MetricKey",
    "ServerStatus",
    "TaskMetric",
    "WorkerEntry",
    "check_action",
    "check_observation",
    "is_success",
    "merge_metrics",
    "normalize_metric",
    "parse_chunk_response",
    "parse_episode_result",
    "parse_metric",
    "parse_metric_key",
    "parse_status",
    "parse_step_response",
    "parse_success_response",
    "parse_worker_entry",
    "safe_relative_path",
    "split_episode_id",
    "validate_action",
    "validate_chunk",
    "validate_observation",
]
