"""The bounds every decoder enforces before it allocates: depth, element count, size, array shapes.

A hostile peer (or file) can describe, in a few bytes, structures that cost gigabytes or crash the
interpreter: a 200,000-deep tuple used as a dict key overflows the C stack while it is hashed, a few
MB of "empty list" opcodes become millions of objects, a ``(2**31, 0, 2**31)`` array holds no data
but makes ``tolist()`` build two billion lists. Each decoder (the allow-list unpickler, the msgpack
header, tagged-value untagging, ``gmp validate``'s JSON reader) counts what it builds against the
limits below and raises :class:`~genmanip_protocol.errors.DecodeLimitError` (a
:class:`DecodeError`) naming the limit, so memory stays bounded by the
payload's own size plus a few tens of MiB, and nothing recurses in C deeper than :data:`MAX_DEPTH`.

The values are sized from the largest legitimate traffic (``robots.py``: the widest camera is
720x1280x3; a reply is < 6 levels deep and holds a few hundred values; the biggest plain-container
trees are chunked action requests and ``meta_record.pkl`` files, ~10**5 values) with a wide margin.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import DecodeLimitError

__all__ = [
    "MAX_ARRAY_BYTES",
    "MAX_ARRAY_ELEMENTS",
    "MAX_CONTAINERS",
    "MAX_COPY_SLACK",
    "MAX_DEPTH",
    "MAX_ELEMENTS",
    "MAX_EMPTY_ARRAY_ROWS",
    "MAX_IMAGE_SIDE",
    "MAX_NDIM",
    "brief_repr",
    "check_array_shape",
    "check_json_limits",
    "limit_error",
]

#: Containers nested deeper than this are refused on encode (EncodeError) and decode (DecodeError),
#: so neither a cyclic input nor a hostile payload can end in RecursionError or in a C-level
#: recursion (hashing a tuple, comparing, printing) that overflows the stack. Real trees are < 6
#: deep; 64 leaves a 10x margin and stays far below the ~10**4 levels where C recursion crashes.
MAX_DEPTH = 64

#: Containers (lists, dicts, tuples, sets) one payload may build. An empty set costs 232 bytes, an
#: empty list or dict 72-80, so this caps their memory at ~58 MiB however they are spelt (a 1-byte
#: opcode or a 1-byte msgpack ``0x90`` each). Legitimate trees: a reply has tens of containers, a
#: 100-step chunk for 64 workers sent as nested lists ~2*10**4: a 13x margin.
MAX_CONTAINERS = 1 << 18

#: Values placed into containers by one payload (counting every reference, so a list of one
#: object repeated counts each repeat). Each costs an 8-byte pointer, and the smallest distinct
#: objects (a 2-character str from 3 bytes of msgpack) ~60 bytes: <= 60 MiB. The largest
#: legitimate trees (``meta_record.pkl`` of a long episode, a chunked request) hold ~10**5
#: values: a 10x margin. Arrays count as one value whatever their size.
MAX_ELEMENTS = 1 << 20

#: Bytes that allow-listed pickle calls (``bytes(x)``, ``bytearray(x)``, ``_codecs.encode``, array
#: data held in a str) may copy while one pickle loads, beyond the payload's own size. A legitimate
#: pickle copies each of its data strings at most once; a "memo bomb" names one memoized 1 MB
#: string thousands of times (1 MB of pickle became 2 GB of copies).
MAX_COPY_SLACK = 1 << 20

#: Dimensions of one array (numpy's own limit is 64; real arrays have at most 4).
MAX_NDIM = 32

#: Elements of one array, and the bound on every single dimension and on the product of the
#: non-zero dimensions (so ``(0, 2**40)`` and ``(2**31, 0, 2**31)`` are refused although they hold
#: no data). The widest camera frame is 720x1280x3 = 2.8 M elements; 2**28 is 97 such frames.
MAX_ARRAY_ELEMENTS = 1 << 28

#: Bytes of one array (2 GiB). Decoded arrays are views of the payload, so this only matters for
#: consumers that copy them; a camera frame is 2.6 MiB, a stacked episode a few hundred MiB.
MAX_ARRAY_BYTES = 1 << 31

#: An array without elements may still have up to this many empty rows before its first zero
#: dimension: iterating it or calling ``tolist()`` visits each of them (``(2**30, 0)`` would build a
#: billion empty lists). Legitimate empty arrays are ``(0,)``, ``(0, 7)``, ``(0, 480, 640, 3)``.
MAX_EMPTY_ARRAY_ROWS = 1 << 16

#: Largest height or width of a camera frame or image (JPEG's own format limit; the widest camera
#: is 1280). The pixel count is bounded separately by ``jpeg.MAX_JPEG_PIXELS``.
MAX_IMAGE_SIDE = 65535


def limit_error(
    message: str, limit: str, *, codec: str, bound: int | None = None
) -> DecodeLimitError:
    """A :class:`DecodeLimitError` for the limit named ``limit`` (a constant of this module unless
    ``bound`` is given)."""
    value = int(globals()[limit]) if bound is None else bound
    return DecodeLimitError(message, limit=limit, bound=value, codec=codec)


def check_array_shape(shape: Sequence[int], itemsize: int, *, what: str, codec: str) -> int:
    """Check an array shape (non-negative ints already) against the array limits.

    Returns the element count. Raises :class:`DecodeLimitError` naming ``what`` and the limit exceeded.
    """
    if len(shape) > MAX_NDIM:
        raise limit_error(
            f"{what}: {len(shape)} dimensions exceed the limit of {MAX_NDIM}",
            "MAX_NDIM",
            codec=codec,
        )
    count = 1
    extent = 1  # product of the non-zero dimensions
    rows = 1  # product of the dimensions before the first zero
    zero = False
    for d in shape:
        if d > MAX_ARRAY_ELEMENTS:
            raise limit_error(
                f"{what}: dimension {d} of shape {_brief_shape(shape)} exceeds the limit of "
                f"{MAX_ARRAY_ELEMENTS} elements",
                "MAX_ARRAY_ELEMENTS",
                codec=codec,
            )
        count *= d
        if d:
            extent *= d
            if not zero:
                rows *= d
        else:
            zero = True
        if extent > MAX_ARRAY_ELEMENTS:
            raise limit_error(
                f"{what}: shape {_brief_shape(shape)} spans more than {MAX_ARRAY_ELEMENTS} "
                "elements (zero dimensions not counted)",
                "MAX_ARRAY_ELEMENTS",
                codec=codec,
            )
    if zero and rows > MAX_EMPTY_ARRAY_ROWS:
        raise limit_error(
            f"{what}: empty array of shape {_brief_shape(shape)} has {rows} empty rows, over the "
            f"limit of {MAX_EMPTY_ARRAY_ROWS}",
            "MAX_EMPTY_ARRAY_ROWS",
            codec=codec,
        )
    if count * itemsize > MAX_ARRAY_BYTES:
        raise limit_error(
            f"{what}: shape {_brief_shape(shape)} of {itemsize}-byte items needs "
            f"{count * itemsize} bytes, over the limit of {MAX_ARRAY_BYTES}",
            "MAX_ARRAY_BYTES",
            codec=codec,
        )
    return count


def _brief_shape(shape: Sequence[int]) -> str:
    return str(list(shape))[:120]


# A JSON string: quotes around runs of anything but quote/backslash, or escapes. Unrolled, so the
# regex engine runs in linear time on any input (no nested alternation to backtrack into).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_SCAN_CHUNK = 1 << 20


def check_json_limits(data: bytes, *, what: str = "JSON document") -> None:
    """Refuse JSON text nested deeper than :data:`MAX_DEPTH`, holding more than
    :data:`MAX_CONTAINERS` arrays/objects or more than :data:`MAX_ELEMENTS` values, *before*
    ``json.loads`` sees it.

    ``json.loads`` recurses once per nesting level (100,000 ``[`` raise RecursionError) and builds
    a 72-byte list for every 3 bytes of ``[],``. The scan is linear and allocates little: strings
    are cut out with one regex (lexed exactly as the parser lexes them up to its first error), then
    only the brackets are kept and their running depth summed in chunks. Malformed JSON passes
    through to the parser, which reports it. Raises :class:`DecodeLimitError` (``codec="json"``).
    """
    openers = data.count(b"[") + data.count(b"{")
    if openers <= MAX_DEPTH and _values(data, openers) <= MAX_ELEMENTS:
        return  # cannot nest deeper than it has brackets: the common case, all counting in C
    body = _JSON_STRING.sub(b"", data) if b'"' in data else data
    openers = body.count(b"[") + body.count(b"{")
    if openers > MAX_CONTAINERS:
        raise limit_error(
            f"{what}: {openers} arrays/objects exceed the limit of {MAX_CONTAINERS}",
            "MAX_CONTAINERS",
            codec="json",
        )
    values = _values(body, openers)
    if values > MAX_ELEMENTS:
        raise limit_error(
            f"{what}: about {values} values exceed the limit of {MAX_ELEMENTS}",
            "MAX_ELEMENTS",
            codec="json",
        )
    if openers <= MAX_DEPTH:
        return
    depth = _max_bracket_depth(body.translate(None, _NOT_BRACKETS))
    if depth > MAX_DEPTH:
        raise limit_error(
            f"{what}: nested {depth} levels deep, over the limit of {MAX_DEPTH}",
            "MAX_DEPTH",
            codec="json",
        )


def _values(body: bytes, openers: int) -> int:
    # One value per separator (object keys count like msgpack map keys), plus one per container.
    return body.count(b",") + body.count(b":") + openers


def _max_bracket_depth(brackets: bytes) -> int:
    """The deepest running nesting level of a string of ``[]{}`` bytes (chunked: <= 8 MiB)."""
    import numpy as np

    steps = np.zeros(256, dtype=np.int8)
    steps[list(b"[{")] = 1
    steps[list(b"]}")] = -1
    raw = np.frombuffer(brackets, dtype=np.uint8)
    level = best = 0
    for start in range(0, raw.size, _SCAN_CHUNK):
        running = np.cumsum(steps[raw[start : start + _SCAN_CHUNK]], dtype=np.int64) + level
        best = max(best, int(running.max()))
        level = int(running[-1])
    return best


def brief_repr(obj: Any, limit: int = 60) -> str:
    """A short repr for error messages that never builds the repr of a huge or deep value."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel = 3
    r.maxstring = limit
    r.maxother = limit
    return r.repr(obj)[: limit + 20]
