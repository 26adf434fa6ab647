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
    before Pillow sees a byte), then the declared size against ``max_pixels`` and
    :data:`~genmanip_protocol.codec.limits.MAX_IMAGE_SIDE` before any pixel is decoded (a 400 KB
    PNG can declare 12000x12000). Raises :class:`DecodeError` for everything else.
    """
    fmt = image_format(data, allowed)
    if fmt is None:
        raise DecodeError(refused_format(data, allowed), codec=codec)
    img = open_image(data, fmt, codec=codec)
    try:
        w, h = img.size
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
