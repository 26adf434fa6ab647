"""The legacy wire of the real GenManip server: pickle bodies, read only through an allow-list.

:func:`safe_loads` is the one way this project reads a pickle. Its unpickler resolves only the
globals plain containers, scalars and numpy arrays need; anything else (``os.system``,
``subprocess.Popen``, ``builtins.eval``, ``copyreg._reconstructor``, ...) raises
:class:`UnsafePayloadError` before it is called, so nothing executes. numpy's reconstruction
functions are wrapped: object, void and structured dtypes are refused (an object array's
``__setstate__`` would otherwise accept arbitrary objects) and a ``numpy.ndarray`` global can only be
used as ``_reconstruct``'s class argument, never called to allocate memory.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from ..errors import DecodeError, EncodeError, UnsafePayloadError
from ._base import LEGACY_CONTENT_TYPE, MAX_DEPTH, Codec
from .tagged import tag_tree, untag_tree

__all__ = ["LegacyCodec", "safe_loads"]

# numpy >= 2 keeps the reconstruction helpers in numpy._core; numpy 1.x pickles name numpy.core.
# Import the real functions once, from whichever exists, without touching the deprecated alias.
try:
    from numpy._core import multiarray as _np_multiarray
    from numpy._core import numeric as _np_numeric
except ImportError:  # numpy < 2
    from numpy.core import multiarray as _np_multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _np_numeric  # type: ignore[no-redef]

_np_reconstruct = _np_multiarray._reconstruct
_np_scalar = _np_multiarray.scalar
_np_frombuffer = getattr(_np_numeric, "_frombuffer", None)

_MAX_RECONSTRUCT_ELEMENTS = 1  # numpy always pickles the placeholder array as shape (0,)


class _NdarrayToken:
    """What ``numpy.ndarray`` resolves to: only ``_reconstruct`` accepts it; calling it refuses."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise UnsafePayloadError("numpy.ndarray (called directly)")


def _bad(msg: str) -> DecodeError:
    return DecodeError(f"invalid pickle: {msg}", codec="legacy")


def _check_dtype(dt: Any, where: str) -> np.dtype[Any]:
    if not isinstance(dt, np.dtype):
        raise _bad(f"{where}: expected a numpy dtype, got {type(dt).__name__}")
    if dt.hasobject or dt.kind in "OV" or dt.fields is not None:
        raise UnsafePayloadError(f"{where} with dtype {dt} (object/void/structured dtypes are refused)")
    return dt


def _safe_reconstruct(subtype: Any, shape: Any, dtype_code: Any) -> np.ndarray:
    if subtype is not _NdarrayToken:
        raise UnsafePayloadError(f"numpy _reconstruct of {getattr(subtype, '__name__', subtype)!r}")
    if not isinstance(shape, tuple) or not all(type(d) is int and 0 <= d for d in shape):
        raise _bad(f"numpy _reconstruct shape {shape!r}")
    if int(np.prod(shape, dtype=np.float64)) > _MAX_RECONSTRUCT_ELEMENTS:
        raise _bad(f"numpy _reconstruct placeholder shape {shape!r} is too large")
    if not isinstance(dtype_code, (bytes, str)) or len(dtype_code) > 4:
        raise _bad(f"numpy _reconstruct dtype code {dtype_code!r}")
    # The dtype and data come from the BUILD that follows; the placeholder is a 0-element byte array.
    return _np_reconstruct(np.ndarray, (0,), b"b")


def _safe_dtype(obj: Any, align: Any = False, copy: Any = False) -> np.dtype[Any]:
    if not isinstance(obj, str) or len(obj) > 16:
        raise _bad(f"numpy dtype spec {obj!r}")
    try:
        dt = np.dtype(obj, align=bool(align), copy=bool(copy))
    except Exception:
        raise _bad(f"numpy dtype spec {obj!r}") from None
    if dt.kind in "OV":
        raise UnsafePayloadError(f"numpy dtype {obj!r} (object/void/structured dtypes are refused)")
    return dt


def _safe_scalar(dtype: Any, data: Any = None) -> Any:
    dt = _check_dtype(dtype, "numpy scalar")
    if not isinstance(data, bytes) or len(data) != dt.itemsize:
        raise _bad(f"numpy scalar of {dt}: expected {dt.itemsize} bytes")
    return _np_scalar(dt, data)


def _safe_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    dt = _check_dtype(dtype, "numpy array")
    if isinstance(buf, pickle.PickleBuffer):
        buf = buf.raw()
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise _bad(f"numpy array buffer of type {type(buf).__name__}")
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape) or order not in ("C", "F"):
        raise _bad(f"numpy array shape {shape!r} / order {order!r}")
    n = len(memoryview(buf).cast("B")) if not isinstance(buf, (bytes, bytearray)) else len(buf)
    count = 1
    for d in shape:
        count *= d
    if count * dt.itemsize != n:
        raise _bad(f"numpy array of shape {shape} and {dt} needs {count * dt.itemsize} bytes, buffer has {n}")
    if _np_frombuffer is None:  # pragma: no cover - numpy always has it since 1.16
        raise UnsafePayloadError("numpy _frombuffer")
    return _np_frombuffer(buf, dt, shape, order)


def _latin1(args: tuple[Any, ...], name: str) -> bytes:
    if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        return args[0].encode("latin-1")
    raise _bad(f"{name} arguments")


def _safe_bytes(*args: Any) -> bytes:
    if not args:
        return b""
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
        return bytes(args[0])
    return _latin1(args, "bytes")


def _safe_bytearray(*args: Any) -> bytearray:
    # bytearray(10**12) would allocate: only copies of data are allowed.
    if not args:
        return bytearray()
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
        return bytearray(args[0])
    return bytearray(_latin1(args, "bytearray"))


def _safe_codecs_encode(*args: Any) -> bytes:
    # Protocol-2 pickles spell bytes as _codecs.encode(<latin-1 str>, "latin1").
    return _latin1(args, "_codecs.encode")


def _safe_complex(*args: Any) -> complex:
    if not 1 <= len(args) <= 2 or not all(type(a) in (int, float) for a in args):
        raise _bad("complex arguments")
    return complex(*args)


def _safe_set(*args: Any) -> set[Any]:
    return set(*args) if args else set()


def _safe_frozenset(*args: Any) -> frozenset[Any]:
    return frozenset(*args) if args else frozenset()


def _ordered_dict() -> Any:
    import collections

    return collections.OrderedDict


_ALLOWED: dict[tuple[str, str], Any] = {
    ("builtins", "set"): _safe_set,
    ("builtins", "frozenset"): _safe_frozenset,
    ("builtins", "complex"): _safe_complex,
    ("builtins", "bytes"): _safe_bytes,
    ("builtins", "bytearray"): _safe_bytearray,
    ("__builtin__", "set"): _safe_set,
    ("__builtin__", "frozenset"): _safe_frozenset,
    ("__builtin__", "complex"): _safe_complex,
    ("__builtin__", "bytes"): _safe_bytes,
    ("__builtin__", "bytearray"): _safe_bytearray,
    ("_codecs", "encode"): _safe_codecs_encode,
    ("collections", "OrderedDict"): _ordered_dict(),
    ("numpy", "ndarray"): _NdarrayToken,
    ("numpy", "dtype"): _safe_dtype,
    ("numpy.core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy.core.multiarray", "scalar"): _safe_scalar,
    ("numpy._core.multiarray", "scalar"): _safe_scalar,
    ("numpy.core.numeric", "_frombuffer"): _safe_frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _safe_frombuffer,
}

#: The globals a pickle may reference (module, name); everything else raises UnsafePayloadError.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(_ALLOWED)


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise UnsafePayloadError(f"{module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePayloadError(f"persistent id {str(pid)[:40]!r}")


def _check_tree(root: Any) -> None:
    """Refuse object/void arrays that numpy's ``__setstate__`` may have built, and over-deep trees.

    Iterative with a visited set, so shared references and cycles cost one visit each.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        t = type(node)
        if t is np.ndarray or isinstance(node, (np.ndarray, np.generic)):
            dt = node.dtype
            if dt.hasobject or dt.kind in "OV" or dt.fields is not None:
                raise UnsafePayloadError(f"numpy array with dtype {dt} (object/void/structured dtypes are refused)")
            if isinstance(node, np.ndarray) and dt.itemsize == 0 and node.size:
                raise _bad(f"numpy array of zero-size dtype {dt} with {node.size} elements")
            continue
        if t is dict or t is list or t is tuple or t is set or t is frozenset or isinstance(node, dict):
            i = id(node)
            if i in seen:
                continue
            seen.add(i)
            if depth >= MAX_DEPTH:
                raise _bad(f"containers nested deeper than {MAX_DEPTH} levels")
            if isinstance(node, dict):
                for k, v in node.items():
                    if not (type(k) is str or type(k) is int):
                        stack.append((k, depth + 1))
                    tv = type(v)
                    if not (tv is str or tv is float or tv is int or tv is bool or v is None):
                        stack.append((v, depth + 1))
            else:
                for v in node:
                    tv = type(v)
                    if not (tv is str or tv is float or tv is int or tv is bool or v is None):
                        stack.append((v, depth + 1))


def safe_loads(data: bytes | bytearray | memoryview, *, max_size: int = 1 << 32) -> Any:
    """Unpickle ``data`` through the allow-list.

    Returns the plain object tree (no untagging; :meth:`LegacyCodec.decode` does that). Raises
    :class:`UnsafePayloadError` for any global outside the allow-list (nothing is executed) and
    :class:`DecodeError` for truncated, corrupt, oversized or over-deep input; no other exception
    escapes.
    """
    try:
        size = memoryview(data).nbytes
    except TypeError:
        raise DecodeError(f"expected bytes, got {type(data).__name__}", codec="legacy") from None
    if size > max_size:
        raise DecodeError(f"pickle of {size} bytes exceeds the limit of {max_size}", codec="legacy")
    if size == 0:
        raise DecodeError("empty body is not a pickle", codec="legacy")
    try:
        obj = _SafeUnpickler(io.BytesIO(data)).load()
    except DecodeError:
        raise
    except RecursionError:
        raise _bad("nested too deeply") from None
    except MemoryError:
        raise _bad("needs more memory than available (corrupt length?)") from None
    except Exception as exc:  # pickle raises UnpicklingError, EOFError, ValueError, KeyError, ...
        raise _bad(f"{type(exc).__name__}: {exc}"[:300]) from None
    _check_tree(obj)
    return obj


class LegacyCodec(Codec):
    """The real GenManip server's wire: pickle (highest protocol), read through :func:`safe_loads`.

    Replies carry arrays as ``numpy_array`` tagged dicts (base64) and camera frames as
    ``jpeg_bytes`` tagged dicts; :meth:`decode` turns them back into read-only arrays and
    :class:`JpegFrame` objects (not decoded) and wraps observation dicts as :class:`Observation`.
    """

    name = "legacy"
    content_type = LEGACY_CONTENT_TYPE

    def __init__(self, *, max_size: int = 1 << 32) -> None:
        self.max_size = max_size

    def encode(self, obj: Any, *, tag_arrays: bool = True) -> bytes:
        """Pickle ``obj``.

        ``tag_arrays=True`` (server replies): arrays become ``numpy_array`` tagged dicts, JpegFrames
        ``jpeg_bytes`` tagged dicts, numpy scalars Python scalars, tuples lists — what the real
        server sends. ``tag_arrays=False`` (client requests): arrays become nested lists, because the
        real server's ``ee_pose`` path rejects numpy arrays and a list is accepted everywhere.
        Raises EncodeError naming the field for values the allow-list could not read back.
        """
        tree = tag_tree(obj, tag_arrays=tag_arrays)
        try:
            return pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pragma: no cover - tag_tree only leaves picklable builtins
            raise EncodeError(f"legacy codec cannot pickle the value: {exc}") from None

    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """Unpickle through the allow-list, then untag (see the class docstring)."""
        return untag_tree(safe_loads(data, max_size=self.max_size))
