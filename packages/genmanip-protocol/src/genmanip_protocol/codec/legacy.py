"""The legacy wire of the real GenManip server: pickle bodies, read only through an allow-list.

:func:`safe_loads` is the one way this project reads a pickle:

* ``find_class`` resolves only the globals plain containers, scalars and numpy arrays need (see
  ``ALLOWED_GLOBALS``); anything else (``os.system``, ``subprocess.Popen``, ``builtins.eval``,
  ``copyreg._reconstructor``, ...) raises :class:`UnsafePayloadError` before it is called, so nothing
  executes. Allowed globals are handed out as immutable callables (never classes or functions), so
  a payload cannot ``setattr`` into them, and ``numpy.ndarray`` cannot be called to allocate memory.
* numpy never sees pickle state: ``numpy.dtype`` and ``_reconstruct`` return proxies whose
  ``__setstate__`` validates every field (object/void/structured dtypes, foreign flags, sizes) and
  then build the array with ``np.frombuffer`` over the pickled bytes (read-only, length-checked).
* The pure-Python unpickler is used, since the C one sizes its memo by the largest index a payload
  names (5 bytes can make it zero 32 GiB); BYTEARRAY8 reads before it allocates.
* While loading, every container, element, memo slot and copied byte is counted against the
  bounds of :mod:`.limits` (``MAX_CONTAINERS``, ``MAX_ELEMENTS``, ``MAX_COPY_SLACK``), and tuples
  and frozensets are refused once nested deeper than ``MAX_DEPTH`` *as they are built*: hashing a
  200,000-deep tuple (a dict key, a set member) recurses in C and kills the process.
* After loading, proxies are replaced by real values and nesting is limited to 64 levels; every
  failure is a :class:`DecodeError`.
"""

from __future__ import annotations

import io
import pickle
import struct
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import DecodeError, EncodeError, UnsafePayloadError
from ._base import LEGACY_CONTENT_TYPE, MAX_DEPTH, Codec
from ._dtypes import parse_dtype
from .limits import (
    MAX_CONTAINERS,
    MAX_COPY_SLACK,
    MAX_ELEMENTS,
    MAX_NDIM,
    brief_repr,
    check_array_shape,
    limit_error,
)
from .tagged import tag_tree, untag_tree

__all__ = ["LegacyCodec", "safe_loads"]

_ARRAY_KINDS = frozenset("biufcSU")
_MAX_FLEXIBLE_SIZE = 1 << 24
#: Arguments an allow-listed call may take (``_frombuffer`` takes 4); REDUCE would otherwise
#: splat a million-item list into a call.
_MAX_CALL_ARGS = 4


def _bad(msg: str) -> DecodeError:
    return DecodeError(f"invalid pickle: {msg}", codec="legacy")


# numpy's own ``dtype.__setstate__``/``ndarray.__setstate__`` trust their state: a crafted state can
# set a float dtype's flags to "holds object references" (numpy then treats raw bytes as
# PyObject pointers) or give it a huge itemsize. So numpy never sees pickle state here: the
# allow-listed globals return proxies whose ``__setstate__`` validates every field, and the real
# dtype/array is built from the validated parts (``np.frombuffer`` over the pickled bytes).


class _DtypeProxy:
    """What ``numpy.dtype(spec, align, copy)`` returns inside :func:`safe_loads`."""

    __slots__ = ("dtype",)

    def __init__(self, spec: Any, align: Any = False, copy: Any = False) -> None:
        if spec in ("O", "O8", "O4", "|O") or (type(spec) is str and spec.startswith("V")):
            raise UnsafePayloadError(
                f"numpy dtype {spec!r} (object/void/structured dtypes are refused)"
            )
        dt = parse_dtype(spec)
        if dt is None:
            raise _bad(f"numpy dtype spec {brief_repr(spec, 40)}")
        if dt.kind in "OV" or dt.fields is not None or dt.subdtype is not None:
            raise UnsafePayloadError(
                f"numpy dtype {spec!r} (object/void/structured dtypes are refused)"
            )
        if dt.kind not in _ARRAY_KINDS:
            raise _bad(f"numpy dtype {spec!r} is not a bool/number/string dtype")
        self.dtype: np.dtype[Any] = dt

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (8, 9):
            raise _bad("numpy dtype state")
        version, order, subarray, names, fields, elsize, alignment, flags = state[:8]
        if len(state) == 9 and state[8] is not None:
            raise _bad("numpy dtype metadata")
        if version not in (3, 4) or order not in ("<", ">", "|", "="):
            raise _bad(f"numpy dtype state version/byte order {version!r}/{order!r}")
        if subarray is not None or names is not None or fields is not None:
            raise UnsafePayloadError(
                "numpy dtype with fields or subarrays (structured dtypes are refused)"
            )
        if type(elsize) is not int or type(alignment) is not int or type(flags) is not int:
            raise _bad("numpy dtype state sizes")
        base = self.dtype
        if base.kind in "SU":
            unit = 1 if base.kind == "S" else 4
            if not 0 < elsize <= _MAX_FLEXIBLE_SIZE or elsize % unit:
                raise _bad(f"numpy {base.kind} dtype of {elsize} bytes")
            dt = np.dtype(f"{'>' if order == '>' else '<'}{base.kind}{elsize // unit}")
        else:
            if elsize not in (-1, base.itemsize):
                raise _bad(f"numpy dtype {base} with itemsize {elsize}")
            dt = base.newbyteorder(order) if order in "<>" and base.itemsize > 1 else base
        if flags != dt.flags:
            raise UnsafePayloadError(f"numpy dtype {dt} with flags {flags} (expected {dt.flags})")
        self.dtype = dt


def _dtype_of(obj: Any, where: str) -> np.dtype[Any]:
    if type(obj) is not _DtypeProxy:
        raise _bad(f"{where}: expected a numpy dtype, got {type(obj).__name__}")
    return obj.dtype


def _raw_bytes(raw: Any, where: str) -> bytes:
    if isinstance(raw, bytes):  # _PendingByteArray included: no copy
        return raw
    if isinstance(raw, bytearray):
        _charge_copy(len(raw), where)
        return bytes(raw)
    if isinstance(raw, pickle.PickleBuffer):
        with raw.raw() as view:
            _charge_copy(view.nbytes, where)
            return bytes(view)
    if isinstance(raw, str):  # Python 2 pickles carry array data as a latin-1 str
        _charge_copy(len(raw), where)
        try:
            return raw.encode("latin-1")
        except UnicodeEncodeError:
            raise _bad(f"{where}: data is not latin-1") from None
    raise _bad(f"{where}: data of type {type(raw).__name__}")


def _check_shape(shape: Any, dt: np.dtype[Any], where: str) -> int:
    if not isinstance(shape, tuple) or len(shape) > MAX_NDIM:
        raise _bad(f"{where}: shape {brief_repr(shape)}")
    for d in shape:
        if type(d) is not int or d < 0:
            raise _bad(f"{where}: shape {brief_repr(shape)}")
    # Also for shapes holding no data: (0, 2**40) would pass the byte count check below.
    return check_array_shape(shape, dt.itemsize, what=where, codec="legacy")


def _build_array(raw: Any, dt: np.dtype[Any], shape: Any, fortran: bool, where: str) -> np.ndarray:
    count = _check_shape(shape, dt, where)
    data = _raw_bytes(raw, where)
    if count * dt.itemsize != len(data):
        raise _bad(
            f"{where}: shape {shape} of {dt} needs {count * dt.itemsize} bytes, got {len(data)}"
        )
    flat: np.ndarray = (
        np.frombuffer(data, dtype=dt, count=count) if count else np.empty(0, dtype=dt)
    )
    arr: np.ndarray = flat.reshape(shape, order="F" if fortran else "C")
    arr.flags.writeable = False
    return arr


class _ArrayProxy:
    """What ``numpy._core.multiarray._reconstruct`` returns; the array is built by ``__setstate__``."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise _bad("numpy array state")
        if len(state) == 5:
            if type(state[0]) is not int:
                raise _bad("numpy array state version")
            state = state[1:]
        shape, dtype, fortran, raw = state
        if fortran not in (True, False, 0, 1):
            raise _bad("numpy array state order flag")
        self.array = _build_array(
            raw, _dtype_of(dtype, "numpy array"), shape, bool(fortran), "numpy array"
        )


class _Global:
    """An allow-listed global as a pickle sees it: callable, but neither a class nor a function,
    and immutable, so a payload cannot ``setattr`` (BUILD slot state) into our validators."""

    __slots__ = ("_fn", "_name")
    _fn: Any
    _name: str

    def __init__(self, name: str, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __setattr__(self, key: str, value: Any) -> None:
        raise _bad(f"attribute assignment on {self._name}")

    def __setstate__(self, state: Any) -> None:
        raise _bad(f"BUILD on {self._name}")

    def __repr__(self) -> str:
        return f"<allow-listed {self._name}>"


def _refuse_ndarray(*args: Any) -> Any:
    raise UnsafePayloadError("numpy.ndarray (called directly)")


_NDARRAY = _Global("numpy.ndarray", _refuse_ndarray)


class _PendingByteArray(bytes):
    """Bytes read by BYTEARRAY8, not yet copied into a bytearray (see ``load_bytearray8``)."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _bad("BUILD on a bytearray")


class _ValueProxy:
    """Holds a value built by an allow-listed call (a numpy scalar) until the load finishes, so
    a BUILD opcode can never reach the real object's ``__setstate__``."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __setstate__(self, state: Any) -> None:
        raise _bad("BUILD on a numpy scalar")


def _safe_reconstruct(*args: Any) -> _ArrayProxy:
    # numpy pickles _reconstruct(ndarray, (0,), b"b"); the real dtype/shape/data come from BUILD.
    if not args or args[0] is not _NDARRAY:
        what = brief_repr(args[0]) if args else "nothing"
        raise UnsafePayloadError(f"numpy _reconstruct of {what}")
    return _ArrayProxy()


def _safe_scalar(*args: Any) -> _ValueProxy:
    if len(args) != 2:
        raise _bad("numpy scalar arguments")
    dt = _dtype_of(args[0], "numpy scalar")
    raw = _raw_bytes(args[1], "numpy scalar")
    if len(raw) != dt.itemsize:
        raise _bad(f"numpy scalar of {dt}: expected {dt.itemsize} bytes, got {len(raw)}")
    return _ValueProxy(np.frombuffer(raw, dtype=dt, count=1)[0])


def _safe_frombuffer(*args: Any) -> _ArrayProxy:
    if len(args) != 4:
        raise _bad("numpy _frombuffer arguments")
    buf, dtype, shape, order = args
    if order not in ("C", "F"):
        raise _bad(f"numpy array order {brief_repr(order)}")
    proxy = _ArrayProxy()
    proxy.array = _build_array(
        buf, _dtype_of(dtype, "numpy array"), shape, order == "F", "numpy array"
    )
    return proxy


def _make_dtype(*args: Any) -> _DtypeProxy:
    if not 1 <= len(args) <= 3:
        raise _bad("numpy dtype arguments")
    return _DtypeProxy(*args)


def _latin1(args: tuple[Any, ...], name: str) -> bytes:
    if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        _charge_copy(len(args[0]), name)
        return args[0].encode("latin-1")
    raise _bad(f"{name} arguments")


def _safe_bytes(*args: Any) -> bytes:
    if not args:
        return b""
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
        _charge_copy(len(args[0]), "bytes")
        return bytes(args[0])
    return _latin1(args, "bytes")


def _safe_bytearray(*args: Any) -> bytearray:
    # bytearray(10**12) would allocate: only copies of data are allowed (and they are counted:
    # bytearray(<memo 0>) a thousand times over is a memo bomb).
    if not args:
        return bytearray()
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
        _charge_copy(len(args[0]), "bytearray")
        return bytearray(args[0])
    return bytearray(_latin1(args, "bytearray"))


def _safe_codecs_encode(*args: Any) -> bytes:
    # Protocol-2 pickles spell bytes as _codecs.encode(<latin-1 str>, "latin1").
    return _latin1(args, "_codecs.encode")


def _safe_complex(*args: Any) -> complex:
    if not 1 <= len(args) <= 2 or not all(type(a) in (int, float) for a in args):
        raise _bad("complex arguments")
    return complex(*args)


def _set_items(args: tuple[Any, ...], name: str) -> list[Any] | tuple[Any, ...]:
    # Protocols < 4 pickle sets as set([items]); a str, dict or set argument is never produced.
    if not args:
        return ()
    if len(args) != 1 or type(args[0]) not in (list, tuple):
        raise _bad(f"{name} arguments")
    items: list[Any] | tuple[Any, ...] = args[0]
    unpickler = _active()
    if unpickler is not None:
        # before the copy: set(<memo 0>) again and again (the call itself counted one container)
        unpickler.count(_SET_WEIGHT - 1, len(items))
    return items


def _safe_set(*args: Any) -> set[Any]:
    return set(_set_items(args, "set"))


def _safe_frozenset(*args: Any) -> frozenset[Any]:
    items = _set_items(args, "frozenset")
    unpickler = _active()
    depth = unpickler.nesting(items) if unpickler is not None else 1
    out = frozenset(items)
    if unpickler is not None:
        unpickler.record(out, depth)
    return out


def _ordered_dict(*args: Any) -> Any:
    import collections

    if args:  # OrderedDict pickles as OrderedDict() + SETITEMS
        raise _bad("OrderedDict arguments")
    return collections.OrderedDict()


_ALLOWED_FUNCS: dict[tuple[str, str], Any] = {
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
    ("collections", "OrderedDict"): _ordered_dict,
    ("numpy", "dtype"): _make_dtype,
    ("numpy.core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy.core.multiarray", "scalar"): _safe_scalar,
    ("numpy._core.multiarray", "scalar"): _safe_scalar,
    ("numpy.core.numeric", "_frombuffer"): _safe_frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _safe_frombuffer,
}
_ALLOWED: dict[tuple[str, str], _Global] = {
    key: _Global(f"{key[0]}.{key[1]}", fn) for key, fn in _ALLOWED_FUNCS.items()
}
_ALLOWED[("numpy", "ndarray")] = _NDARRAY

#: The globals a pickle may reference (module, name); everything else raises UnsafePayloadError.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(_ALLOWED)


def _find_class(module: str, name: str) -> Any:
    try:
        return _ALLOWED[(module, name)]
    except (KeyError, TypeError):
        raise UnsafePayloadError(f"{module}.{name}"[:200]) from None


def _persistent_load(pid: Any) -> Any:
    raise UnsafePayloadError(f"persistent id {str(pid)[:40]!r}")


# The pure-Python unpickler, on purpose. CPython's C unpickler sizes its memo array by the largest
# index a PUT names (LONG_BINPUT 0x7fffffff: 5 bytes -> 32 GiB written with NULLs) and allocates
# BYTEARRAY8's declared length before reading. Telling such opcodes apart from data needs an
# opcode-level parse, which costs as much as the Python unpickler itself (a byte-level pre-scan
# flags every string containing "r"). Replies are a few hundred opcodes: ~0.5 ms more per step;
# array-heavy files (meta_record.pkl) load ~5-10x slower than with pickle.loads.
_PyUnpickler: Any = pickle._Unpickler


#: The unpickler loading on this thread, for the allow-listed calls that must count what they
#: build (set/frozenset copies, bytes copies). Thread-local: several threads decode at once.
_ACTIVE = threading.local()


def _active() -> _SafePyUnpickler | None:
    unpickler: _SafePyUnpickler | None = getattr(_ACTIVE, "unpickler", None)
    return unpickler


def _charge_copy(nbytes: int, where: str) -> None:
    unpickler = _active()
    if unpickler is not None:
        unpickler.copied(nbytes, where)


def _limit(message: str, limit: str, bound: int | None = None) -> DecodeError:
    return limit_error(f"invalid pickle: {message}", limit, codec="legacy", bound=bound)


_TUPLE_LIKE = (tuple, frozenset)
#: An empty set or frozenset costs 216 bytes, three times an empty list or dict: it counts thrice.
_SET_WEIGHT = 3


class _SafePyUnpickler(_PyUnpickler):  # type: ignore[misc]
    """The pure-Python unpickler with the allow-list and the limits.

    Its memo is a dict, BYTEARRAY8 reads before it allocates, and every opcode that builds a
    container, adds to one, opens a MARK or fills a memo slot is counted (see :mod:`.limits`)
    before it allocates. Tuples and frozensets carry their nesting depth from the moment they are
    built (hashing one recurses in C, so a deep one must never exist); lists and dicts are
    unhashable, cost a counted container each, and their depth is checked after loading.
    """

    dispatch = dict(_PyUnpickler.dispatch)

    def __init__(self, file: Any, payload_size: int) -> None:
        super().__init__(file)
        self._containers = 0
        self._elements = 0
        self._copy_left = payload_size + MAX_COPY_SLACK
        # id -> depth of the tuples/frozensets nested 2+ levels (absent = 1); _keep pins them so
        # an id is never reused while its depth is on record.
        self._depths: dict[int, int] = {}
        self._keep: list[Any] = []

    # -- accounting ------------------------------------------------------------------------------
    def count(self, containers: int, elements: int) -> None:
        """Count ``containers`` new containers holding ``elements`` values, before building them."""
        self._containers += containers
        self._elements += elements
        if self._containers > MAX_CONTAINERS:
            raise _limit(
                f"more than {MAX_CONTAINERS} containers (lists, dicts, tuples, sets)",
                "MAX_CONTAINERS",
            )
        if self._elements > MAX_ELEMENTS:
            raise _limit(f"more than {MAX_ELEMENTS} values in containers", "MAX_ELEMENTS")

    def copied(self, nbytes: int, where: str) -> None:
        """Count ``nbytes`` copied by an allow-listed call, before copying them."""
        self._copy_left -= nbytes
        if self._copy_left < 0:
            raise _limit(
                f"{where}: allow-listed calls copy more than the payload's size + "
                f"{MAX_COPY_SLACK} bytes (a memo bomb?)",
                "MAX_COPY_SLACK",
            )

    def nesting(self, items: Iterable[Any]) -> int:
        """Depth of a tuple/frozenset of ``items``; refused beyond MAX_DEPTH before it exists."""
        depths = self._depths
        deepest = 0
        for item in items:
            if type(item) in _TUPLE_LIKE:
                deepest = max(deepest, depths.get(id(item), 1))
        deepest += 1
        if deepest > MAX_DEPTH:
            raise _limit(
                f"tuples/frozensets nested deeper than {MAX_DEPTH} levels (hashing them would "
                "overflow the C stack)",
                "MAX_DEPTH",
            )
        return deepest

    def record(self, obj: Any, depth: int) -> None:
        if depth > 1:
            self._depths[id(obj)] = depth
            self._keep.append(obj)

    def _tuple(self, items: list[Any] | tuple[Any, ...]) -> tuple[Any, ...]:
        if not items:
            return ()
        depth = self.nesting(items)
        self.count(1, len(items))
        out = tuple(items)
        self.record(out, depth)
        return out

    # -- overridden opcodes ----------------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        return _find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        return _persistent_load(pid)

    def load_bytearray8(self) -> None:
        # The stock version allocates bytearray(<declared length>) before reading: 9 bytes could
        # ask for 2**62. Read what is there first, then copy.
        (n,) = struct.unpack("<Q", self.read(8))
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("pickle data was truncated")
        # Protocol-5 arrays arrive as BYTEARRAY8 + _frombuffer: keep the bytes (no second copy);
        # a bytearray left as a value in the tree is made a real bytearray by _resolve.
        self.append(_PendingByteArray(data))

    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8

    def load_mark(self) -> None:
        # Each MARK is a new list on the metastack: 4 MB of "(" were 4 million lists. A real
        # pickle nests marks no deeper than its containers.
        if len(self.metastack) >= MAX_DEPTH:
            raise _limit(f"MARKs nested deeper than {MAX_DEPTH} levels", "MAX_DEPTH")
        _PyUnpickler.load_mark(self)

    dispatch[pickle.MARK[0]] = load_mark

    def load_empty_list(self) -> None:
        self.count(1, 0)
        self.append([])

    dispatch[pickle.EMPTY_LIST[0]] = load_empty_list

    def load_empty_dictionary(self) -> None:
        self.count(1, 0)
        self.append({})

    dispatch[pickle.EMPTY_DICT[0]] = load_empty_dictionary

    def load_empty_set(self) -> None:
        self.count(_SET_WEIGHT, 0)
        self.append(set())

    dispatch[pickle.EMPTY_SET[0]] = load_empty_set

    def load_list(self) -> None:
        items = self.pop_mark()
        self.count(1, len(items))
        self.append(items)

    dispatch[pickle.LIST[0]] = load_list

    def load_dict(self) -> None:
        items = self.pop_mark()
        self.count(1, len(items))  # keys and values
        if len(items) % 2:
            raise pickle.UnpicklingError("odd number of items for DICT")
        self.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})

    dispatch[pickle.DICT[0]] = load_dict

    def load_tuple(self) -> None:
        items = self.pop_mark()  # first: pop_mark rebinds self.append
        self.append(self._tuple(items))

    dispatch[pickle.TUPLE[0]] = load_tuple

    def load_tuple1(self) -> None:
        stack = self.stack
        if not stack:
            raise pickle.UnpicklingError("TUPLE1 on an empty stack")
        stack[-1] = self._tuple(stack[-1:])

    dispatch[pickle.TUPLE1[0]] = load_tuple1

    def load_tuple2(self) -> None:
        stack = self.stack
        if len(stack) < 2:
            raise pickle.UnpicklingError("TUPLE2 on a short stack")
        stack[-2:] = [self._tuple(stack[-2:])]

    dispatch[pickle.TUPLE2[0]] = load_tuple2

    def load_tuple3(self) -> None:
        stack = self.stack
        if len(stack) < 3:
            raise pickle.UnpicklingError("TUPLE3 on a short stack")
        stack[-3:] = [self._tuple(stack[-3:])]

    dispatch[pickle.TUPLE3[0]] = load_tuple3

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        depth = self.nesting(items)
        self.count(_SET_WEIGHT, len(items))
        out = frozenset(items)
        self.record(out, depth)
        self.append(out)

    dispatch[pickle.FROZENSET[0]] = load_frozenset

    def load_append(self) -> None:
        self.count(0, 1)
        _PyUnpickler.load_append(self)

    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self) -> None:
        self.count(0, len(self.stack))  # the items since the MARK
        _PyUnpickler.load_appends(self)

    dispatch[pickle.APPENDS[0]] = load_appends

    def load_setitem(self) -> None:
        self.count(0, 2)
        _PyUnpickler.load_setitem(self)

    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self) -> None:
        self.count(0, len(self.stack))  # keys and values
        _PyUnpickler.load_setitems(self)

    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_additems(self) -> None:
        self.count(0, len(self.stack))
        _PyUnpickler.load_additems(self)

    dispatch[pickle.ADDITEMS[0]] = load_additems

    def _memo_check(self) -> None:
        # A memo slot costs about what an empty container does (1 byte of MEMOIZE each).
        if len(self.memo) > MAX_CONTAINERS:
            raise _limit(f"more than {MAX_CONTAINERS} memo entries", "MAX_CONTAINERS")

    def load_put(self) -> None:
        _PyUnpickler.load_put(self)
        self._memo_check()

    dispatch[pickle.PUT[0]] = load_put

    def load_binput(self) -> None:
        _PyUnpickler.load_binput(self)
        self._memo_check()

    dispatch[pickle.BINPUT[0]] = load_binput

    def load_long_binput(self) -> None:
        _PyUnpickler.load_long_binput(self)
        self._memo_check()

    dispatch[pickle.LONG_BINPUT[0]] = load_long_binput

    def load_memoize(self) -> None:
        _PyUnpickler.load_memoize(self)
        self._memo_check()

    dispatch[pickle.MEMOIZE[0]] = load_memoize

    def load_reduce(self) -> None:
        # The stock REDUCE splats any iterable into the call: a tuple of at most a few args only.
        args = self.stack[-1] if self.stack else None
        if type(args) is not tuple or len(args) > _MAX_CALL_ARGS:
            raise pickle.UnpicklingError("REDUCE arguments are not a short tuple")
        # Every call builds an object (a set, a proxy, a view) from ~4 bytes of GET + REDUCE: each
        # counts as a container.
        self.count(1, 0)
        _PyUnpickler.load_reduce(self)

    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_obj(self) -> None:
        if len(self.stack) > _MAX_CALL_ARGS + 1:
            raise pickle.UnpicklingError("OBJ with too many arguments")
        self.count(1, 0)
        _PyUnpickler.load_obj(self)

    dispatch[pickle.OBJ[0]] = load_obj

    def load_inst(self) -> None:
        if len(self.stack) > _MAX_CALL_ARGS:
            raise pickle.UnpicklingError("INST with too many arguments")
        self.count(1, 0)
        _PyUnpickler.load_inst(self)

    dispatch[pickle.INST[0]] = load_inst


_IN_PROGRESS = object()
_LEAVES = frozenset({str, int, float, bool, bytes, type(None), complex, bytearray})


#: Shared references let a 1 KB pickle describe a tree with 2**64 paths; a consumer that walks
#: it naively (json.dumps, a recorder) would never finish. Trees that expand beyond this many
#: nodes are refused (a 10-million-float list is still fine).
MAX_EXPANDED_NODES = 50_000_000


def _resolve(root: Any) -> Any:
    """Replace the numpy proxies by real arrays/dtypes; enforce the depth and expansion limits.

    Lists and dicts are updated in place (so cycles and shared references survive); tuples, sets
    and frozensets are rebuilt only if a member changed.
    """
    # id -> (node, result, expanded size); holding node pins its id for the whole walk
    memo: dict[int, tuple[Any, Any, int]] = {}

    def walk(node: Any, depth: int) -> tuple[Any, int]:
        t = type(node)
        if t in _LEAVES:
            return node, 1
        if t is _ArrayProxy:
            if node.array is None:
                raise _bad("numpy array without state")
            return node.array, 1
        if t is _DtypeProxy:
            return node.dtype, 1
        if t is _ValueProxy:
            return node.value, 1
        if t is _PendingByteArray:
            _charge_copy(len(node), "bytearray")
            return bytearray(node), 1
        if t is _Global:
            raise _bad(f"{node._name} left uncalled in the data")
        if isinstance(node, (np.ndarray, np.generic)):
            return node, 1  # built by us from validated parts
        i = id(node)
        hit = memo.get(i)
        if hit is not None:
            if hit[1] is _IN_PROGRESS:
                raise _bad("recursive tuple or set")
            return hit[1], hit[2]
        if depth >= MAX_DEPTH:
            raise _limit(f"containers nested deeper than {MAX_DEPTH} levels", "MAX_DEPTH")
        size = 1
        if isinstance(node, list):
            memo[i] = (node, node, 1)  # a cycle back to here counts once
            for j, v in enumerate(node):
                if type(v) in _LEAVES:
                    size += 1
                    continue
                nv, n = walk(v, depth + 1)
                size += n
                if nv is not v:
                    node[j] = nv
            out: Any = node
        elif isinstance(node, dict):
            memo[i] = (node, node, 1)
            rekey = False
            for k, v in node.items():
                if type(k) in _LEAVES:
                    size += 1
                else:
                    nk, n = walk(k, depth + 1)
                    size += n
                    rekey = rekey or nk is not k
                if type(v) in _LEAVES:
                    size += 1
                    continue
                nv, n = walk(v, depth + 1)
                size += n
                if nv is not v:
                    node[k] = nv
            if rekey:
                items = [(walk(k, depth + 1)[0], v) for k, v in node.items()]
                node.clear()
                node.update(items)
            out = node
        elif isinstance(node, (tuple, set, frozenset)):
            memo[i] = (node, _IN_PROGRESS, 1)
            items = []
            for v in node:
                nv, n = walk(v, depth + 1)
                size += n
                items.append(nv)
            if isinstance(node, tuple):
                changed = any(a is not b for a, b in zip(items, node, strict=True))
                out = tuple(items) if changed else node
            elif any(type(v) not in _LEAVES for v in node):
                out = type(node)(items)
            else:
                out = node
        else:
            raise _bad(f"unexpected object of type {t.__name__}")
        if size > MAX_EXPANDED_NODES:
            raise _limit(
                f"the data expands to more than {MAX_EXPANDED_NODES} values through shared "
                "references (a 'billion laughs' pickle)",
                "MAX_EXPANDED_NODES",
                MAX_EXPANDED_NODES,
            )
        memo[i] = (node, out, size)
        return out, size

    return walk(root, 0)[0]


def safe_loads(data: bytes | bytearray | memoryview, *, max_size: int = 1 << 32) -> Any:
    """Unpickle ``data`` through the allow-list.

    Returns the plain object tree (no untagging; :meth:`LegacyCodec.decode` does that). Raises
    :class:`UnsafePayloadError` for any global outside the allow-list (nothing is executed),
    :class:`~genmanip_protocol.errors.DecodeLimitError` for input beyond the bounds of
    :mod:`.limits` (refused before the memory is allocated) and :class:`DecodeError` for
    truncated or corrupt input; no other exception escapes.
    """
    try:
        size = memoryview(data).nbytes
    except TypeError:
        raise DecodeError(f"expected bytes, got {type(data).__name__}", codec="legacy") from None
    if size > max_size:
        raise DecodeError(f"pickle of {size} bytes exceeds the limit of {max_size}", codec="legacy")
    if size == 0:
        raise DecodeError("empty body is not a pickle", codec="legacy")
    unpickler = _SafePyUnpickler(io.BytesIO(data), size)
    previous = _active()
    _ACTIVE.unpickler = unpickler
    try:
        try:
            obj = unpickler.load()
        except DecodeError:
            raise
        except RecursionError:
            raise _bad("nested too deeply") from None
        except MemoryError:
            raise _bad("needs more memory than available (corrupt length?)") from None
        except Exception as exc:  # pickle raises UnpicklingError, EOFError, ValueError, KeyError, ...
            raise _bad(f"{type(exc).__name__}: {exc}"[:300]) from None
        finally:
            # The stack and memo may hold up to the limits' worth of objects: not past here.
            unpickler.stack = unpickler.metastack = []
            unpickler.memo = {}
        try:
            return _resolve(obj)
        except DecodeError:
            raise
        except Exception as exc:  # e.g. a BYTEARRAY8 value used as a dict key or set member
            raise _bad(f"{type(exc).__name__}: {exc}"[:300]) from None
    finally:
        _ACTIVE.unpickler = previous


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
