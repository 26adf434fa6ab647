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
from genmanip_protocol.codec.images import decode_image, image_format
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
