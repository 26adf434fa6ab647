"""The policy-server wire: openpi's msgpack-numpy frames, encoded and decoded within bounds.

One WebSocket binary message is one msgpack map. Arrays travel as maps
``{b"__ndarray__": True, b"data": <C-order bytes>, b"dtype": dtype.str, b"shape": [..]}`` and
numpy scalars as ``{b"__npgeneric__": True, b"data": <int|float|bool>, b"dtype": dtype.str}``
(the keys are msgpack *bin*, as the openpi client packs them; str keys are accepted too). Only
bool, integer and float arrays travel: object, void and complex dtypes (and strings, dates, ...)
are refused on both sides with a :class:`~genmanip_serve.errors.WireError` naming the field.

Decoding is bounded before and while it allocates: the message size is WebSocket ``max_size``;
msgpack's own per-container limits are set to the message size; every container the unpacker
builds is counted against :data:`genmanip_protocol.codec.limits.MAX_CONTAINERS` and every value
against ``MAX_ELEMENTS`` as it is built (so a hostile frame of empty containers stops at the
bound), nesting deeper than ``MAX_DEPTH`` is refused, and array shapes pass
:func:`genmanip_protocol.codec.limits.check_array_shape` before a (zero-copy, read-only) view is
made of the payload.

**JPEG camera frames (gmp's extension).** Between gmp's client and ``gmp policy serve`` a camera
frame that arrived from the GenManip server as JPEG travels as its JPEG bytes, tagged like an
array: ``{b"__jpeg__": True, b"data": <JPEG bytes>, b"shape": [H, W, 3]}``
(:func:`encode_message` with ``jpeg=True``). The receiver (:func:`decode_message` with
``jpeg=True``) accepts it only as the value of a top-level ``video.*`` key, only when the data
starts with the JPEG magic bytes (anything else, PNG, EPS, ..., is refused before any decoder
sees it), the shape is ``(H, W, 3)`` within :data:`~genmanip_protocol.codec.jpeg.MAX_JPEG_PIXELS`
and the data is at most :func:`max_jpeg_bytes` of that shape; it becomes a
:class:`genmanip_protocol.codec.JpegFrame`, which the server's
:class:`~genmanip_protocol.Observation` decodes on first access (with the project's JPEG-only
decoder: no external program ever runs). openpi clients never send the tag; without
``jpeg=True`` it is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np
from genmanip_protocol.codec import JpegFrame
from genmanip_protocol.codec.images import JPEG_MAGIC, refused_format
from genmanip_protocol.codec.jpeg import MAX_JPEG_PIXELS
from genmanip_protocol.codec.limits import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_IMAGE_SIDE,
    check_array_shape,
    limit_error,
)
from genmanip_protocol.errors import DecodeError

from .errors import WireError

__all__ = ["ARRAY_KINDS", "decode_message", "encode_message", "max_jpeg_bytes", "to_wire"]

#: numpy kinds that travel: bool, signed and unsigned integer, float.
ARRAY_KINDS = frozenset("biuf")

_CODEC = "openpi-msgpack"
_ND = "__ndarray__"
_NG = "__npgeneric__"
_JP = "__jpeg__"
_CAMERA = "video."
_DTYPE_RE = re.compile(r"[<>|=]?[biuf][0-9]{1,2}")
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1


def _path(path: str, key: Any) -> str:
    k = key.decode("utf-8", "replace") if isinstance(key, (bytes, bytearray)) else str(key)
    return k if not path else f"{path}.{k}"


def max_jpeg_bytes(height: int, width: int) -> int:
    """The largest JPEG frame accepted for an ``height x width`` RGB frame: twice its raw size
    plus 64 KiB (quality 100 without chroma subsampling stays under 1.4 times the raw size)."""
    return 2 * 3 * height * width + 65536


def _refused_dtype(field: str, dt: Any) -> WireError:
    return WireError(
        f"field {field!r}: arrays of dtype {dt} are refused (only bool, integer and float arrays "
        "travel; object, void and complex dtypes never do)",
        field=field,
    )


# ---------------------------------------------------------------------------------- encode


def to_wire(obj: Any, path: str = "", depth: int = 0, *, jpeg: bool = False) -> Any:
    """``obj`` as plain msgpack values, arrays as openpi ``__ndarray__`` maps (bin keys).

    Accepts dicts (str keys), lists/tuples, str, bytes, bool, int, float, None, numpy arrays and
    scalars, and objects with a ``decode()`` returning an array (an undecoded JPEG frame). A
    :class:`~genmanip_protocol.codec.JpegFrame` travels as gmp's ``__jpeg__`` map when ``jpeg``
    is true, else decoded (as openpi clients send frames).

    Raises:
        WireError: a value that cannot travel, naming its field.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"field {path or '<message>'!r}: nested deeper than {MAX_DEPTH} levels",
                        field=path or "<message>")
    t = type(obj)
    if obj is None or t is str or t is bool or t is float or t is bytes:
        return obj
    if t is int:
        if not _INT_MIN <= obj <= _INT_MAX:
            raise WireError(f"field {path!r}: integer {obj} does not fit in 64 bits", field=path)
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in ARRAY_KINDS or obj.dtype.fields is not None:
            raise _refused_dtype(path, obj.dtype)
        arr = np.ascontiguousarray(obj)
        data = arr.data.cast("B") if arr.size else b""
        return {b"__ndarray__": True, b"data": data, b"dtype": arr.dtype.str,
                b"shape": list(arr.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in ARRAY_KINDS:
            raise _refused_dtype(path, obj.dtype)
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if not isinstance(k, (str, bytes)):
                raise WireError(f"field {path or '<message>'!r}: key {k!r} is not a string",
                                field=path or "<message>")
            out[k] = to_wire(v, _path(path, k), depth + 1, jpeg=jpeg)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_wire(v, f"{path}[{i}]", depth + 1, jpeg=jpeg) for i, v in enumerate(obj)]
    if isinstance(obj, (bool, int, float, str)):  # subclasses (IntEnum, numpy-derived floats)
        return to_wire(_plain(obj), path, depth, jpeg=jpeg)
    if jpeg and t is JpegFrame:
        return {b"__jpeg__": True, b"data": obj.data, b"shape": list(obj.shape)}
    decode = getattr(obj, "decode", None)
    if callable(decode):  # a JpegFrame: travels decoded, as openpi clients send frames
        return to_wire(np.asarray(decode()), path, depth)
    raise WireError(f"field {path or '<message>'!r}: a {type(obj).__name__} cannot travel",
                    field=path or "<message>")


def _plain(obj: bool | int | float | str) -> bool | int | float | str:
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    return str(obj)


def encode_message(obj: Mapping[str, Any], *, jpeg: bool = False) -> bytes:
    """One binary WebSocket message: ``obj`` (a map) in openpi's msgpack-numpy form.

    ``jpeg``: JPEG frames (:class:`~genmanip_protocol.codec.JpegFrame` values) travel as gmp's
    ``__jpeg__`` maps (only to a server whose metadata lists ``"jpeg"`` in ``frames``); otherwise
    they are decoded and travel as arrays.

    Raises:
        WireError: a value that cannot travel (its field is named).
    """
    return msgpack.packb(to_wire(obj, jpeg=jpeg), use_bin_type=True)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------- decode


class _Counter:
    __slots__ = ("containers", "elements")

    def __init__(self) -> None:
        self.containers = 0
        self.elements = 0

    def add(self, n: int) -> None:
        self.containers += 1
        self.elements += n
        if self.containers > MAX_CONTAINERS:
            raise limit_error(
                f"message holds more than {MAX_CONTAINERS} maps/arrays", "MAX_CONTAINERS",
                codec=_CODEC,
            )
        if self.elements > MAX_ELEMENTS:
            raise limit_error(
                f"message holds more than {MAX_ELEMENTS} values", "MAX_ELEMENTS", codec=_CODEC
            )

    def map_hook(self, d: dict[Any, Any]) -> dict[Any, Any]:
        self.add(2 * len(d))
        return d

    def list_hook(self, items: list[Any]) -> list[Any]:
        self.add(len(items))
        return items


def decode_message(
    data: bytes | bytearray | memoryview | str, *, what: str = "message", jpeg: bool = False
) -> dict[str, Any]:
    """The map in one binary message, arrays restored as read-only views of ``data``.

    Map keys come back as ``str`` (bin keys are decoded as UTF-8). With ``jpeg``, gmp's
    ``__jpeg__`` maps at top-level ``video.*`` keys become undecoded
    :class:`~genmanip_protocol.codec.JpegFrame` values (checked: JPEG magic bytes, shape, size;
    see the module docstring); without it they are refused.

    Raises:
        WireError: a text frame, malformed msgpack, a message that is not a map, a bad array
            (dtype refused, shape or byte count wrong) or a limit exceeded; ``field`` names it.
    """
    if isinstance(data, str):
        raise WireError(f"{what}: a text frame; messages are binary msgpack frames")
    buf = bytes(data) if not isinstance(data, bytes) else data
    n = len(buf)
    counter = _Counter()
    try:
        raw = msgpack.unpackb(
            buf,
            raw=False,
            use_list=True,
            strict_map_key=True,
            object_hook=counter.map_hook,
            list_hook=counter.list_hook,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=min(n, MAX_ELEMENTS),
            max_map_len=min(n, MAX_ELEMENTS),
            max_ext_len=0,
        )
    except DecodeError as exc:
        raise WireError(f"{what}: {exc}") from None
    except msgpack.StackError:
        raise WireError(f"{what}: nested deeper than msgpack allows (limit {MAX_DEPTH})") from None
    except Exception as exc:  # ExtraData, FormatError, ValueError, TypeError, ...
        raise WireError(f"{what}: malformed msgpack: {type(exc).__name__}: {exc}"[:300]) from None
    if not isinstance(raw, dict):
        raise WireError(f"{what}: expected a msgpack map, got {type(raw).__name__}")
    out = _restore(raw, "", 0, jpeg)
    if not isinstance(out, dict):  # the message itself was an array or scalar map
        raise WireError(f"{what}: expected a msgpack map of fields, got a tagged "
                        f"{type(out).__name__}")
    return out


def _key(path: str, k: Any) -> str:
    if isinstance(k, bytes):
        try:
            return k.decode("utf-8")
        except UnicodeDecodeError:
            raise WireError(f"field {path or '<message>'!r}: a key is not UTF-8",
                            field=path or "<message>") from None
    if isinstance(k, str):
        return k
    raise WireError(f"field {path or '<message>'!r}: key {k!r} is not a string",
                    field=path or "<message>")


def _restore(node: Any, path: str, depth: int, jpeg: bool) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(
            f"field {path!r}: nested deeper than {MAX_DEPTH} levels (MAX_DEPTH)", field=path
        )
    if isinstance(node, dict):
        keys = {_key(path, k): k for k in node}
        if _ND in keys:
            return _array(node, keys, path or "<message>")
        if _NG in keys:
            return _scalar(node, keys, path or "<message>")
        if _JP in keys:
            return _jpeg(node, keys, path or "<message>", jpeg and depth == 1)
        return {k: _restore(node[raw], _path(path, k), depth + 1, jpeg) for k, raw in keys.items()}
    if isinstance(node, list):
        return [_restore(v, f"{path}[{i}]", depth + 1, jpeg) for i, v in enumerate(node)]
    return node


def _jpeg(node: dict[Any, Any], keys: dict[str, Any], field: str, allowed: bool) -> JpegFrame:
    if not allowed or not field.startswith(_CAMERA):
        raise WireError(
            f"field {field!r}: a JPEG frame is accepted only as a camera frame (a top-level "
            "'video.*' key) of a request to a policy server that lists 'jpeg' in its frames",
            field=field,
        )
    data = node.get(keys.get("data"))
    shape = node.get(keys.get("shape"))
    if not isinstance(data, bytes):
        raise WireError(f"field {field!r}: JPEG data must be bytes, got {type(data).__name__}",
                        field=field)
    if (not isinstance(shape, list) or len(shape) != 3 or shape[2] != 3
            or not all(type(d) is int and d > 0 for d in shape)):
        raise WireError(f"field {field!r}: a JPEG frame's shape must be [H, W, 3] (positive "
                        "integers)", field=field)
    h, w = shape[0], shape[1]
    if h > MAX_IMAGE_SIDE or w > MAX_IMAGE_SIDE or h * w > MAX_JPEG_PIXELS:
        raise WireError(
            f"field {field!r}: JPEG frame of shape {shape} exceeds the limit of "
            f"{MAX_JPEG_PIXELS} pixels ({MAX_IMAGE_SIDE} per side) (MAX_JPEG_PIXELS)", field=field,
        )
    if len(data) > max_jpeg_bytes(h, w):
        raise WireError(
            f"field {field!r}: {len(data)} bytes of JPEG for a {h}x{w} frame (at most "
            f"{max_jpeg_bytes(h, w)})", field=field,
        )
    # Checked here, not only when decoded: nothing but JPEG ever reaches a decoder.
    if not data.startswith(JPEG_MAGIC):
        raise WireError(f"field {field!r}: {refused_format(data, ('JPEG',))}", field=field)
    return JpegFrame(data, (h, w, 3))


def _dtype(spec: Any, field: str) -> np.dtype[Any]:
    if isinstance(spec, bytes):
        spec = spec.decode("ascii", "replace")
    if not isinstance(spec, str) or not _DTYPE_RE.fullmatch(spec):
        raise _refused_dtype(field, repr(spec)[:40])
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise _refused_dtype(field, repr(spec)) from None
    if dt.kind not in ARRAY_KINDS:
        raise _refused_dtype(field, dt)
    return dt


def _array(node: dict[Any, Any], keys: dict[str, Any], field: str) -> np.ndarray:
    data = node.get(keys.get("data"))
    shape = node.get(keys.get("shape"))
    dt = _dtype(node.get(keys.get("dtype")), field)
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(f"field {field!r}: array data must be bytes, got {type(data).__name__}",
                        field=field)
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise WireError(f"field {field!r}: array shape must be a list of non-negative integers",
                        field=field)
    try:
        count = check_array_shape(shape, dt.itemsize, what=f"field {field!r}", codec=_CODEC)
    except DecodeError as exc:
        raise WireError(str(exc), field=field) from None
    if len(data) != count * dt.itemsize:
        raise WireError(
            f"field {field!r}: {len(data)} data bytes for shape {shape} of {dt.str} "
            f"(expected {count * dt.itemsize})",
            field=field,
        )
    return np.frombuffer(data, dtype=dt).reshape(shape)


def _scalar(node: dict[Any, Any], keys: dict[str, Any], field: str) -> Any:
    dt = _dtype(node.get(keys.get("dtype")), field)
    value = node.get(keys.get("data"))
    if type(value) not in (bool, int, float):
        raise WireError(f"field {field!r}: numpy scalar data must be a number", field=field)
    try:
        return dt.type(value)
    except (OverflowError, ValueError, TypeError):
        raise WireError(f"field {field!r}: {value!r} is not a valid {dt}", field=field) from None
