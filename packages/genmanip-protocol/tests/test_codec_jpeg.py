from __future__ import annotations

import subprocess
import sys

import genmanip_protocol.codec.jpeg as jpeg_mod
import numpy as np
import pytest
from genmanip_protocol import DecodeError, EncodeError
from genmanip_protocol.codec import decode_jpeg, encode_jpeg


def _smooth(h: int = 48, w: int = 64) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 3 % 256, y * 5 % 256, (x + y) % 256], axis=-1).astype(np.uint8)


def test_roundtrip_quality() -> None:
    rgb = _smooth()
    data = encode_jpeg(rgb)
    assert data[:2] == b"\xff\xd8"
    out = decode_jpeg(data)
    assert out.shape == rgb.shape and out.dtype == np.uint8 and out.flags.writeable
    assert np.abs(out.astype(int) - rgb).mean() < 3
    assert len(encode_jpeg(rgb, quality=20)) < len(encode_jpeg(rgb, quality=95))
    # odd sizes and non-contiguous inputs
    odd = np.ascontiguousarray(_smooth(31, 17)[:, ::-1])
    assert decode_jpeg(encode_jpeg(_smooth(31, 17)[:, ::-1])).shape == odd.shape


def test_pillow_fallback_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    rgb = _smooth()
    fast = decode_jpeg(encode_jpeg(rgb))
    monkeypatch.setitem(jpeg_mod._BACKEND, "name", "pillow")
    assert jpeg_mod.jpeg_backend() == "pillow"
    data = encode_jpeg(rgb)
    slow = decode_jpeg(data)
    assert np.abs(slow.astype(int) - fast).mean() < 3
    assert jpeg_mod.jpeg_size(data) == (48, 64)
    with pytest.raises(DecodeError, match=r"invalid JPEG|not a JPEG"):
        decode_jpeg(b"\x89PNG\r\n\x1a\n" + bytes(30))


def test_no_backend_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(jpeg_mod._BACKEND, "name", "")
    with pytest.raises(DecodeError) as ei:
        decode_jpeg(b"\xff\xd8")
    assert "genmanip-protocol[jpeg]" in (ei.value.hint or "")
    with pytest.raises(EncodeError) as ee:
        encode_jpeg(_smooth())
    assert "genmanip-protocol[jpeg]" in (ee.value.hint or "")


def _with_size(data: bytes, h: int, w: int) -> bytes:
    """Rewrite the SOF0 marker's dimensions (a 'decompression bomb' header)."""
    i = data.index(b"\xff\xc0")
    b = bytearray(data)
    b[i + 5 : i + 7] = h.to_bytes(2, "big")
    b[i + 7 : i + 9] = w.to_bytes(2, "big")
    return bytes(b)


@pytest.mark.parametrize("backend", ["simplejpeg", "pillow"])
def test_huge_declared_size_is_refused_before_decoding(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(jpeg_mod._BACKEND, "name", backend)
    bomb = _with_size(encode_jpeg(_smooth()), 65000, 65000)
    with pytest.raises(DecodeError, match="exceeds"):  # ours, or Pillow's own bomb check
        decode_jpeg(bomb)


@pytest.mark.parametrize("data", [b"", b"\xff\xd8", b"garbage" * 10, bytes(100)])
def test_garbage_is_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_jpeg(data)
    with pytest.raises(DecodeError):
        decode_jpeg(bytearray(data))


def test_truncated_jpeg_is_decode_error_or_partial() -> None:
    data = encode_jpeg(_smooth())
    for cut in (10, 100, len(data) // 2):
        try:
            out = decode_jpeg(data[:cut])
        except DecodeError:
            continue
        assert out.shape == (48, 64, 3)  # libjpeg may pad a truncated scan; never anything else


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((4, 4), np.uint8),
        np.zeros((4, 4, 3), np.float32),
        np.zeros((0, 4, 3), np.uint8),
        [[1]],
    ],
)
def test_encode_validates_input(bad: object) -> None:
    with pytest.raises(EncodeError):
        encode_jpeg(bad)  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        encode_jpeg(_smooth(), quality=0)


def test_importing_the_protocol_loads_no_optional_library() -> None:
    code = (
        "import sys, genmanip_protocol, genmanip_protocol.codec;"
        "bad = [m for m in ('simplejpeg', 'PIL', 'ffmpeg', 'imageio_ffmpeg', 'torch') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
