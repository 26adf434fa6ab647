"""``JpegFrame`` (a camera frame still in JPEG form) and ``Observation`` (a lazily decoding mapping)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import DecodeError, EncodeError
from .jpeg import decode_jpeg, encode_jpeg, jpeg_size

__all__ = ["CAMERA_PREFIX", "STATE_PREFIX", "JpegFrame", "Observation", "is_observation_dict"]

CAMERA_PREFIX = "video."
STATE_PREFIX = "state."


class JpegFrame:
    """An undecoded JPEG camera frame: ``data`` (JPEG bytes) and the ``shape`` ``(H, W, 3)`` it
    decodes to. Cheap to create and to pass around; :meth:`decode` does the work."""

    __slots__ = ("data", "shape")

    data: bytes
    shape: tuple[int, int, int]

    def __init__(
        self, data: bytes | bytearray | memoryview, shape: tuple[int, int, int] | list[int]
    ) -> None:
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        if not isinstance(data, bytes):
            raise TypeError(f"JpegFrame data: expected bytes, got {type(data).__name__}")
        shp = tuple(shape)
        if (
            len(shp) != 3
            or shp[2] != 3
            or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shp
            )
        ):
            raise ValueError(
                f"JpegFrame shape: expected (H, W, 3) with positive ints, got {shape!r}"
            )
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "shape", (int(shp[0]), int(shp[1]), 3))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("JpegFrame is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JpegFrame):
            return NotImplemented
        return self.shape == other.shape and self.data == other.data

    def __hash__(self) -> int:
        return hash((self.shape, self.data))

    def __repr__(self) -> str:
        return f"JpegFrame(shape={self.shape}, {len(self.data)} bytes)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (JpegFrame, (self.data, self.shape))

    @property
    def nbytes(self) -> int:
        """Size of the JPEG data in bytes."""
        return len(self.data)

    def decode(self) -> np.ndarray:
        """Decode to an ``(H, W, 3)`` uint8 RGB array; DecodeError if it does not match ``shape``."""
        # Header first: a frame whose header disagrees with its declared shape is refused before
        # the decoder allocates the header's (possibly 16 Mpixel) output.
        h, w = jpeg_size(self.data)
        if (h, w, 3) != self.shape:
            raise DecodeError(
                f"JPEG frame header says {h}x{w} but the frame was declared {self.shape}",
                codec="jpeg",
            )
        arr = decode_jpeg(self.data)
        if arr.shape != self.shape:
            raise DecodeError(
                f"JPEG frame decodes to shape {arr.shape} but was declared {self.shape}",
                codec="jpeg",
            )
        return arr

    @classmethod
    def encode(cls, array: np.ndarray, quality: int = 85) -> JpegFrame:
        """JPEG-encode an ``(H, W, 3)`` uint8 RGB array (quality 85 = the GenManip server's)."""
        if not isinstance(array, np.ndarray):
            raise EncodeError(
                f"JpegFrame.encode: expected a numpy array, got {type(array).__name__}"
            )
        data = encode_jpeg(array, quality)
        return cls(data, array.shape)


_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _decode_pool() -> ThreadPoolExecutor:
    # One small shared pool, created on first use: libjpeg-turbo and Pillow release the GIL while
    # decoding, so a few threads decode several cameras at once; more would only add contention.
    if not _POOL:
        with _POOL_LOCK:
            if not _POOL:
                workers = max(2, min(4, os.cpu_count() or 2))
                _POOL.append(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gmp-jpeg"))
    return _POOL[0]


def is_observation_dict(d: Mapping[Any, Any]) -> bool:
    """True if ``d`` has a key starting with ``video.`` or ``state.`` (an observation)."""
    for k in d:
        if isinstance(k, str) and (k.startswith(CAMERA_PREFIX) or k.startswith(STATE_PREFIX)):
            return True
    return False


class Observation(MutableMapping[str, Any]):
    """One observation: a mutable mapping whose JPEG camera frames decode lazily.

    Values are what the server sent (``state.*`` as numpy arrays, ``instruction`` as str, ...),
    except camera values (``video.*``) that arrived as JPEG: they are stored as :class:`JpegFrame`
    and decoded to ``(H, W, 3)`` uint8 arrays on first ``obs[key]`` access (then cached).

    * :meth:`decode_all` decodes every still-encoded camera in parallel (a small thread pool);
      iterating the mapping, ``items()``, ``values()`` and ``to_dict()`` call it first.
      ``keys()``, ``len()``, ``in`` and :attr:`cameras` never decode.
    * :meth:`frame_bytes` returns the JPEG bytes a camera arrived as (also after it was decoded, until
      the value is replaced), so recorders can store frames without re-encoding.
    * Creating an Observation does no work: decoders build it around their dict without copying.
    """

    __slots__ = ("_data", "_jpeg")

    def __init__(self, data: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._data: dict[str, Any] = {}
        self._jpeg: dict[str, JpegFrame] = {}
        if data is not None:
            if isinstance(data, Observation):
                self._data.update(data._data)
                self._jpeg.update(data._jpeg)
            else:
                self._data.update(data)
        self._data.update(kwargs)

    @classmethod
    def _wrap(cls, data: dict[str, Any]) -> Observation:
        """Adopt ``data`` (no copy): for decoders that just built the dict."""
        self = cls.__new__(cls)
        self._data = data
        self._jpeg = {}
        return self

    # -- mapping protocol -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        if type(value) is JpegFrame:
            frame: JpegFrame = value
            arr = frame.decode()
            self._store(key, frame, arr)
            return arr
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self._data[key] = value
        self._jpeg.pop(key, None)

    def __delitem__(self, key: str) -> None:
        del self._data[key]
        self._jpeg.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        self.decode_all()
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> Any:  # a live dict_keys view; listing keys never decodes
        return self._data.keys()

    def items(self) -> Any:
        self.decode_all()
        return self._data.items()

    def values(self) -> Any:
        self.decode_all()
        return self._data.values()

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._data:
            return self[key]
        return default

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        if self.keys() != other.keys():
            return False
        for k in self._data:
            a, b = self[k], other[k]
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                    return False
                if (
                    a.shape != b.shape
                    or a.dtype != b.dtype
                    or not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
                ):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = []
        for k, v in self._data.items():
            if type(v) is JpegFrame:
                parts.append(f"{k!r}: <jpeg {v.shape}>")
            elif isinstance(v, np.ndarray):
                parts.append(f"{k!r}: <{v.dtype} {v.shape}>")
            else:
                r = repr(v)
                parts.append(f"{k!r}: {r if len(r) <= 60 else r[:57] + '...'}")
        return "Observation({" + ", ".join(parts) + "})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Observation, (self.to_dict(decode=False),))

    # -- camera helpers ---------------------------------------------------------------------------
    @property
    def cameras(self) -> list[str]:
        """Keys of the camera frames (``video.*``), in the order the server sent them."""
        return [k for k in self._data if isinstance(k, str) and k.startswith(CAMERA_PREFIX)]

    def is_encoded(self, key: str) -> bool:
        """True while ``key`` still holds an undecoded :class:`JpegFrame`. KeyError if absent."""
        return type(self._data[key]) is JpegFrame

    def frame_bytes(self, key: str) -> bytes | None:
        """JPEG bytes ``key`` arrived as (whether or not decoded since), or None for a raw frame or
        a value that was replaced. KeyError if absent."""
        value = self._data[key]
        if type(value) is JpegFrame:
            return value.data
        frame = self._jpeg.get(key)
        return frame.data if frame is not None else None

    def jpeg_frame(self, key: str) -> JpegFrame | None:
        """Like :meth:`frame_bytes` but the :class:`JpegFrame` (bytes + shape)."""
        value = self._data[key]
        if type(value) is JpegFrame:
            return value
        return self._jpeg.get(key)

    def decode_all(self) -> None:
        """Decode every still-encoded camera frame, several at once on a small thread pool.

        Raises the first frame's DecodeError; frames decoded successfully stay decoded.
        """
        pending = [(k, v) for k, v in self._data.items() if type(v) is JpegFrame]
        if not pending:
            return
        if len(pending) == 1:
            self[pending[0][0]]
            return
        # The caller decodes the first frame itself while the pool takes the rest: one thread
        # hand-off less, and progress even when the pool's threads wait for a busy CPU.
        pool = _decode_pool()
        futures = [(k, v, pool.submit(v.decode)) for k, v in pending[1:]]
        error: BaseException | None = None
        k0, v0 = pending[0]
        try:
            self._store(k0, v0, v0.decode())
        except BaseException as exc:  # re-raised after the pool's work is collected
            error = exc
        for k, v, fut in futures:
            try:
                arr = fut.result()
            except BaseException as exc:
                if error is None:
                    error = exc
                continue
            self._store(k, v, arr)
        if error is not None:
            raise error

    def _store(self, key: str, frame: JpegFrame, arr: np.ndarray) -> None:
        # Only replace the frame we decoded (another thread or the user may have replaced it).
        if self._data.get(key) is frame:
            self._data[key] = arr
            self._jpeg[key] = frame

    def to_dict(self, decode: bool = True) -> dict[str, Any]:
        """A plain dict copy. ``decode=False`` leaves JPEG frames as :class:`JpegFrame`."""
        if decode:
            self.decode_all()
        return dict(self._data)

    def raw_items(self) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs without decoding (camera values may be :class:`JpegFrame`)."""
        return list(self._data.items())

    def copy(self) -> Observation:
        """A shallow copy (arrays are shared; still-encoded frames stay encoded in both)."""
        new = Observation._wrap(dict(self._data))
        new._jpeg = dict(self._jpeg)
        return new
