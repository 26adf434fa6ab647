"""Server replies: per-worker entries of ``/reset``/``/step``/``/step_chunk``, control replies and
``/status``, parsed into frozen dataclasses or a ``ResponseError`` naming the exact field."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ResponseError, Violation
from ._checks import _describe, _is_bool, _is_count, _is_number, _short
from .metrics import EpisodeResult, normalize_metric, parse_episode_result

__all__ = [
    "STATUS_VALUES",
    "ChunkResponse",
    "ServerStatus",
    "WorkerEntry",
    "parse_chunk_response",
    "parse_status",
    "parse_step_response",
    "parse_success_response",
    "parse_worker_entry",
]


@dataclass(frozen=True)
class WorkerEntry:
    """One worker's entry of a ``/reset``, ``/reset_result``, ``/step`` or ``/step_chunk`` reply.

    Attributes:
        worker_id: the id as a string.
        obs: the observation mapping, or ``None`` (worker finished, or a reset is pending: the
            placeholder ``{"reset": True, "reset_pending": True}`` is not passed on).
        metric: the run's metric dict in dict form (old float values converted), or ``None``.
        episode_result: the episode that just finished (results arrive one hop late), or ``None``.
        reset_pending: a background reset is running; poll ``/reset_result``.
        lock_lost: the server lost this worker's episode lock and moved it to the next task.
    """

    worker_id: str
    obs: Mapping[str, Any] | None
    metric: dict[str, dict[str, float]] | None
    episode_result: EpisodeResult | None
    reset_pending: bool = False
    lock_lost: bool = False

    @property
    def finished(self) -> bool:
        """The worker has nothing left to do: no observation and no reset pending."""
        return self.obs is None and not self.reset_pending

    @property
    def is_first(self) -> bool:
        """The observation is the first of an episode (``obs["reset"]`` is true)."""
        return self.obs is not None and bool(self.obs.get("reset", False))


def parse_worker_entry(worker_id: Any, entry: Any, *, where: str | None = None) -> WorkerEntry:
    """Parse one worker's reply entry (every documented form: normal, pending, reset finished,
    lock lost, worker finished). Raises ``ResponseError`` naming e.g. ``response["1"].metric``."""
    wid = str(worker_id)
    w = where or f"response[{wid!r}]".replace("'", '"')
    if not isinstance(entry, Mapping):
        raise ResponseError(Violation(w, "a dict {obs, metric, episode_result}", _describe(entry)))
    if "obs" not in entry:
        raise ResponseError(Violation(f"{w}.obs", "a key (observation or None)", "missing"))
    obs = entry["obs"]
    if obs is not None and not isinstance(obs, Mapping):
        raise ResponseError(Violation(f"{w}.obs", "an observation mapping or None", _describe(obs)))
    pending = entry.get("reset_pending", False)
    if not _is_bool(pending):
        raise ResponseError(Violation(f"{w}.reset_pending", "a bool", _describe(pending)))
    pending = bool(pending) or bool(obs is not None and obs.get("reset_pending") is True)
    lock_lost = entry.get("lock_lost", False)
    if not _is_bool(lock_lost):
        raise ResponseError(Violation(f"{w}.lock_lost", "a bool", _describe(lock_lost)))
    metric = normalize_metric(entry.get("metric"), where=f"{w}.metric")
    result = parse_episode_result(entry.get("episode_result"), where=f"{w}.episode_result")
    return WorkerEntry(
        worker_id=wid,
        obs=None if pending else obs,
        metric=metric,
        episode_result=result,
        reset_pending=pending,
        lock_lost=bool(lock_lost),
    )


def _parse_entries(
    data: Any, expected_workers: Iterable[Any] | None, where: str
) -> dict[str, WorkerEntry]:
    if not isinstance(data, Mapping):
        raise ResponseError(Violation(where, "a dict {worker_id: entry}", _describe(data)))
    entries: dict[str, WorkerEntry] = {}
    for k, v in data.items():
        wid = str(k)
        entries[wid] = parse_worker_entry(wid, v, where=f'{where}["{wid}"]')
    if expected_workers is not None:
        missing = [str(w) for w in expected_workers if str(w) not in entries]
        if missing:
            got = ", ".join(sorted(entries)) or "none"
            raise ResponseError(
                [
                    Violation(
                        f'{where}["{m}"]',
                        f"an entry for worker {m}",
                        f"missing (workers in reply: {got})",
                        worker=m,
                    )
                    for m in missing
                ]
            )
    return entries


def parse_step_response(
    data: Any, expected_workers: Iterable[Any] | None = None
) -> dict[str, WorkerEntry]:
    """Parse a ``/reset``, ``/reset_result`` or ``/step`` reply ``{worker_id: entry}``.

    Keys are returned as strings. A worker of ``expected_workers`` missing from the reply, a
    non-dict entry or a field of the wrong type raises ``ResponseError`` naming the field.
    """
    return _parse_entries(data, expected_workers, "response")


@dataclass(frozen=True)
class ChunkResponse:
    """A ``/step_chunk`` reply: the entries of the last executed step and how far it got."""

    entries: dict[str, WorkerEntry]
    executed_steps: int
    stopped_early: bool


def parse_chunk_response(data: Any, expected_workers: Iterable[Any] | None = None) -> ChunkResponse:
    """Parse ``{"obs": {wid: entry}, "executed_steps": int, "stopped_early": bool}``."""
    if not isinstance(data, Mapping):
        raise ResponseError(
            Violation("response", "a dict {obs, executed_steps, stopped_early}", _describe(data))
        )
    if "obs" not in data:
        raise ResponseError(Violation("response.obs", "a dict {worker_id: entry}", "missing"))
    entries = _parse_entries(data["obs"], expected_workers, "response.obs")
    ex = data.get("executed_steps")
    if not _is_count(ex):
        raise ResponseError(
            Violation(
                "response.executed_steps", "an int >= 0", "missing" if ex is None else _describe(ex)
            )
        )
    se = data.get("stopped_early")
    if not _is_bool(se):
        raise ResponseError(
            Violation(
                "response.stopped_early", "a bool", "missing" if se is None else _describe(se)
            )
        )
    return ChunkResponse(entries, int(ex), bool(se))


def parse_success_response(payload: Any, *, route: str = "") -> None:
    """Check a JSON control reply ``{"data": {"success": true}}`` (``/start_new_job``,
    ``/create_workers``, ``/kill``); raise ``ResponseError`` otherwise."""
    where = f"{route} response" if route else "response"
    data = payload.get("data") if isinstance(payload, Mapping) else None
    if not isinstance(data, Mapping):
        raise ResponseError(Violation(f"{where}.data", '{"success": true}', _describe(payload)))
    if data.get("success") is not True:
        raise ResponseError(Violation(f"{where}.data.success", "true", _short(data.get("success"))))


STATUS_VALUES = ("idle", "running", "complete", "incomplete")


@dataclass(frozen=True)
class ServerStatus:
    """``GET /status``.

    ``mean_scores`` is the server's ``results``: per task the MEAN SCORE (not a success rate,
    whatever the reference client printed). ``status`` is one of ``idle``, ``running``,
    ``complete``, ``incomplete`` (an unknown value of a newer server is kept as is).
    """

    status: str
    benchmark_id: str | None
    run_id: str | None
    total_episodes: int
    completed_episodes: int
    in_progress_episodes: int
    active_workers: tuple[str, ...]
    mean_scores: dict[str, float]
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def progress(self) -> float | None:
        """Completed fraction in [0, 1], or ``None`` when no episodes are configured."""
        if self.total_episodes <= 0:
            return None
        return min(1.0, self.completed_episodes / self.total_episodes)


def parse_status(payload: Any) -> ServerStatus:
    """Parse a ``/status`` reply ``{"data": {...}}`` (a bare ``{...}`` is accepted too).

    Fields missing in older servers default to 0 / empty; wrong types raise ``ResponseError``
    naming ``status.data.<field>``.
    """
    if isinstance(payload, Mapping) and isinstance(payload.get("data"), Mapping):
        data = payload["data"]
    elif isinstance(payload, Mapping) and "status" in payload:
        data = payload
    else:
        raise ResponseError(
            Violation("status.data", "a dict with a 'status' field", _describe(payload))
        )
    w = "status.data"
    st = data.get("status")
    if not isinstance(st, str):
        raise ResponseError(
            Violation(
                f"{w}.status",
                "one of " + ", ".join(STATUS_VALUES),
                "missing" if st is None else _describe(st),
            )
        )

    def opt_str(name: str) -> str | None:
        v = data.get(name)
        if v is not None and not isinstance(v, str):
            raise ResponseError(Violation(f"{w}.{name}", "a str or null", _describe(v)))
        return v

    def count(name: str) -> int:
        v = data.get(name, 0)
        if v is None:
            return 0
        if not _is_count(v):
            raise ResponseError(Violation(f"{w}.{name}", "an int >= 0", _describe(v)))
        return int(v)

    workers = data.get("active_workers", [])
    if workers is None:
        workers = []
    if not isinstance(workers, (list, tuple)):
        raise ResponseError(
            Violation(f"{w}.active_workers", "a list of worker ids", _describe(workers))
        )
    results = data.get("results", {})
    if results is None:
        results = {}
    if not isinstance(results, Mapping):
        raise ResponseError(
            Violation(f"{w}.results", "a dict {task: mean score}", _describe(results))
        )
    scores: dict[str, float] = {}
    for k, v in results.items():
        if not _is_number(v):
            raise ResponseError(Violation(f"{w}.results[{k!r}]", "a number", _describe(v)))
        scores[str(k)] = float(v)
    return ServerStatus(
        status=st,
        benchmark_id=opt_str("benchmark_id"),
        run_id=opt_str("run_id"),
        total_episodes=count("total_episodes"),
        completed_episodes=count("completed_episodes"),
        in_progress_episodes=count("in_progress_episodes"),
        active_workers=tuple(str(x) for x in workers),
        mean_scores=scores,
        raw=dict(data),
    )
