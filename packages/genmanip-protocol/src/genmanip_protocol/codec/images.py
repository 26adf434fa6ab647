"""The one gate in front of every image decoder: an allow-list of formats, checked from magic bytes.

Pillow's ``Image.open`` tries every plugin it has; one of them (EPS/PostScript) hands the data to
Ghostscript, an external program with its own history of code execution, and others (PSD, TIFF,
ICO, WMF, ...) are large parsers no camera frame needs. So every decoder of image data in this
project (``image`` tagged values, JPEG camera frames, ``jpeg_size``) first calls
:func:`image_format`, which accepts only the formats of :data:`IMAGE_FORMATS` by their magic
bytes, and then opens the data with ``Image.open(..., formats=[that format])`` so Pillow cannot
fall back to another plugin. Nothing else in the project calls ``PIL.Image.open`` (a test in
``tests/reliability/test_codec_fuzz.py`` greps the sources to keep it that way).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from ..errors import DecodeError
from .limits import MAX_IMAGE_SIDE, limit_error

__all__ = [
    "IMAGE_FORMATS",
    "JPEG_MAGIC",
    "PNG_MAGIC",
    "declared_size",
    "decode_image",
    "image_format",
    "open_image",
    "refused_format",
]

#: JPEG files start with SOI (FF D8) followed by another marker's FF.
JPEG_MAGIC = b"\xff\xd8\xff"
#: The PNG signature (8 bytes).
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: Pillow format name -> magic bytes. The only image formats any decoder here will look at:
#: JPEG (camera frames) and PNG (the reference server's ``image`` tagged values).
IMAGE_FORMATS: dict[str, bytes] = {"JPEG": JPEG_MAGIC, "PNG": PNG_MAGIC}


def image_format(
    data: bytes | bytearray | memoryview, allowed: tuple[str, ...] = ("JPEG", "PNG")
) -> str | None:
    """The format of ``data`` among ``allowed`` (names of :data:`IMAGE_FORMATS`), judged only by
    its leading magic bytes, or None. Never parses more than those bytes."""
    head = bytes(memoryview(data)[:8])
    for name in allowed:
        magic = IMAGE_FORMATS.get(name)
        if magic is not None and head.startswith(magic):
            return name
    return None


def _what(head: bytes) -> str:
    """A name for refused data, for the error message (recognised by magic, never parsed)."""
    for magic, name in (
        (b"%!PS", "PostScript/EPS"),
        (b"\xc5\xd0\xd3\xc6", "EPS"),
        (b"%PDF", "PDF"),
        (b"II*\x00", "TIFF"),
        (b"MM\x00*", "TIFF"),
        (b"GIF8", "GIF"),
        (b"BM", "BMP"),
        (b"8BPS", "PSD"),
        (b"\x00\x00\x01\x00", "ICO"),
        (b"<", "XML/SVG"),
    ):
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    return f"data starting {head[:8]!r}"


def refused_format(data: bytes | bytearray | memoryview, allowed: tuple[str, ...]) -> str:
    """The message for data that is not one of ``allowed``."""
    return f"not a {'/'.join(allowed)} image ({_what(bytes(memoryview(data)[:16]).lstrip())})"


#: JPEG start-of-frame markers (they carry the size): C0-CF except DHT (C4), JPG (C8), DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def declared_size(data: bytes | bytearray | memoryview, fmt: str) -> tuple[int, int] | None:
    """``(width, height)`` as a PNG's IHDR or a JPEG's start-of-frame declares it, read from the
    bytes without any library (so a limit can refuse a bomb before Pillow, which warns on
    stderr about large images at ``open``, sees it); None when the header cannot be read (the
    decoder then reports the corrupt data). Reads at most the markers before the first scan."""
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(buf)
    if fmt == "PNG":
        if n < 24 or bytes(buf[12:16]) != b"IHDR":
            return None
        return int.from_bytes(buf[16:20], "big"), int.from_bytes(buf[20:24], "big")
    if fmt != "JPEG":
        return None
    pos = 2  # after SOI
    while pos + 4 <= n:
        if buf[pos] != 0xFF:
            return None
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length field
            pos += 2
            continue
        if marker == 0xDA:  # start of scan: no frame header before it
            return None
        length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if pos + 9 > n:
                return None
            height = int.from_bytes(buf[pos + 5 : pos + 7], "big")
            width = int.from_bytes(buf[pos + 7 : pos + 9], "big")
            return width, height
        pos += 2 + length
    return None


def _check_size(w: int, h: int, fmt: str, max_pixels: int, codec: str) -> None:
    if w > MAX_IMAGE_SIDE or h > MAX_IMAGE_SIDE:
        raise limit_error(
            f"{fmt} image of {w}x{h} pixels exceeds the limit of {MAX_IMAGE_SIDE} per side",
            "MAX_IMAGE_SIDE",
            codec=codec,
        )
    if w * h > max_pixels:
        raise limit_error(
            f"{fmt} image of {w}x{h} pixels exceeds the limit of {max_pixels} pixels",
            "MAX_JPEG_PIXELS",
            codec=codec,
            bound=max_pixels,
        )


def open_image(data: bytes | bytearray | memoryview, fmt: str, *, codec: str) -> Any:
    """``PIL.Image.open`` restricted to ``fmt`` (which the caller matched with
    :func:`image_format`). Raises :class:`DecodeError` if Pillow is missing or disagrees."""
    try:
        import PIL.Image
    except ImportError:
        raise DecodeError(
            f"decoding a {fmt} image needs Pillow: pip install pillow", codec=codec
        ) from None
    try:
        img = PIL.Image.open(io.BytesIO(bytes(data)), formats=[fmt])
    except Exception as exc:  # UnidentifiedImageError, OSError, SyntaxError, ...
        raise DecodeError(
            f"invalid {fmt} image ({type(exc).__name__}: {exc})"[:300], codec=codec
        ) from None
    if img.format != fmt:  # a JPEG with a multi-picture index opens as "MPO": not a camera frame
        img.close()
        raise DecodeError(f"not a {fmt} image ({img.format})", codec=codec)
    return img


def decode_image(
    data: bytes | bytearray | memoryview,
    *,
    max_pixels: int,
    allowed: tuple[str, ...] = ("JPEG", "PNG"),
    codec: str = "image",
) -> np.ndarray:
    """Decode a JPEG or PNG to a read-only array (``np.asarray`` of the Pillow image, any mode).

    The format is checked from the magic bytes first (anything else, EPS included, is refused
    before Pillow sees a byte), then the declared size (:func:`declared_size`, again before
    Pillow) against ``max_pixels`` and :data:`~genmanip_protocol.codec.limits.MAX_IMAGE_SIDE`,
    and once more as Pillow reads it, before any pixel is decoded (a 400 KB PNG can declare
    12000x12000). Raises :class:`DecodeError` for everything else.
    """
    fmt = image_format(data, allowed)
    if fmt is None:
        raise DecodeError(refused_format(data, allowed), codec=codec)
    size = declared_size(data, fmt)
    if size is not None:  # refused before Pillow sees the data (and warns about its size)
        _check_size(size[0], size[1], fmt, max_pixels, codec)
    img = open_image(data, fmt, codec=codec)
    try:
        w, h = img.size
        _check_size(w, h, fmt, max_pixels, codec)  # what Pillow read is what it would decode
        try:
            img.load()
            arr = np.asarray(img)
        except Exception as exc:  # truncated data, DecompressionBombError, ...
            raise DecodeError(
                f"invalid {fmt} image ({type(exc).__name__}: {exc})"[:300], codec=codec
            ) from None
    finally:
        img.close()
    arr.flags.writeable = False
    return arr
