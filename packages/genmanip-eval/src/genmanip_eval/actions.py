"""Turning what a user passes to :meth:`EvalClient.step` into per-worker action lists.

The accepted forms (``W`` = the client's worker ids, an *action dict* is a mapping with an
``"action"`` key):

==========================================  ===================  ===============================
input                                       meaning              sent as
==========================================  ===================  ===============================
``action_dict``                             one step, 1 worker   ``/step``
``{wid: action_dict, ...}``                 one step per worker  one ``/step`` for all of them
``[action_dict, ...]``                      a chunk, 1 worker    ``/step_chunk``
``{wid: [action_dict, ...], ...}``          a chunk per worker   one ``/step_chunk`` per worker
``[{wid: action_dict, ...}, ...]``          time-major chunk     transposed to the previous form
==========================================  ===================  ===============================

The decision is structural and never guessed from lengths: a mapping with an ``"action"`` key is
an action dict; any other mapping must be keyed by worker ids. A list of length 1 is still a chunk
(``/step_chunk``). Ragged per-worker chunks are allowed. Anything else raises
:class:`ActionInputError` (a ``ValidationError`` and a ``ValueError``) naming the position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genmanip_protocol.errors import ValidationError, Violation

__all__ = ["ActionInputError", "NormalizedActions", "is_action_dict", "normalize_step_input"]


class ActionInputError(ValidationError, ValueError):
    """``step()`` input of no accepted form. Also a ``ValueError``, as the reference client raised."""


def is_action_dict(value: object) -> bool:
    """True for a mapping that is one action (it has an ``"action"`` or ``"control_type"`` key)."""
    return isinstance(value, Mapping) and ("action" in value or "control_type" in value)


@dataclass(frozen=True)
class NormalizedActions:
    """Per-worker actions. ``chunk`` tells whether they go through ``/step_chunk``."""

    per_worker: dict[str, list[Mapping[str, Any]]]
    chunk: bool


def _bad(field: str, expected: str, actual: object) -> ActionInputError:
    return ActionInputError(Violation(field, expected, _describe(actual)))


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        keys = list(value)[:5]
        return f"a mapping with keys {keys!r}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"{type(value).__name__} {value!r}"[:120]


def _wid_key(key: object, workers: Sequence[str], field: str) -> str:
    wid = str(key)
    if wid not in workers:
        raise _bad(field, f"a worker id of this client ({', '.join(workers)})", key)
    return wid


def normalize_step_input(actions: object, workers: Sequence[str]) -> NormalizedActions:
    """Classify ``actions`` (see the module docstring) for the given worker ids."""
    if is_action_dict(actions):
        if len(workers) != 1:
            raise _bad(
                "actions",
                f"a mapping {{worker_id: action_dict}} (this client drives {len(workers)} workers)",
                actions,
            )
        return NormalizedActions({workers[0]: [actions]}, chunk=False)  # type: ignore[list-item]
    if isinstance(actions, Mapping):
        if not actions:
            raise _bad("actions", "at least one action", actions)
        values = list(actions.values())
        if all(is_action_dict(v) for v in values):
            return NormalizedActions(
                {_wid_key(k, workers, f"actions[{k!r}]"): [v] for k, v in actions.items()},
                chunk=False,
            )
        if all(isinstance(v, (list, tuple)) for v in values):
            out: dict[str, list[Mapping[str, Any]]] = {}
            for k, v in actions.items():
                wid = _wid_key(k, workers, f"actions[{k!r}]")
                if not v:
                    raise _bad(f"actions[{k!r}]", "a non-empty list of action dicts", v)
                for i, a in enumerate(v):
                    if not is_action_dict(a):
                        raise _bad(f"actions[{k!r}][{i}]", "an action dict", a)
                out[wid] = list(v)
            return NormalizedActions(out, chunk=True)
        raise _bad(
            "actions",
            "{worker_id: action_dict} or {worker_id: [action_dict, ...]} (not mixed)",
            actions,
        )
    if isinstance(actions, (list, tuple)):
        if not actions:
            raise _bad("actions", "a non-empty chunk", actions)
        if all(is_action_dict(a) for a in actions):
            if len(workers) != 1:
                raise _bad(
                    "actions",
                    f"{{worker_id: [action_dict, ...]}} (this client drives {len(workers)} workers)",
                    actions,
                )
            return NormalizedActions({workers[0]: list(actions)}, chunk=True)
        per: dict[str, list[Mapping[str, Any]]] = {}
        for t, elem in enumerate(actions):
            if not isinstance(elem, Mapping) or not elem or is_action_dict(elem):
                raise _bad(f"actions[{t}]", "{worker_id: action_dict} (time-major chunk)", elem)
            for k, a in elem.items():
                wid = _wid_key(k, workers, f"actions[{t}][{k!r}]")
                if not is_action_dict(a):
                    raise _bad(f"actions[{t}][{k!r}]", "an action dict", a)
                per.setdefault(wid, []).append(a)
        return NormalizedActions(per, chunk=True)
    raise _bad("actions", "an action dict, a mapping of worker ids, or a list (chunk)", actions)
