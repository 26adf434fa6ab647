"""Wire codecs of the GenManip protocol.

* :class:`MsgpackCodec` (``application/x-genmanip-msgpack``): msgpack header + out-of-band array
  buffers; decodes to read-only zero-copy array views.
* :class:`LegacyCodec` (``application/octet-stream``): the real server's pickle wire, read only
  through the allow-list unpickler :func:`safe_loads`.

Both decode observation dicts (keys ``video.*``/``state.*``) to :class:`Observation` objects whose
JPEG camera frames (:class:`JpegFrame`) decode lazily.
"""

from __future__ import annotations

from ..errors import ConfigError
from ._base import LEGACY_CONTENT_TYPE, MAX_DEPTH, MSGPACK_CONTENT_TYPE, Codec
from .jpeg import decode_jpeg, encode_jpeg
from .legacy import LegacyCodec, safe_loads
from .msgpack_codec import MsgpackCodec
from .observation import JpegFrame, Observation

__all__ = [
    "CODEC_NAMES",
    "LEGACY_CONTENT_TYPE",
    "MAX_DEPTH",
    "MSGPACK_CONTENT_TYPE",
    "Codec",
    "JpegFrame",
    "LegacyCodec",
    "MsgpackCodec",
    "Observation",
    "codec_for_content_type",
    "decode_jpeg",
    "encode_jpeg",
    "get_codec",
    "safe_loads",
]

#: Codec names in order of preference.
CODEC_NAMES: tuple[str, ...] = ("msgpack", "legacy")

_CODECS: dict[str, type[Codec]] = {"msgpack": MsgpackCodec, "legacy": LegacyCodec}


def get_codec(name: str) -> Codec:
    """A codec instance by name: ``"msgpack"`` or ``"legacy"`` (ConfigError otherwise)."""
    cls = _CODECS.get(name.strip().lower() if isinstance(name, str) else name)
    if cls is None:
        raise ConfigError(
            f"unknown codec {name!r}: expected one of {', '.join(CODEC_NAMES)}",
            hint="use --codec msgpack (fast, testbed) or --codec legacy (the real GenManip server)",
        )
    return cls()


def codec_for_content_type(content_type: str | None) -> Codec | None:
    """The codec for an HTTP ``Content-Type`` value (parameters ignored), or None if unknown."""
    if not content_type:
        return None
    base = content_type.split(";", 1)[0].strip().lower()
    if base == MSGPACK_CONTENT_TYPE:
        return MsgpackCodec()
    if base == LEGACY_CONTENT_TYPE:
        return LegacyCodec()
    return None
