"""Image decoding is an allow-list: JPEG and PNG by their magic bytes, before any library looks.

Before, an ``image`` tagged value holding an EPS made Pillow run Ghostscript (an external program):
``Image.open`` tries every plugin it has. Now every image decoder goes through
``genmanip_protocol.codec.images``: anything but JPEG/PNG magic is refused, and Pillow is opened
with ``formats=[that format]`` only.
"""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec, decode_jpeg
from genmanip_protocol.codec.images import declared_size, decode_image, image_format
from genmanip_protocol.codec.jpeg import jpeg_size
from genmanip_protocol.errors import DecodeError

sys.path.insert(0, str(Path(__file__).parent))

import _hostile as H

IMAGES = sorted(H.HOSTILE_IMAGES.items())
IDS = [name for name, _ in IMAGES]


def _image_tag(data: bytes) -> bytes:
    return pickle.dumps({"v": {"type": "image", "data": base64.b64encode(data).decode()}})


@pytest.mark.parametrize(("name", "data"), IMAGES, ids=IDS)
def test_image_tag_refuses_everything_but_jpeg_and_png(name: str, data: bytes) -> None:
    with pytest.raises(DecodeError) as ei:
        LegacyCodec().decode(_image_tag(data))
    msg = str(ei.value)
    assert "['v']" in msg and ("not a JPEG/PNG image" in msg or "invalid" in msg), msg


@pytest.mark.parametrize(("name", "data"), IMAGES, ids=IDS)
def test_jpeg_frames_must_be_jpeg_on_both_wires(name: str, data: bytes) -> None:
    legacy = H.tagged("jpeg_bytes", dtype="uint8", shape=[8, 8, 3], data=data)
    mp = H.mp_jpeg_ref(data, [8, 8, 3])
    if data.startswith(b"\xff\xd8\xff"):  # JPEG magic, then garbage: refused when decoded
        for body, codec in ((legacy, LegacyCodec()), (mp, MsgpackCodec())):
            obs = codec.decode(body)
            frame = obs["v"] if "v" in obs else obs.jpeg_frame("video.x_view")
            with pytest.raises(DecodeError, match="invalid JPEG"):
                frame.decode()
    else:  # refused as the reply is decoded: recorders pass frame bytes straight to ffmpeg
        with pytest.raises(DecodeError, match="not a JPEG image"):
            LegacyCodec().decode(legacy)
        with pytest.raises(DecodeError, match="not a JPEG image"):
            MsgpackCodec().decode(mp)
    with pytest.raises(DecodeError):
        decode_jpeg(data)
    with pytest.raises(DecodeError):
        jpeg_size(data)
    with pytest.raises(DecodeError):
        JpegFrame(data, (8, 8, 3)).decode()


@pytest.mark.parametrize(("name", "data"), IMAGES, ids=IDS)
def test_decode_image_refuses_by_magic_before_pillow(
    name: str, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    import PIL.Image

    calls: list[Any] = []
    real_open = PIL.Image.open

    def spy(fp: Any, mode: str = "r", formats: Any = None) -> Any:
        calls.append(formats)
        return real_open(fp, formats=formats)

    monkeypatch.setattr(PIL.Image, "open", spy)
    with pytest.raises(DecodeError):
        decode_image(data, max_pixels=1 << 20)
    if image_format(data) is None:
        assert calls == []  # Pillow never saw the bytes
    else:
        assert calls == [[image_format(data)]]  # and only with that one format


def test_pillow_is_only_ever_asked_for_the_sniffed_format(monkeypatch: pytest.MonkeyPatch) -> None:
    import PIL.Image

    calls: list[Any] = []
    real_open = PIL.Image.open

    def spy(fp: Any, mode: str = "r", formats: Any = None) -> Any:
        calls.append(formats)
        return real_open(fp, formats=formats)

    monkeypatch.setattr(PIL.Image, "open", spy)
    png = H.png(5, 7)
    out = LegacyCodec().decode(_image_tag(png))["v"]
    assert out.shape == (5, 7, 3) and not out.flags.writeable
    jpeg = JpegFrame.encode(np.zeros((8, 8, 3), np.uint8)).data
    decode_image(jpeg, max_pixels=64)
    assert calls == [["PNG"], ["JPEG"]]


def test_decode_image_bounds_the_declared_size() -> None:
    png = H.png(40, 50)
    with pytest.raises(DecodeError, match="exceeds the limit of 1000 pixels"):
        decode_image(png, max_pixels=1000)
    assert decode_image(png, max_pixels=2000).shape == (40, 50, 3)
    assert image_format(png) == "PNG" and image_format(png, ("JPEG",)) is None
    assert image_format(b"\xff\xd8\xff\xe0") == "JPEG" and image_format(b"\xff\xd8") is None


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A real small JPEG whose start-of-frame is rewritten to declare ``width`` x ``height``."""
    data = bytearray(JpegFrame.encode(np.zeros((8, 8, 3), np.uint8)).data)
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def _png_declaring(width: int, height: int) -> bytes:
    data = bytearray(H.png(4, 4))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    return bytes(data)


def test_declared_size_reads_the_header_without_a_library() -> None:
    assert declared_size(H.png(40, 50), "PNG") == (50, 40)
    assert declared_size(JpegFrame.encode(np.zeros((24, 32, 3), np.uint8)).data, "JPEG") == (32, 24)
    assert declared_size(_jpeg_declaring(60000, 50000), "JPEG") == (60000, 50000)
    assert declared_size(_png_declaring(1 << 31, 3), "PNG") == (1 << 31, 3)
    # unreadable headers: None (the decoder then reports the corrupt data), never an exception
    jpeg = JpegFrame.encode(np.zeros((8, 8, 3), np.uint8)).data
    sof = jpeg.index(b"\xff\xc0")
    for bad in (b"", b"\xff\xd8\xff", jpeg[:sof + 6], b"\xff\xd8\xff\xda\x00\x08" + b"\x00" * 8,
                b"\xff\xd8\xff\xe0\x00\x00\x00\x00", b"\xff\xd8\x00\x00\x00\x00",
                b"\xff\xd8" + b"\xff" * 5000):
        assert declared_size(bad, "JPEG") is None, bad[:16]
    for bad in (b"", H.png(4, 4)[:20], b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDX" + b"\x00" * 8):
        assert declared_size(bad, "PNG") is None
    assert declared_size(memoryview(H.png(3, 2)), "PNG") == (2, 3)
    assert declared_size(jpeg, "GIF") is None


@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_a_bomb_is_refused_before_pillow_opens_it(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow, opening an image above ~89 Mpx, prints a DecompressionBombWarning on stderr (the
    server chose it): the declared size is refused from the bytes before Pillow is asked."""
    import warnings

    import PIL.Image

    opened: list[Any] = []
    real_open = PIL.Image.open
    monkeypatch.setattr(PIL.Image, "open", lambda fp, mode="r", formats=None: opened.append(1)
                        or real_open(fp, formats=formats))
    bomb = _png_declaring(12000, 12000) if kind == "png" else _jpeg_declaring(12000, 12000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DecodeError, match="exceeds the limit of 1000 pixels"):
            decode_image(bomb, max_pixels=1000)
        with pytest.raises(DecodeError, match="exceeds the limit"):
            LegacyCodec().decode(_image_tag(bomb))
        if kind == "jpeg":
            with pytest.raises(DecodeError, match="exceeds the limit"):
                decode_jpeg(bomb)
    assert opened == []


_GS_CHILD = textwrap.dedent(
    """
    import base64, pickle, sys
    sys.path.insert(0, {here!r})
    import _hostile as H
    from genmanip_protocol.codec import LegacyCodec, MsgpackCodec, decode_jpeg
    from genmanip_protocol.codec.images import decode_image
    from genmanip_protocol.errors import DecodeError
    outcomes = []
    for name, data in sorted(H.HOSTILE_IMAGES.items()):
        for fn in (
            lambda: LegacyCodec().decode(pickle.dumps(
                {{"type": "image", "data": base64.b64encode(data).decode()}})),
            lambda: decode_jpeg(data),
            lambda: decode_image(data, max_pixels=1 << 20),
            lambda: LegacyCodec().decode(H.tagged("jpeg_bytes", dtype="uint8", shape=[8, 8, 3],
                                                  data=data))["v"].decode(),
            lambda: MsgpackCodec().decode(H.mp_jpeg_ref(data, [8, 8, 3])).decode_all(),
        ):
            try:
                fn()
                outcomes.append("ok " + name)
            except DecodeError:
                outcomes.append("refused")
    print(sorted(set(outcomes)))
    """
)


@pytest.mark.parametrize("backend", ["pillow", "simplejpeg"])
def test_no_decoder_runs_ghostscript(tmp_path: Path, backend: str) -> None:
    """A fake ``gs`` first on PATH writes a sentinel if any decoder hands data to Ghostscript
    (Pillow's EPS plugin runs ``gs --version`` and then ``gs`` on the data)."""
    sentinel = tmp_path / "gs-ran"
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("gs", "gswin32c", "gswin64c"):
        script = fake / name
        script.write_text(f'#!/bin/sh\necho "$@" >> {sentinel}\nexit 0\n')
        script.chmod(0o755)
    code = _GS_CHILD.format(here=str(Path(__file__).parent))
    if backend == "pillow":  # make the JPEG path use Pillow too
        code = "import genmanip_protocol.codec.jpeg as j; j._BACKEND['name'] = 'pillow'\n" + code
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['refused']", proc.stdout
    assert not sentinel.exists(), sentinel.read_text()
