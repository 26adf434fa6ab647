"""JPEG encode/decode for camera frames (RGB, ``(H, W, 3)`` uint8).

simplejpeg (libjpeg-turbo, releases the GIL) is used when importable, else Pillow. Both are optional
(``pip install genmanip-protocol[jpeg]``) and imported lazily, so importing genmanip_protocol never
pays for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DecodeError, EncodeError
from .images import declared_size, image_format, open_image, refused_format
from .limits import limit_error

__all__ = ["MAX_JPEG_PIXELS", "decode_jpeg", "encode_jpeg", "jpeg_backend", "jpeg_size"]

#: Frames (and ``image`` values) declaring more pixels than this are refused before any decoding
#: allocates memory: a 600-byte JPEG header can declare 65535x65535 (12 GiB of RGB), and the
#: decoders allocate the whole output before they find the data missing (8000x8000 cost 183 MiB
#: with simplejpeg, 855 MiB with Pillow). 8 Mpixel (24 MiB of RGB) is 9 times the widest camera
#: frame (1280x720) and holds a 4K frame (3840x2160); at the limit a decode peaks at ~24 MiB
#: (simplejpeg) or ~80 MiB (Pillow, which keeps 4 bytes a pixel and copies once more).
MAX_JPEG_PIXELS = 8 * 1024 * 1024

_JPEG_ONLY = ("JPEG",)

_INSTALL_HINT = "install JPEG support: pip install 'genmanip-protocol[jpeg]' (or Pillow)"

#: Detected once: {"name": "simplejpeg" | "pillow" | ""} ("" = neither is installed).
_BACKEND: dict[str, str] = {}


def jpeg_backend() -> str | None:
    """Name of the JPEG library in use (``"simplejpeg"`` or ``"pillow"``), or None if neither."""
    name = _BACKEND.get("name")
    if name is None:
        try:
            import simplejpeg  # noqa: F401

            name = "simplejpeg"
        except ImportError:
            try:
                import PIL.Image  # noqa: F401

                name = "pillow"
            except ImportError:
                name = ""
        _BACKEND["name"] = name
    return name or None


def _check_rgb(rgb: Any, quality: int) -> np.ndarray:
    if not isinstance(rgb, np.ndarray):
        raise EncodeError(f"JPEG frame: expected a numpy array, got {type(rgb).__name__}")
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise EncodeError(
            f"JPEG frame: expected an (H, W, 3) uint8 RGB array, got shape {rgb.shape} dtype {rgb.dtype}"
        )
    if rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise EncodeError(f"JPEG frame: empty image of shape {rgb.shape}")
    if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100:
        raise EncodeError(f"JPEG quality: expected an int in 1..100, got {quality!r}")
    return np.ascontiguousarray(rgb)


def encode_jpeg(rgb: np.ndarray, quality: int = 85) -> bytes:
    """Encode an ``(H, W, 3)`` uint8 RGB frame as JPEG (4:2:0, like the GenManip server)."""
    arr = _check_rgb(rgb, quality)
    backend = jpeg_backend()
    if backend == "simplejpeg":
        import simplejpeg

        return bytes(
            simplejpeg.encode_jpeg(arr, quality=quality, colorspace="RGB", colorsubsampling="420")
        )
    if backend == "pillow":
        import io

        import PIL.Image

        buf = io.BytesIO()
        PIL.Image.fromarray(arr, "RGB").save(buf, format="JPEG", quality=quality, subsampling=2)
        return buf.getvalue()
    raise EncodeError(
        "cannot encode JPEG: neither simplejpeg nor Pillow is installed", hint=_INSTALL_HINT
    )


def _as_bytes(data: Any) -> bytes | memoryview:
    if isinstance(data, (bytes, memoryview)):
        return data
    if isinstance(data, bytearray):
        return bytes(data)
    raise DecodeError(f"JPEG data: expected bytes, got {type(data).__name__}", codec="jpeg")


def jpeg_size(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """``(height, width)`` from the JPEG header, without decoding the image.

    Data that does not start with the JPEG magic bytes is refused before any library sees it
    (Pillow would otherwise pick whichever plugin claims it, EPS -> Ghostscript included).
    """
    buf = _as_bytes(data)
    backend = jpeg_backend()
    if not backend:
        raise DecodeError(
            "cannot decode JPEG: neither simplejpeg nor Pillow is installed",
            codec="jpeg",
            hint=_INSTALL_HINT,
        )
    if image_format(buf, _JPEG_ONLY) is None:
        raise DecodeError(refused_format(buf, _JPEG_ONLY), codec="jpeg")
    size = declared_size(buf, "JPEG")
    if size is not None and backend == "pillow":
        # (read without a library: Pillow would warn on stderr about a bomb's size at open)
        return size[1], size[0]
    try:
        if backend == "simplejpeg":
            import simplejpeg

            h, w, _cs, _ss = simplejpeg.decode_jpeg_header(buf)
            return int(h), int(w)
        with open_image(buf, "JPEG", codec="jpeg") as img:
            w, h = img.size
            return int(h), int(w)
    except DecodeError:
        raise
    except Exception as exc:  # the libraries raise ValueError, OSError, SyntaxError, ...
        raise DecodeError(f"invalid JPEG data: {exc}", codec="jpeg") from None


def decode_jpeg(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode JPEG bytes to an ``(H, W, 3)`` uint8 RGB array (writable, C-contiguous).

    Raises :class:`DecodeError` for data without the JPEG magic bytes (checked before any library
    parses it), corrupt data, images above :data:`MAX_JPEG_PIXELS`, and when no JPEG library is
    installed (the hint names the ``jpeg`` extra).
    """
    buf = _as_bytes(data)
    h, w = jpeg_size(buf)
    if h * w > MAX_JPEG_PIXELS:
        raise limit_error(
            f"JPEG frame of {w}x{h} pixels exceeds the limit of {MAX_JPEG_PIXELS}",
            "MAX_JPEG_PIXELS",
            codec="jpeg",
            bound=MAX_JPEG_PIXELS,
        )
    decoder: Callable[[bytes | memoryview], np.ndarray]
    decoder = _decode_simplejpeg if jpeg_backend() == "simplejpeg" else _decode_pillow
    try:
        out = decoder(buf)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"invalid JPEG data: {exc}", codec="jpeg") from None
    if out.ndim != 3 or out.shape[2] != 3:
        raise DecodeError(f"JPEG decoded to unexpected shape {out.shape}", codec="jpeg")
    return out


def _decode_simplejpeg(buf: bytes | memoryview) -> np.ndarray:
    import simplejpeg

    # fastdct/fastupsample would be ~20% faster but change pixels; keep libjpeg's accurate path so
    # both backends agree closely.
    out: np.ndarray = simplejpeg.decode_jpeg(buf, colorspace="RGB")
    return out


def _decode_pillow(buf: bytes | memoryview) -> np.ndarray:
    # Pillow keeps RGB at 4 bytes a pixel: convert only when needed and let that image go before
    # the writable copy is made (~3.3x the output at peak instead of ~4.7x).
    with open_image(buf, "JPEG", codec="jpeg") as img:
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        w, h = rgb.size
        data: bytes = rgb.tobytes()
        del rgb
    out: np.ndarray = np.frombuffer(data, dtype=np.uint8).reshape(h, w, 3).copy()
    return out
