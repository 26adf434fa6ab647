"""The codec interface shared by the msgpack and legacy wires."""

from __future__ import annotations

import abc
from typing import Any

from .limits import MAX_DEPTH

__all__ = [
    "LEGACY_CONTENT_TYPE",
    "MAX_DEPTH",
    "MSGPACK_CONTENT_TYPE",
    "Codec",
]

MSGPACK_CONTENT_TYPE = "application/x-genmanip-msgpack"
LEGACY_CONTENT_TYPE = "application/octet-stream"

# MAX_DEPTH (re-exported here for the encoders) is defined with the other decoding bounds in
# .limits, which says why 64.


class Codec(abc.ABC):
    """A wire codec: Python object trees <-> one HTTP body.

    ``name`` is what ``get_codec`` and the ``/protocol`` route call it; ``content_type`` is the
    HTTP ``Content-Type`` of its bodies.
    """

    name: str
    content_type: str

    @abc.abstractmethod
    def encode(self, obj: Any) -> bytes:
        """Encode ``obj`` into one bytes object. Raises ``EncodeError`` naming the offending field."""

    def encode_parts(self, obj: Any) -> list[bytes | memoryview]:
        """Encode ``obj`` as a list of buffers whose concatenation equals ``encode(obj)``.

        Lets a transport hand large array buffers to ``socket.sendmsg``/``writev`` without joining
        them first. The default is a single part.
        """
        return [self.encode(obj)]

    @abc.abstractmethod
    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """Decode one body. Raises ``DecodeError`` (or a subclass) for anything malformed, never
        another exception type."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
