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

import math
import struct
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from ..errors import DecodeError, EncodeError
from ._base import MAX_DEPTH, MSGPACK_CONTENT_TYPE, Codec
from ._dtypes import parse_dtype
from .observation import JpegFrame, Observation, is_observation_dict

__all__ = ["MAGIC", "MSGPACK_PROTOCOL_VERSION", "MsgpackCodec"]

MAGIC = b"GMPK"
MSGPACK_PROTOCOL_VERSION = 1
ALIGN = 64
EXT_ARRAY = 1
EXT_JPEG = 2

_PREFIX = struct.Struct("<4sBBHII")
_PREFIX_LEN = _PREFIX.size  # 16
_MAX_BUFFERS = 1 << 20
_MAX_HEADER = 256 * 1024 * 1024
_MAX_NDIM = 32
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
        if arr.ndim > _MAX_NDIM:
            raise self.fail(f"array has {arr.ndim} dimensions (limit {_MAX_NDIM})")
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

        try:
            tree = msgpack.unpackb(
                mv[header_start:header_end],
                ext_hook=ext_hook,
                raw=False,
                use_list=True,
                strict_map_key=False,
            )
        except DecodeError:
            raise
        except msgpack.StackError:
            raise DecodeError(
                f"header nested too deeply (limit {MAX_DEPTH})", codec="msgpack"
            ) from None
        except (
            Exception
        ) as exc:  # msgpack raises ExtraData, FormatError, ValueError, TypeError, ...
            raise DecodeError(
                f"malformed msgpack header: {type(exc).__name__}: {exc}", codec="msgpack"
            ) from None
        return _finish(tree, 0)


def _make_array(mv: memoryview, buffers: list[tuple[int, int]], payload: bytes) -> np.ndarray:
    try:
        ref = msgpack.unpackb(payload, raw=False, use_list=True)
    except Exception as exc:
        raise DecodeError(f"malformed array reference: {exc}", codec="msgpack") from None
    if not (isinstance(ref, list) and len(ref) == 3):
        raise DecodeError("array reference: expected [dtype, shape, buffer]", codec="msgpack")
    dstr, shape, idx = ref
    dt = parse_dtype(dstr)
    if dt is None:
        raise DecodeError(f"array reference: bad dtype {str(dstr)[:40]!r}", codec="msgpack")
    if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise DecodeError(
            f"array reference: dtype {dstr!r} is not allowed (object/void/structured)",
            codec="msgpack",
        )
    if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
        raise DecodeError(f"array reference: bad shape {shape!r}", codec="msgpack")
    for d in shape:
        if type(d) is not int or d < 0:
            raise DecodeError(f"array reference: bad shape {shape!r}", codec="msgpack")
    if type(idx) is not int or not 0 <= idx < len(buffers):
        raise DecodeError(
            f"array reference: buffer index {idx!r} out of range ({len(buffers)} buffers)",
            codec="msgpack",
        )
    off, ln = buffers[idx]
    count = math.prod(shape)
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
        ref = msgpack.unpackb(payload, raw=False, use_list=True)
        shape, data = ref
        if not isinstance(data, bytes):
            raise TypeError("data is not bytes")
        return JpegFrame(data, shape)
    except Exception as exc:
        raise DecodeError(f"malformed JPEG frame reference: {exc}", codec="msgpack") from None


def _finish(node: Any, depth: int) -> Any:
    """Wrap observation dicts as Observations and enforce the depth limit (in place)."""
    t = type(node)
    if t is dict:
        if depth >= MAX_DEPTH:
            raise DecodeError(f"header nested deeper than {MAX_DEPTH} levels", codec="msgpack")
        for k, v in node.items():
            tk = type(k)
            if tk is not str and tk is not int:
                raise DecodeError(
                    f"map key of type {tk.__name__} (keys must be str or int)", codec="msgpack"
                )
            tv = type(v)
            if tv is dict or tv is list:
                node[k] = _finish(v, depth + 1)
        if is_observation_dict(node):
            return Observation._wrap(node)
        return node
    if t is list:
        if depth >= MAX_DEPTH:
            raise DecodeError(f"header nested deeper than {MAX_DEPTH} levels", codec="msgpack")
        for i, v in enumerate(node):
            tv = type(v)
            if tv is dict or tv is list:
                node[i] = _finish(v, depth + 1)
        return node
    return node
