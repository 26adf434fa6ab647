"""Tagged values inside legacy pickles: ``numpy_array``, ``jpeg_bytes``, ``tensor``, ``image``.

The real server replaces every array in a reply by a dict with a ``type`` key (facts §7.3):

* ``{"type": "numpy_array", "dtype": "float32", "shape": [12], "data": <base64 str>}``
* ``{"type": "jpeg_bytes", "dtype": "uint8", "shape": [H, W, 3], "data": <JPEG bytes>}``
* ``{"type": "tensor", "dtype": "torch.float32", "shape": "torch.Size([3])", "data": <base64>, "device": ...}``
* ``{"type": "image", "data": <base64 PNG>, "size": [W, H], "mode": "RGB"}`` (needs Pillow)

:func:`untag_tree` decodes them (arrays read-only; JPEG frames stay encoded as :class:`JpegFrame`)
and wraps observation dicts as :class:`Observation`; :func:`tag_tree` is the inverse for servers.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import DecodeError, DecodeLimitError, EncodeError
from ._base import MAX_DEPTH
from ._dtypes import parse_dtype
from .images import JPEG_MAGIC, decode_image, refused_format
from .jpeg import MAX_JPEG_PIXELS
from .limits import MAX_IMAGE_SIDE, MAX_NDIM, brief_repr, check_array_shape, limit_error
from .observation import JpegFrame, Observation, is_observation_dict

__all__ = ["TAG_TYPES", "tag_tree", "untag_tree"]

TAG_TYPES = frozenset({"numpy_array", "jpeg_bytes", "tensor", "image"})
_ARRAY_KINDS = frozenset("biufc")

# torch dtype names (after "torch.") -> numpy dtype; bfloat16 is widened to float32 separately.
_TORCH_DTYPES: dict[str, str] = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "int64": "int64", "long": "int64",
    "int32": "int32", "int": "int32", "int16": "int16", "short": "int16", "int8": "int8",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "complex64": "complex64", "complex128": "complex128", "cfloat": "complex64", "cdouble": "complex128",
}  # fmt: skip
_SHAPE_STR = re.compile(
    r"^\s*(?:torch\.Size\s*\(\s*)?[\[(]?\s*((?:\d+\s*,\s*)*\d*)\s*,?\s*[\])]?\s*\)?\s*$"
)


def _path_str(path: list[Any]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "<root>"


# ---------------------------------------------------------------------------------------------
# decode side
# ---------------------------------------------------------------------------------------------


class _Untagger:
    __slots__ = ("memo", "path")

    def __init__(self) -> None:
        # id -> (original node, result); holding the node keeps its id from being reused.
        self.memo: dict[int, tuple[Any, Any]] = {}
        self.path: list[Any] = []

    def fail(self, msg: str) -> DecodeError:
        return DecodeError(f"legacy reply field {_path_str(self.path)}: {msg}", codec="legacy")

    def refail(self, exc: DecodeError, field: str) -> DecodeError:
        """``exc`` with this field's path in front, keeping its type (limits stay limits)."""
        msg = f"legacy reply field {_path_str(self.path)}: {field}{exc}"
        if isinstance(exc, DecodeLimitError):
            return DecodeLimitError(msg, limit=exc.limit, bound=exc.bound, codec="legacy")
        return DecodeError(msg, codec="legacy")

    def walk(self, node: Any, depth: int) -> Any:
        t = type(node)
        if t is dict or isinstance(node, dict):
            i = id(node)
            if i in self.memo:
                return self.memo[i][1]
            if depth >= MAX_DEPTH:
                raise self.refail(
                    limit_error(f"nested deeper than {MAX_DEPTH} levels", "MAX_DEPTH", codec="legacy"),
                    "",
                )
            tag = node.get("type")
            if type(tag) is str and tag in TAG_TYPES and "data" in node:
                out = self.untag(tag, node)
                self.memo[i] = (node, out)
                return out
            d: dict[Any, Any] = node if t is dict else dict(node)
            result: Any = Observation._wrap(d) if is_observation_dict(d) else d
            self.memo[i] = (node, result)
            path = self.path
            for k, v in d.items():
                tv = type(v)
                if tv is dict or tv is list or tv is tuple or isinstance(v, dict):
                    path.append(k)
                    d[k] = self.walk(v, depth + 1)
                    path.pop()
                elif isinstance(v, np.generic):
                    d[k] = v.item()
            return result
        if t is list or t is tuple:
            i = id(node)
            if i in self.memo:
                return self.memo[i][1]
            if depth >= MAX_DEPTH:
                raise self.refail(
                    limit_error(f"nested deeper than {MAX_DEPTH} levels", "MAX_DEPTH", codec="legacy"),
                    "",
                )
            lst = node if t is list else list(node)
            self.memo[i] = (node, lst)
            path = self.path
            for j, v in enumerate(lst):
                tv = type(v)
                if tv is dict or tv is list or tv is tuple or isinstance(v, dict):
                    path.append(j)
                    lst[j] = self.walk(v, depth + 1)
                    path.pop()
                elif isinstance(v, np.generic):
                    lst[j] = v.item()
            return lst
        if isinstance(node, np.generic):
            # numpy scalars become Python scalars, as on the msgpack wire (and JSON-serialisable)
            return node.item()
        return node

    # -- tagged values ----------------------------------------------------------------------------
    def untag(self, tag: str, d: dict[Any, Any]) -> Any:
        if tag == "numpy_array":
            return self.numpy_array(d)
        if tag == "jpeg_bytes":
            return self.jpeg_bytes(d)
        if tag == "tensor":
            return self.tensor(d)
        return self.image(d)

    def field(self, d: dict[Any, Any], name: str) -> Any:
        if name not in d:
            raise self.fail(f"tagged {d.get('type')!r} value has no {name!r} field")
        return d[name]

    def shape_list(self, shape: Any) -> tuple[int, ...]:
        if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
            raise self.fail(f"shape: expected a list of ints, got {brief_repr(shape)}")
        out = []
        for s in shape:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
                raise self.fail(f"shape: expected non-negative ints, got {brief_repr(shape)}")
            out.append(int(s))
        return tuple(out)

    def dtype(self, spec: Any) -> np.dtype[Any]:
        dt = parse_dtype(spec)
        if dt is None:
            raise self.fail(f"dtype: unknown dtype {brief_repr(spec)}")
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise self.fail(f"dtype: {spec!r} is not a bool/int/float/complex dtype")
        return dt

    def b64(self, data: Any) -> bytes:
        if isinstance(data, str):
            try:
                data = data.encode("ascii")
            except UnicodeEncodeError:
                raise self.fail("data: base64 text contains non-ASCII characters") from None
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise self.fail(f"data: expected base64 str or bytes, got {type(data).__name__}")
        if _HAS_STRICT:
            # strict mode is ~30% faster on clean input (all the server sends); retry leniently
            # (newlines, missing padding) before calling the data invalid.
            try:
                out: bytes = _a2b_base64(data, strict_mode=True)
                return out
            except (binascii.Error, ValueError):
                pass
        try:
            return binascii.a2b_base64(data)
        except (binascii.Error, ValueError) as exc:
            raise self.fail(f"data: invalid base64 ({exc})") from None

    def make_array(self, raw: bytes, dt: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        # Before np.empty/reshape: (0, 2**40) holds no data but is refused like any huge shape.
        try:
            count = check_array_shape(shape, dt.itemsize, what="shape", codec="legacy")
        except DecodeError as exc:
            raise self.refail(exc, "") from None
        if count * dt.itemsize != len(raw):
            raise self.fail(
                f"data: {len(raw)} bytes, but shape {list(shape)} of {dt} needs {count * dt.itemsize}"
            )
        arr = (
            np.frombuffer(raw, dtype=dt, count=count).reshape(shape)
            if count
            else np.empty(shape, dtype=dt)
        )
        arr.flags.writeable = False
        return arr

    def numpy_array(self, d: dict[Any, Any]) -> np.ndarray:
        dt = self.dtype(self.field(d, "dtype"))
        shape = self.shape_list(self.field(d, "shape"))
        return self.make_array(self.b64(d["data"]), dt, shape)

    def jpeg_bytes(self, d: dict[Any, Any]) -> JpegFrame:
        data = d["data"]
        if not isinstance(data, (bytes, bytearray)):
            raise self.fail(f"data: expected JPEG bytes, got {type(data).__name__}")
        shape = self.shape_list(self.field(d, "shape"))
        dt = d.get("dtype", "uint8")
        if dt != "uint8":
            raise self.fail(f"dtype: JPEG frames are uint8, got {brief_repr(dt)}")
        if len(shape) != 3 or shape[2] != 3 or shape[0] == 0 or shape[1] == 0:
            raise self.fail(f"shape: expected [H, W, 3], got {list(shape)}")
        h, w = shape[0], shape[1]
        if h > MAX_IMAGE_SIDE or w > MAX_IMAGE_SIDE or h * w > MAX_JPEG_PIXELS:
            raise self.refail(
                limit_error(
                    f"{list(shape)} exceeds the limit of {MAX_JPEG_PIXELS} pixels "
                    f"({MAX_IMAGE_SIDE} per side)",
                    "MAX_JPEG_PIXELS",
                    codec="legacy",
                    bound=MAX_JPEG_PIXELS,
                ),
                "shape: ",
            )
        # Checked here, not only when decoded: the bytes may go straight to a video encoder.
        if not data.startswith(JPEG_MAGIC):
            raise self.fail(f"data: {refused_format(data, ('JPEG',))}")
        return JpegFrame(bytes(data), shape)

    def tensor(self, d: dict[Any, Any]) -> np.ndarray:
        spec = self.field(d, "dtype")
        if not isinstance(spec, str):
            raise self.fail(f"dtype: expected a torch dtype name, got {brief_repr(spec)}")
        name = spec[6:] if spec.startswith("torch.") else spec
        shape_raw = self.field(d, "shape")
        if isinstance(shape_raw, str):
            # Parsed with a regex, never eval(): "torch.Size([2, 3])", "[2, 3]", "(2, 3)", "()"
            m = _SHAPE_STR.match(shape_raw) if len(shape_raw) < 200 else None
            if m is None:
                raise self.fail(f"shape: cannot parse {shape_raw[:60]!r}")
            inner = m.group(1).strip().rstrip(",")
            shape = tuple(int(x) for x in inner.split(",") if x.strip()) if inner else ()
            if len(shape) > MAX_NDIM:
                raise self.fail(f"shape: {len(shape)} dimensions")
        else:
            shape = self.shape_list(shape_raw)
        raw = self.b64(d["data"])
        if name == "bfloat16":
            # bfloat16 is the top half of a float32: widen exactly, without torch.
            half = self.make_array(raw, np.dtype("<u2"), shape)
            out = (half.astype(np.uint32) << 16).view(np.float32)
            out.flags.writeable = False
            return out
        np_name = _TORCH_DTYPES.get(name)
        if np_name is None:
            raise self.fail(f"dtype: unsupported tensor dtype {brief_repr(spec)}")
        return self.make_array(raw, np.dtype(np_name), shape)

    def image(self, d: dict[Any, Any]) -> np.ndarray:
        # JPEG/PNG only, judged from the magic bytes before Pillow sees the data: Pillow's EPS
        # plugin would run Ghostscript on it. The size is checked from the header before load().
        raw = self.b64(d["data"])
        try:
            return decode_image(raw, max_pixels=MAX_JPEG_PIXELS, codec="legacy")
        except DecodeError as exc:
            raise self.refail(exc, "data: ") from None


# strict_mode exists from Python 3.11; typed as Any so the 3.10 stubs accept the keyword.
_a2b_base64: Any = binascii.a2b_base64
try:
    _a2b_base64(b"", strict_mode=False)
    _HAS_STRICT = True
except TypeError:  # Python 3.10
    _HAS_STRICT = False


def untag_tree(obj: Any) -> Any:
    """Decode tagged values in a freshly unpickled tree (in place where possible) and wrap
    observation dicts as :class:`Observation`. Tuples become lists and numpy scalars Python
    scalars, as on the msgpack wire."""
    return _Untagger().walk(obj, 0)


# ---------------------------------------------------------------------------------------------
# encode side
# ---------------------------------------------------------------------------------------------


class _Tagger:
    __slots__ = ("path", "tag_arrays")

    def __init__(self, tag_arrays: bool) -> None:
        self.tag_arrays = tag_arrays
        self.path: list[Any] = []

    def fail(self, msg: str) -> EncodeError:
        return EncodeError(f"legacy codec cannot encode {_path_str(self.path)}: {msg}")

    def array(self, arr: np.ndarray) -> Any:
        dt = arr.dtype
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise self.fail(f"arrays of dtype {dt} are not supported (bool/int/float/complex only)")
        if not self.tag_arrays:
            return arr.tolist()
        return {
            "type": "numpy_array",
            # The real server writes str(dtype) ("float32"); non-native byte orders keep theirs (">f4").
            "dtype": str(dt) if dt.isnative else dt.str,
            "shape": list(arr.shape),
            "data": base64.b64encode(np.ascontiguousarray(arr).data).decode("ascii"),
        }

    def walk(self, obj: Any, depth: int) -> Any:
        t = type(obj)
        if t is str or t is float or t is int or t is bool or obj is None or t is bytes:
            return obj
        if depth >= MAX_DEPTH and isinstance(obj, (dict, list, tuple, set, frozenset, Mapping)):
            raise self.fail(f"nesting deeper than {MAX_DEPTH} levels (a cycle?)")
        if isinstance(obj, np.ndarray):
            return self.array(np.asarray(obj).view(np.ndarray))
        if t is JpegFrame:
            return {
                "type": "jpeg_bytes",
                "dtype": "uint8",
                "shape": list(obj.shape),
                "data": obj.data,
            }
        if isinstance(obj, Mapping):
            items = obj.raw_items() if isinstance(obj, Observation) else obj.items()
            out = {}
            path = self.path
            for key, v in items:
                k = key
                if not isinstance(k, (str, int, float, bytes)) or isinstance(k, np.generic):
                    if isinstance(k, np.generic):
                        k = k.item()
                    elif not isinstance(k, tuple):
                        raise self.fail(f"dict key {k!r} of type {type(k).__name__}")
                path.append(k)
                out[k] = self.walk(v, depth + 1)
                path.pop()
            return out
        if t is list or t is tuple or isinstance(obj, (list, tuple)):
            path = self.path
            res = []
            for i, v in enumerate(obj):
                path.append(i)
                res.append(self.walk(v, depth + 1))
                path.pop()
            # Replies carry lists (like the real server); requests keep tuples as the caller built them.
            return tuple(res) if (not self.tag_arrays and isinstance(obj, tuple)) else res
        if isinstance(obj, (set, frozenset)):
            items = [self.walk(v, depth + 1) for v in obj]
            return frozenset(items) if isinstance(obj, frozenset) else set(items)
        if isinstance(obj, np.generic):
            if obj.dtype.kind in "biufUS":
                return obj.item()
            if obj.dtype.kind == "c":
                return complex(obj)
            raise self.fail(f"numpy scalar of dtype {obj.dtype}")
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        if isinstance(obj, complex):
            return complex(obj)
        raise self.fail(
            f"unsupported type {t.__module__}.{t.__qualname__} (the allow-listed reader accepts only "
            "builtin containers and scalars, numpy arrays and JpegFrame)"
        )


def tag_tree(obj: Any, *, tag_arrays: bool = True) -> Any:
    """A copy of ``obj`` ready to pickle for the legacy wire (see :meth:`LegacyCodec.encode`)."""
    return _Tagger(tag_arrays).walk(obj, 0)
