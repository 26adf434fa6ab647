"""Parsing dtype strings that come off the wire, without handing numpy arbitrary text."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np

__all__ = ["parse_dtype"]

# Only plain scalar dtypes: an optional byte order, then a kind letter and an item size
# ("<f4", "|b1", "f8", "U3") or a common name ("float32", "bool"). numpy's own parser accepts far
# more (structured specs, deprecated aliases that warn, "O"), none of which belongs on the wire.
_SPEC_RE = re.compile(
    r"[<>|=]?(?:[biufcSU][0-9]{1,8}|\?|bool|u?int(?:8|16|32|64)|float(?:16|32|64)|complex(?:64|128))"
)
_CACHE: dict[str, np.dtype[Any]] = {}


def parse_dtype(spec: Any) -> np.dtype[Any] | None:
    """The numpy dtype for a wire dtype string, or None if it is not a plain scalar dtype spec."""
    if type(spec) is not str:
        return None
    dt = _CACHE.get(spec)
    if dt is not None:
        return dt
    if len(spec) > 16 or _SPEC_RE.fullmatch(spec) is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dt = np.dtype(spec)
    except (TypeError, ValueError):
        return None
    if len(_CACHE) < 4096:  # valid specs only, so the cache stays small anyway
        _CACHE[spec] = dt
    return dt
