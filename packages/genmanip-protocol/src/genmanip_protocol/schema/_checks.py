"""Helpers shared by the schema modules: how a value is described and where a violation goes.

Private: the messages they build are part of the public wording (``expected ..., got ...``), so
every schema module uses these instead of phrasing values its own way.
"""

from __future__ import annotations

import sys
from typing import Any, TypeGuard

import numpy as np

from ..errors import Violation

__all__ = ["MAX_COUNT", "_Ctx", "_describe", "_is_bool", "_is_count", "_is_number", "_short"]


#: What counts as a number on the wire (bools are excluded separately by ``_is_number``).
_Number = (int, float, np.integer, np.floating)
#: Python ints beyond this do not fit a float (``float(10**400)`` raises OverflowError).
_FLOAT_MAX_INT = int(sys.float_info.max)
#: Ints with more bits than this are described by their size, not their digits (``repr`` of an
#: int over 4300 digits raises ValueError, and a 400-digit value floods a message anyway).
_SHOWN_INT_BITS = 128


def _int_size(value: int) -> str:
    digits = int(value.bit_length() * 0.30103) + 1  # log10(2): no str() of a huge int
    return f"int of about {digits} digits"


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a huge value cannot flood a message."""
    if isinstance(value, int) and value.bit_length() > _SHOWN_INT_BITS:
        return _int_size(value)
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        # an int too long for repr inside a container, or a container nested past the stack
        return f"{type(value).__name__} (too large to show)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> str:
    """Say what a value *is*, for the 'got ...' part of a message."""
    if isinstance(value, np.ndarray):
        return f"numpy array of shape {tuple(value.shape)} dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} values"
    if isinstance(value, (bool, np.bool_)):
        return f"bool {bool(value)}"
    if isinstance(value, int) and value.bit_length() > _SHOWN_INT_BITS:
        return _int_size(value)
    if isinstance(value, _Number):
        return f"{type(value).__name__} {value!r}"
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"str {_short(value)}"
    return type(value).__name__


def _is_number(x: Any) -> bool:
    """A Python or numpy number that converts to a float; bools are not (``True`` would otherwise
    pass as 1), nor Python ints beyond the float range (``float()`` of them raises OverflowError,
    so every caller may convert what passes)."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, int):
        return -_FLOAT_MAX_INT <= x <= _FLOAT_MAX_INT
    return isinstance(x, _Number)


#: The largest count (steps, timestep, episodes) a reply may carry: counts are stored in JSON and
#: used in float arithmetic, where a bigger Python int raises (``json.dumps`` of one over 4300
#: digits, ``10**400 / 3``); no real count comes near it.
MAX_COUNT = 2**63 - 1


def _is_count(x: Any) -> TypeGuard[int | np.integer[Any]]:
    """An int (Python or numpy, not a bool) in ``0..MAX_COUNT``."""
    return bool(isinstance(x, (int, np.integer)) and not _is_bool(x) and 0 <= x <= MAX_COUNT)


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
