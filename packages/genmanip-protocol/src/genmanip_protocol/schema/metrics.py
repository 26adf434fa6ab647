"""Scores as the server reports them: the success rule, metric keys, metrics and episode results."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ResponseError, ValidationError, Violation
from ._checks import _describe, _is_bool, _is_number, _short
from .ids import split_episode_id

__all__ = [
    "SUCCESS_TOL",
    "EpisodeResult",
    "MetricKey",
    "TaskMetric",
    "is_success",
    "merge_metrics",
    "normalize_metric",
    "parse_episode_result",
    "parse_metric",
    "parse_metric_key",
]

# The name this warning was logged under before schema became a package: logging configs that
# silence or route it keep working.
log = logging.getLogger("genmanip_protocol.schema")


#: Tolerance of the server's success rule ``score == 1``.
SUCCESS_TOL = 1e-6


def is_success(score: float | None) -> bool:
    """The server's success rule: ``score == 1`` within 1e-6 (``None`` is not a success)."""
    return score is not None and abs(float(score) - 1.0) <= SUCCESS_TOL


_METRIC_KEY = re.compile(r"^(?P<star>\*)?(?:\((?P<done>\d+)/(?P<total>\d+)\))?(?P<task>.*)$", re.S)


@dataclass(frozen=True)
class MetricKey:
    """A parsed metric key: ``*`` = not complete, ``(done/total)`` = progress.

    ``done``/``total`` are ``None`` when the key carries no count (``*task``: nothing finished,
    so ``done`` is 0; a bare ``task`` from an old server: both ``None``).
    """

    task: str
    done: int | None
    total: int | None
    complete: bool


def parse_metric_key(key: str) -> MetricKey:
    """``"*(3/60)ebench/x/y"`` -> ``MetricKey("ebench/x/y", 3, 60, False)``; ``"*ebench/x"`` ->
    done 0, total None; ``"(60/60)ebench/x"`` -> complete.

    Raises ``ResponseError`` (field ``metric key``) for a non-string or an empty task.
    """
    if not isinstance(key, str):
        raise ResponseError(Violation("metric key", "a str", _describe(key)))
    m = _METRIC_KEY.match(key)
    if m is None or not m.group("task").strip():
        raise ResponseError(Violation("metric key", "[*][(done/total)]<task_name>", _short(key)))
    star = m.group("star") is not None
    task = m.group("task")
    if m.group("done") is not None:
        done, total = int(m.group("done")), int(m.group("total"))
        return MetricKey(task, done, total, complete=not star and done >= total)
    if star:
        return MetricKey(task, 0, None, complete=False)
    return MetricKey(task, None, None, complete=False)


@dataclass(frozen=True)
class TaskMetric:
    """One task's entry of a ``metric`` dict: progress plus mean score and mean success."""

    task: str
    done: int | None
    total: int | None
    complete: bool
    score: float
    sr: float
    key: str = ""


def _metric_value(value: Any, where: str) -> tuple[float, float]:
    if _is_number(value):
        # Old servers sent a bare mean score per task.
        x = float(value)
        return x, 1.0 if is_success(x) else 0.0
    if not isinstance(value, Mapping):
        raise ResponseError(
            Violation(where, '{"score": float, "sr": float} or a float', _describe(value))
        )
    if "score" not in value:
        raise ResponseError(Violation(f"{where}.score", "a number", "missing"))
    score = value["score"]
    if not _is_number(score):
        raise ResponseError(Violation(f"{where}.score", "a number", _describe(score)))
    sr_val = value.get("sr", value.get("success_rate"))
    if sr_val is None:
        sr = 1.0 if is_success(float(score)) else 0.0
    elif _is_number(sr_val) or _is_bool(sr_val):
        sr = float(sr_val)
    else:
        raise ResponseError(Violation(f"{where}.sr", "a number", _describe(sr_val)))
    return float(score), sr


def normalize_metric(metric: Any, *, where: str = "metric") -> dict[str, dict[str, float]] | None:
    """Return ``metric`` in the dict form ``{key: {"score", "sr"}}`` (bare floats converted)."""
    if metric is None:
        return None
    if not isinstance(metric, Mapping):
        raise ResponseError(
            Violation(where, "a dict {task_key: {score, sr}} or None", _describe(metric))
        )
    out: dict[str, dict[str, float]] = {}
    for k, v in metric.items():
        if not isinstance(k, str):
            raise ResponseError(Violation(f"{where} key", "a str", _describe(k)))
        score, sr = _metric_value(v, f"{where}[{k!r}]")
        out[k] = {"score": score, "sr": sr}
    return out


def parse_metric(metric: Any, *, where: str = "metric") -> dict[str, TaskMetric]:
    """Parse a ``metric`` dict into ``{task_name: TaskMetric}``; nothing is dropped.

    Accepts the dict form and old float values. If two keys name the same task (progress of two
    moments), the one with more finished episodes wins and a warning is logged.
    """
    norm = normalize_metric(metric, where=where) or {}
    out: dict[str, TaskMetric] = {}
    for k, v in norm.items():
        mk = parse_metric_key(k)
        tm = TaskMetric(mk.task, mk.done, mk.total, mk.complete, v["score"], v["sr"], key=k)
        prev = out.get(mk.task)
        if prev is not None:
            log.warning("metric has two keys for task %s: %r and %r", mk.task, prev.key, k)
            if (prev.done or 0) >= (tm.done or 0) and not tm.complete:
                continue
        out[mk.task] = tm
    return out


def merge_metrics(*metrics: Any) -> dict[str, TaskMetric]:
    """Merge the ``metric`` dicts of several workers (each holds the whole run's view).

    Per task the most advanced entry wins (complete first, then more finished episodes).
    """
    out: dict[str, TaskMetric] = {}
    for metric in metrics:
        for task, tm in parse_metric(metric).items():
            prev = out.get(task)
            if prev is None or (tm.complete, tm.done or 0) > (prev.complete, prev.done or 0):
                out[task] = tm
    return out


@dataclass(frozen=True)
class EpisodeResult:
    """A finished episode as the server reports it (``episode_result``, ``result_info.json``).

    ``score`` is in [0, 1] (partial credit possible); ``sr`` is 1.0 exactly when the score is 1.
    """

    episode_id: str
    task_name: str
    seed: str
    score: float
    sr: float

    @property
    def success(self) -> bool:
        """``score == 1`` within 1e-6 (the server's rule)."""
        return is_success(self.score)

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "task_name": self.task_name,
            "seed": self.seed,
            "score": self.score,
            "sr": self.sr,
        }


def parse_episode_result(data: Any, *, where: str = "episode_result") -> EpisodeResult | None:
    """Parse an ``episode_result`` dict (``sr`` or ``success_rate`` accepted); ``None`` stays None.

    ``task_name``/``seed`` missing are taken from ``episode_id``.
    """
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ResponseError(Violation(where, "a dict or None", _describe(data)))
    eid = data.get("episode_id")
    if not isinstance(eid, str):
        raise ResponseError(
            Violation(f"{where}.episode_id", "a str", "missing" if eid is None else _describe(eid))
        )
    score = data.get("score")
    if not _is_number(score):
        raise ResponseError(
            Violation(
                f"{where}.score", "a number", "missing" if score is None else _describe(score)
            )
        )
    task = data.get("task_name")
    seed = data.get("seed")
    if task is not None and not isinstance(task, str):
        raise ResponseError(Violation(f"{where}.task_name", "a str", _describe(task)))
    if (seed is not None and not isinstance(seed, (str, int))) or _is_bool(seed):
        raise ResponseError(Violation(f"{where}.seed", "a str", _describe(seed)))
    if task is None or seed is None:
        try:
            _, _, t, s = split_episode_id(eid, task_name=task)
        except ValidationError as exc:
            raise ResponseError(
                [Violation(f"{where}.{v.field}", v.expected, v.actual) for v in exc.violations]
            ) from None
        task = task if task is not None else t
        seed = seed if seed is not None else s
    score_f = float(score)  # type: ignore[arg-type]  # _is_number checked it above
    sr_val = data.get("sr", data.get("success_rate"))
    if sr_val is None:
        sr = 1.0 if is_success(score_f) else 0.0
    elif _is_number(sr_val) or _is_bool(sr_val):
        sr = float(sr_val)
    else:
        raise ResponseError(Violation(f"{where}.sr", "a number", _describe(sr_val)))
    return EpisodeResult(eid, str(task), str(seed), score_f, sr)
