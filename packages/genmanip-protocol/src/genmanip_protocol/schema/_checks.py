"""Helpers shared by the schema modules: how a value is described and where a violation goes.

Private: the messages they build are part of the public wording (``expected ..., got ...``), so
every schema module uses these instead of phrasing values its own way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import Violation

__all__ = ["_Ctx", "_describe", "_is_bool", "_is_number", "_short"]


#: What counts as a number on the wire (bools are excluded separately by ``_is_number``).
_Number = (int, float, np.integer, np.floating)


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a huge value cannot flood a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> str:
    """Say what a value *is*, for the 'got ...' part of a message."""
    if isinstance(value, np.ndarray):
        return f"numpy array of shape {tuple(value.shape)} dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} values"
    if isinstance(value, (bool, np.bool_)):
        return f"bool {bool(value)}"
    if isinstance(value, _Number):
        return f"{type(value).__name__} {value!r}"
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"str {_short(value)}"
    return type(value).__name__


def _is_number(x: Any) -> bool:
    """A Python or numpy number; bools are not (``True`` would otherwise pass as 1)."""
    return isinstance(x, _Number) and not isinstance(x, (bool, np.bool_))


def _is_bool(x: Any) -> bool:
    """A Python or numpy bool."""
    return isinstance(x, (bool, np.bool_))


class _Ctx:
    """Where violations are attached: worker, step, location."""

    __slots__ = ("location", "out", "step", "worker")

    def __init__(self, worker: Any, step: int | None, location: str | None) -> None:
        self.worker = None if worker is None else str(worker)
        self.step = step
        self.location = location
        self.out: list[Violation] = []

    def add(self, field_: str, expected: str, actual: str) -> None:
        self.out.append(
            Violation(
                field_,
                expected,
                actual,
                worker=self.worker,
                step=self.step,
                location=self.location,
            )
        )
