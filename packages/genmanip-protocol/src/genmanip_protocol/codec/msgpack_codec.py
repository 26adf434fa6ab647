"""The msgpack wire: a msgpack header plus out-of-band, 64-byte aligned array buffers.

Frame layout (all integers little-endian)::

    offset 0   magic  b"GMPK"
           4   u8     protocol version (1)
           5   u8     flags (0; reserved)
           6   u16    reserved (0)
           8   u32    number of buffers N
          12   u32    header length L
          16   N x (u64 offset, u64 length)   buffer table; offsets from the start of the frame
      16+16N   L bytes msgpack header: the object tree, arrays replaced by ext references
               padding, then each buffer at a 64-byte aligned offset

Ext types inside the header:

* code 1, array: msgpack ``[dtype, shape, buffer_index]`` with ``dtype`` the numpy ``dtype.str``
  (explicit byte order, e.g. ``"<f4"``, ``">i8"``, ``"|u1"``, ``"|b1"``); the buffer holds the array
  in C order and its length must equal ``prod(shape) * itemsize``.
* code 2, JPEG frame: msgpack ``[shape, jpeg_bytes]`` (see :class:`JpegFrame`).

Decoding returns read-only ``np.frombuffer`` views into the input buffer (no copy when given
``bytes``); every offset, length and shape is validated before a view is made, so a hostile header
cannot make the decoder allocate.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from ..errors import DecodeError, EncodeError
from ._base import MAX_DEPTH, MSGPACK_CONTENT_TYPE, Codec
from ._dtypes import parse_dtype
from .images import JPEG_MAGIC, refused_format
from .jpeg import MAX_JPEG_PIXELS
from .limits import (
    MAX_CONTAINERS,
    MAX_ELEMENTS,
    MAX_IMAGE_SIDE,
    MAX_NDIM,
    brief_repr,
    check_array_shape,
    limit_error,
)
from .observation import JpegFrame, Observation, is_observation_dict

__all__ = ["MAGIC", "MSGPACK_PROTOCOL_VERSION", "MsgpackCodec"]

MAGIC = b"GMPK"
MSGPACK_PROTOCOL_VERSION = 1
ALIGN = 64
EXT_ARRAY = 1
EXT_JPEG = 2

_PREFIX = struct.Struct("<4sBBHII")
_PREFIX_LEN = _PREFIX.size  # 16
#: Buffers one frame may declare: the table is parsed into Python ints (~80 bytes per entry), and
#: a real reply has a few hundred arrays (64 workers x ~6).
_MAX_BUFFERS = 1 << 16
#: Header bytes. Large only because JPEG frames travel inside it (64 workers x 4 cameras).
_MAX_HEADER = 256 * 1024 * 1024
#: Headers up to this size are unpacked without a pre-scan: even 64 KiB of one-byte empty
#: containers cost only ~5 MiB. Larger ones are scanned first (:func:`_scan`).
_SCAN_ABOVE = 64 * 1024
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1
#: numpy kinds that travel as arrays: bool, signed/unsigned int, float, complex.
_ARRAY_KINDS = frozenset("biufc")
_PAD = bytes(ALIGN)


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _path_str(path: list[Any]) -> str:
    if not path:
        return "<root>"
    return "".join(f"[{p!r}]" for p in path)


class _Encoder:
    """One encode call: walks the tree once, replacing arrays by ext references."""

    __slots__ = ("buffers", "path")

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []
        self.path: list[Any] = []

    def fail(self, what: str) -> EncodeError:
        return EncodeError(f"msgpack codec cannot encode {_path_str(self.path)}: {what}")

    def array_ref(self, arr: np.ndarray) -> msgpack.ExtType:
        dt = arr.dtype
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise self.fail(
                f"arrays of dtype {dt} (kind {dt.kind!r}) are not supported; "
                "only bool, integer, float and complex arrays travel on the wire"
            )
        if arr.ndim > MAX_NDIM:
            raise self.fail(f"array has {arr.ndim} dimensions (limit {MAX_NDIM})")
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        idx = len(self.buffers)
        self.buffers.append(arr)
        return msgpack.ExtType(EXT_ARRAY, msgpack.packb([dt.str, list(arr.shape), idx]))

    def walk(self, obj: Any, depth: int) -> Any:
        t = type(obj)
        # Exact-type fast paths first: these are nearly every node of a real tree.
        if t is str or t is float or t is bool or obj is None or t is bytes:
            return obj
        if t is int:
            if not _INT_MIN <= obj <= _INT_MAX:
                raise self.fail(f"integer {obj} is outside the 64-bit range")
            return obj
        if depth >= MAX_DEPTH:
            if isinstance(obj, (dict, list, tuple, Mapping)):
                raise self.fail(f"nesting deeper than {MAX_DEPTH} levels (a cycle?)")
        if t is np.ndarray:
            return self.array_ref(obj)
        if t is dict or isinstance(obj, Mapping):
            items = obj.raw_items() if isinstance(obj, Observation) else obj.items()
            out: dict[Any, Any] = {}
            path = self.path
            for key, v in items:
                k = key
                if type(k) is not str:
                    if isinstance(k, str):
                        k = str(k)
                    elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
                        k = int(k)
                        if not _INT_MIN <= k <= _INT_MAX:
                            raise self.fail(f"dict key {k} is outside the 64-bit range")
                    else:
                        raise self.fail(
                            f"dict key {k!r} of type {type(k).__name__} (keys must be str or int)"
                        )
                path.append(k)
                out[k] = self.walk(v, depth + 1)
                path.pop()
            return out
        if t is list or t is tuple:
            path = self.path
            res = []
            for i, v in enumerate(obj):
                path.append(i)
                res.append(self.walk(v, depth + 1))
                path.pop()
            return res
        if t is JpegFrame:
            return msgpack.ExtType(EXT_JPEG, msgpack.packb([list(obj.shape), obj.data]))
        if isinstance(
            obj, np.ndarray
        ):  # subclasses (np.matrix, masked arrays) travel as plain arrays
            return self.array_ref(np.asarray(obj).view(np.ndarray))
        if isinstance(obj, np.generic):
            return self.scalar(obj)
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return self.walk(int(obj), depth)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        if isinstance(obj, (list, tuple)):
            return self.walk(list(obj), depth)
        raise self.fail(
            f"unsupported type {t.__module__}.{t.__qualname__} (supported: None, bool, int, float, str, "
            "bytes, list, tuple, dict, numpy arrays and scalars, JpegFrame)"
        )

    def scalar(self, obj: np.generic) -> Any:
        # Numeric numpy scalars become Python scalars (what JSON-minded consumers expect and what
        # the legacy wire does); complex ones become 0-d arrays since msgpack has no complex type.
        kind = obj.dtype.kind
        if kind == "b":
            return bool(obj)
        if kind in "iu":
            v = int(obj)
            return v
        if kind == "f":
            return float(obj)
        if kind == "c":
            return self.array_ref(np.asarray(obj))
        if kind in "US":
            return obj.item()
        raise self.fail(f"numpy scalar of dtype {obj.dtype} is not supported")


class MsgpackCodec(Codec):
    """The fast wire: msgpack header + out-of-band array buffers, zero-copy decode.

    Supported values: None, bool, int (64-bit), float, str, bytes, list/tuple (tuples decode as
    lists), dict with str or int keys, numpy arrays of bool/int/uint/float/complex dtypes in either
    byte order (0-d and empty included), numpy scalars (bool/int/float become Python scalars,
    complex become 0-d arrays), :class:`JpegFrame`. Decoded dicts with ``video.*``/``state.*`` keys
    become :class:`Observation` objects; decoded arrays are read-only.
    """

    name = "msgpack"
    content_type = MSGPACK_CONTENT_TYPE

    def __init__(self, *, max_size: int = 1 << 32) -> None:
        #: Bodies larger than this are refused by :meth:`decode` (DecodeError).
        self.max_size = max_size

    # -- encode -----------------------------------------------------------------------------------
    def encode_parts(self, obj: Any) -> list[bytes | memoryview]:
        """Frame parts: ``[prefix+table+header+padding, buffer0, padding, buffer1, ...]``.

        Array parts are memoryviews of the caller's (C-contiguous) arrays: keep them unmodified
        until the parts are sent.
        """
        enc = _Encoder()
        tree = enc.walk(obj, 0)
        try:
            header = msgpack.packb(tree, use_bin_type=True)
        except (OverflowError, TypeError, ValueError) as exc:
            raise EncodeError(f"msgpack codec cannot encode the value: {exc}") from None
        n = len(enc.buffers)
        if n > _MAX_BUFFERS:  # the decoder refuses such frames (see _MAX_BUFFERS)
            raise EncodeError(f"msgpack codec cannot encode {n} arrays in one frame (limit {_MAX_BUFFERS})")
        table_len = 16 * n
        pos = _align(_PREFIX_LEN + table_len + len(header))
        table: list[int] = []
        parts: list[bytes | memoryview] = []
        tail_pads: list[int] = []
        for arr in enc.buffers:
            nbytes = arr.nbytes
            table.append(pos)
            table.append(nbytes)
            end = pos + nbytes
            nxt = _align(end)
            tail_pads.append(nxt - end)
            pos = nxt
        first = b"".join(
            (
                _PREFIX.pack(MAGIC, MSGPACK_PROTOCOL_VERSION, 0, 0, n, len(header)),
                struct.pack(f"<{2 * n}Q", *table),
                header,
            )
        )
        first += _PAD[: _align(len(first)) - len(first)]
        parts.append(first)
        for i, arr in enumerate(enc.buffers):
            if arr.nbytes:
                parts.append(arr.reshape(-1).view(np.uint8).data)
            pad = tail_pads[i]
            # The last buffer needs no trailing padding.
            if pad and i != n - 1:
                parts.append(_PAD[:pad])
        return parts

    def encode(self, obj: Any) -> bytes:
        """Encode ``obj`` to one bytes object (a copy of every array buffer)."""
        return b"".join(self.encode_parts(obj))

    # -- decode -----------------------------------------------------------------------------------
    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """Decode one frame. Arrays are read-only views of ``data`` (which they keep alive)."""
        try:
            mv = memoryview(data)
        except TypeError:
            raise DecodeError(
                f"expected bytes, got {type(data).__name__}", codec="msgpack"
            ) from None
        if mv.ndim != 1 or mv.itemsize != 1 or mv.format != "B":
            try:
                mv = mv.cast("B")
            except TypeError:  # non-contiguous buffers cannot be viewed as bytes
                raise DecodeError(
                    "expected a contiguous bytes-like body", codec="msgpack"
                ) from None
        total = mv.nbytes
        if total > self.max_size:
            raise DecodeError(
                f"frame of {total} bytes exceeds the limit of {self.max_size}", codec="msgpack"
            )
        if total < _PREFIX_LEN:
            raise DecodeError(
                f"truncated frame: {total} bytes, the prefix alone is {_PREFIX_LEN}",
                codec="msgpack",
            )
        magic, version, _flags, _res, n, hlen = _PREFIX.unpack_from(mv, 0)
        if magic != MAGIC:
            raise DecodeError(
                f"not a genmanip msgpack frame (magic {bytes(magic)!r}, expected {MAGIC!r})",
                codec="msgpack",
            )
        if version != MSGPACK_PROTOCOL_VERSION:
            raise DecodeError(
                f"unsupported msgpack frame version {version} (this client speaks {MSGPACK_PROTOCOL_VERSION})",
                codec="msgpack",
                hint="upgrade genmanip-protocol on the older side",
            )
        if n > _MAX_BUFFERS or hlen > _MAX_HEADER:
            raise DecodeError(
                f"frame declares {n} buffers and a {hlen}-byte header: over the limits",
                codec="msgpack",
            )
        header_start = _PREFIX_LEN + 16 * n
        header_end = header_start + hlen
        if header_end > total:
            raise DecodeError(
                f"truncated frame: header ends at byte {header_end}, frame has {total}",
                codec="msgpack",
            )
        raw_table = struct.unpack_from(f"<{2 * n}Q", mv, _PREFIX_LEN) if n else ()
        buffers: list[tuple[int, int]] = []
        for i in range(n):
            off, ln = raw_table[2 * i], raw_table[2 * i + 1]
            if off < header_end or off + ln > total:
                raise DecodeError(
                    f"buffer {i} (offset {off}, length {ln}) lies outside the frame's data section "
                    f"[{header_end}, {total})",
                    codec="msgpack",
                )
            buffers.append((off, ln))

        def ext_hook(code: int, payload: bytes) -> Any:
            if code == EXT_ARRAY:
                return _make_array(mv, buffers, payload)
            if code == EXT_JPEG:
                return _make_jpeg(payload)
            raise DecodeError(f"unknown ext type {code} in header", codec="msgpack")

        tree = _unpack(mv[header_start:header_end], ext_hook, "header")
        return _finish(tree, 0)

    def decode_plain(self, data: bytes | bytearray | memoryview) -> Any:
        """Decode a plain msgpack document (no frame) within the same limits.

        For files (``gmp validate``): the tree is returned as msgpack builds it (observation
        dicts are not wrapped, ext values stay ``msgpack.ExtType``). Raises :class:`DecodeError`
        like :meth:`decode`.
        """
        try:
            mv = memoryview(data).cast("B")
        except TypeError:
            raise DecodeError(
                f"expected contiguous bytes, got {type(data).__name__}", codec="msgpack"
            ) from None
        if mv.nbytes > self.max_size:
            raise DecodeError(
                f"document of {mv.nbytes} bytes exceeds the limit of {self.max_size}",
                codec="msgpack",
            )
        return _finish(_unpack(mv, msgpack.ExtType, "document"), 0, wrap=False)


def _make_array(mv: memoryview, buffers: list[tuple[int, int]], payload: bytes) -> np.ndarray:
    try:
        ref = msgpack.unpackb(payload, raw=False, use_list=True, **_REF_LIMITS)
    except Exception as exc:
        raise DecodeError(f"malformed array reference: {exc}", codec="msgpack") from None
    if not (isinstance(ref, list) and len(ref) == 3):
        raise DecodeError("array reference: expected [dtype, shape, buffer]", codec="msgpack")
    dstr, shape, idx = ref
    dt = parse_dtype(dstr)
    if dt is None:
        raise DecodeError(f"array reference: bad dtype {brief_repr(dstr, 40)}", codec="msgpack")
    if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise DecodeError(
            f"array reference: dtype {dstr!r} is not allowed (object/void/structured)",
            codec="msgpack",
        )
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise DecodeError(f"array reference: bad shape {brief_repr(shape)}", codec="msgpack")
    for d in shape:
        if type(d) is not int or d < 0:
            raise DecodeError(f"array reference: bad shape {brief_repr(shape)}", codec="msgpack")
    if type(idx) is not int or not 0 <= idx < len(buffers):
        raise DecodeError(
            f"array reference: buffer index {idx!r} out of range ({len(buffers)} buffers)",
            codec="msgpack",
        )
    off, ln = buffers[idx]
    # Also for shapes without data: (0, 2**40) needs 0 bytes but is refused like any huge shape.
    count = check_array_shape(shape, dt.itemsize, what="array reference", codec="msgpack")
    if count * dt.itemsize != ln:
        raise DecodeError(
            f"array reference: shape {shape} of {dstr} needs {count * dt.itemsize} bytes, buffer {idx} has {ln}",
            codec="msgpack",
        )
    arr = np.frombuffer(mv, dtype=dt, count=count, offset=off) if count else np.empty(0, dtype=dt)
    arr = arr.reshape(shape)
    arr.flags.writeable = False
    return arr


def _make_jpeg(payload: bytes) -> JpegFrame:
    try:
        ref = msgpack.unpackb(payload, raw=False, use_list=True, **_REF_LIMITS)
        shape, data = ref
        if not isinstance(data, bytes):
            raise TypeError("data is not bytes")
        frame = JpegFrame(data, shape)
    except Exception as exc:
        raise DecodeError(f"malformed JPEG frame reference: {exc}", codec="msgpack") from None
    h, w, _ = frame.shape
    if h > MAX_IMAGE_SIDE or w > MAX_IMAGE_SIDE or h * w > MAX_JPEG_PIXELS:
        raise limit_error(
            f"JPEG frame of shape {list(frame.shape)} exceeds the limit of {MAX_JPEG_PIXELS} "
            f"pixels ({MAX_IMAGE_SIDE} per side)",
            "MAX_JPEG_PIXELS",
            codec="msgpack",
            bound=MAX_JPEG_PIXELS,
        )
    # Checked here, not only when decoded: recorders hand the bytes straight to a video encoder.
    if not data.startswith(JPEG_MAGIC):
        raise DecodeError(f"JPEG frame: {refused_format(data, ('JPEG',))}", codec="msgpack")
    return frame


#: An array or JPEG reference is ``[dtype, shape, index]`` or ``[shape, bytes]``: a few values.
_REF_LIMITS: dict[str, int] = {"max_array_len": MAX_NDIM + 3, "max_map_len": 0}


def _unpack(data: memoryview | bytes, ext_hook: Any, what: str) -> Any:
    """``msgpack.unpackb`` within the limits; large inputs are pre-scanned (:func:`_scan`)."""
    n = len(data)
    if n > _SCAN_ABOVE:
        _scan(data, what)
    cap = min(n, MAX_ELEMENTS)
    try:
        return msgpack.unpackb(
            data,
            ext_hook=ext_hook,
            raw=False,
            use_list=True,
            strict_map_key=False,
            max_array_len=cap,
            max_map_len=cap,
        )
    except DecodeError:
        raise
    except msgpack.StackError:
        raise limit_error(
            f"{what} nested too deeply (limit {MAX_DEPTH})", "MAX_DEPTH", codec="msgpack"
        ) from None
    except Exception as exc:  # msgpack raises ExtraData, FormatError, ValueError, TypeError, ...
        raise DecodeError(
            f"malformed msgpack {what}: {type(exc).__name__}: {exc}"[:300], codec="msgpack"
        ) from None


# First byte -> (kind, n): kind 0 = scalar followed by n bytes; 1 = str/bin with an n-byte length;
# 2 = ext with an n-byte length (+ 1 type byte); 3 = fixext of n bytes (+ 1 type byte);
# 4 = array of n items (n < 0: count in the next -n bytes); 5 = map, likewise; 6 = invalid (0xc1).
def _build_table() -> list[tuple[int, int]]:
    t = [(6, 0)] * 256
    for b in range(0x00, 0x80):
        t[b] = (0, 0)
    for b in range(0xE0, 0x100):
        t[b] = (0, 0)
    for b in range(0x80, 0x90):
        t[b] = (5, b & 0x0F)
    for b in range(0x90, 0xA0):
        t[b] = (4, b & 0x0F)
    for b in range(0xA0, 0xC0):
        t[b] = (0, b & 0x1F)
    for b, v in {
        0xC0: (0, 0), 0xC2: (0, 0), 0xC3: (0, 0),
        0xC4: (1, 1), 0xC5: (1, 2), 0xC6: (1, 4),
        0xC7: (2, 1), 0xC8: (2, 2), 0xC9: (2, 4),
        0xCA: (0, 4), 0xCB: (0, 8), 0xCC: (0, 1), 0xCD: (0, 2), 0xCE: (0, 4), 0xCF: (0, 8),
        0xD0: (0, 1), 0xD1: (0, 2), 0xD2: (0, 4), 0xD3: (0, 8),
        0xD4: (3, 1), 0xD5: (3, 2), 0xD6: (3, 4), 0xD7: (3, 8), 0xD8: (3, 16),
        0xD9: (1, 1), 0xDA: (1, 2), 0xDB: (1, 4),
        0xDC: (4, -2), 0xDD: (4, -4), 0xDE: (5, -2), 0xDF: (5, -4),
    }.items():  # fmt: skip
        t[b] = v
    return t


_TABLE = _build_table()


def _scan(data: memoryview | bytes, what: str) -> None:
    """Count the containers, values and depth of one msgpack object without building it.

    msgpack-python allocates as it parses (an empty list per ``0x90`` byte: 4 MB of them were
    4 million lists) and has no total-count limit, so a large header is walked first, iteratively,
    skipping str/bin/ext payloads in O(1). Stops at the first limit exceeded
    (:class:`~genmanip_protocol.errors.DecodeLimitError`); malformed or truncated input is left to
    msgpack to report. Depth is counted like :func:`_finish` counts it.
    """
    buf = data if isinstance(data, bytes) else memoryview(data).cast("B")
    end = len(buf)
    table = _TABLE
    pos = 0
    containers = elements = 0
    stack: list[int] = []  # items still to read in each enclosing container
    left = 1  # items still to read at this level (the root: one object)
    try:
        while True:
            if not left:
                if not stack:
                    return
                left = stack.pop()
                continue
            left -= 1
            kind, n = table[buf[pos]]
            pos += 1
            if kind == 0:
                pos += n
            elif kind == 1:
                pos += n + int.from_bytes(buf[pos : pos + n], "big")
            elif kind == 2:
                pos += n + 1 + int.from_bytes(buf[pos : pos + n], "big")
            elif kind == 3:
                pos += n + 1
            elif kind == 6:
                return  # 0xc1: msgpack reports it
            else:
                if n < 0:
                    n, pos = int.from_bytes(buf[pos : pos - n], "big"), pos - n
                if kind == 5:
                    n *= 2
                containers += 1
                elements += n
                if len(stack) >= MAX_DEPTH:
                    raise limit_error(
                        f"msgpack {what} nested deeper than {MAX_DEPTH} levels",
                        "MAX_DEPTH",
                        codec="msgpack",
                    )
                if containers > MAX_CONTAINERS:
                    raise limit_error(
                        f"msgpack {what} holds more than {MAX_CONTAINERS} arrays/maps",
                        "MAX_CONTAINERS",
                        codec="msgpack",
                    )
                if elements > MAX_ELEMENTS:
                    raise limit_error(
                        f"msgpack {what} holds more than {MAX_ELEMENTS} values",
                        "MAX_ELEMENTS",
                        codec="msgpack",
                    )
                if n:
                    stack.append(left)
                    left = n
            if pos > end:
                return  # truncated: msgpack reports it
    except IndexError:
        return  # truncated: msgpack reports it


def _finish(node: Any, depth: int, wrap: bool = True) -> Any:
    """Wrap observation dicts as Observations (unless ``wrap`` is False) and enforce the depth
    limit (in place)."""
    t = type(node)
    if t is dict:
        if depth >= MAX_DEPTH:
            raise limit_error(
                f"header nested deeper than {MAX_DEPTH} levels", "MAX_DEPTH", codec="msgpack"
            )
        for k, v in node.items():
            tk = type(k)
            if tk is not str and tk is not int:
                raise DecodeError(
                    f"map key of type {tk.__name__} (keys must be str or int)", codec="msgpack"
                )
            tv = type(v)
            if tv is dict or tv is list:
                node[k] = _finish(v, depth + 1, wrap)
        if wrap and is_observation_dict(node):
            return Observation._wrap(node)
        return node
    if t is list:
        if depth >= MAX_DEPTH:
            raise limit_error(
                f"header nested deeper than {MAX_DEPTH} levels", "MAX_DEPTH", codec="msgpack"
            )
        for i, v in enumerate(node):
            tv = type(v)
            if tv is dict or tv is list:
                node[i] = _finish(v, depth + 1, wrap)
        return node
    return node
