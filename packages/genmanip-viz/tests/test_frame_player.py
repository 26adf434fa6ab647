"""The episode page's frame player: JPEG frames served by index from a frame store, the timeline,
and the camera looked up (never joined onto a path). Real HTTP against a real server."""

from __future__ import annotations

import json
import re
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from genmanip_protocol.codec import encode_jpeg
from genmanip_results.testing import write_client_run
from genmanip_results.video import read_video_frames
from genmanip_viz.server import VizServer


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_page_plays_the_frame_store(tmp_path: Path) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/lift": [1.0]}, steps=10, cameras=("left_camera",))
    d = run / "t/lift/0"
    jpegs = [bytes(encode_jpeg(f)) for f in read_video_frames(d / "left_camera.mp4")]
    with open(d / "left_camera.jpegs", "wb") as fh:
        for j in jpegs:
            fh.write(struct.pack(">I", len(j)) + j)
    (d / "left_camera.mp4").unlink()
    with VizServer(tmp_path, warm=False) as srv:
        base = srv.base_url
        deadline = time.monotonic() + 30
        runs = b""
        while b"/run/" not in runs and time.monotonic() < deadline:
            runs = _get(base + "/")[1]
            time.sleep(0.1)
        key = re.search(rb'href="/run/([0-9a-f]+)', runs)
        assert key
        run_page = _get(base + f"/run/{key.group(1).decode()}")[1].decode()
        ep_url = re.search(r'href="(/episode/[^"]+)"', run_page)
        assert ep_url
        status, page = _get(base + ep_url.group(1))
        assert status == 200
        html = page.decode()
        assert f'data-n="{len(jpegs)}"' in html
        srcs = re.findall(r'data-base="([^"]+)" data-tail="([^"]+)"', html)
        assert len(srcs) == 1
        b, tail = srcs[0]
        for i in (0, 3, len(jpegs) - 1):
            status, body = _get(base + b + str(i) + tail)
            assert status == 200 and body == jpegs[i]
        assert _get(base + b + str(len(jpegs)) + tail)[0] == 404
        assert _get(base + b.replace("left_camera", "..%2Fsteps.jsonl") + "0" + tail)[0] == 404
        tl = re.search(r'data-timeline="([^"]+)"', html)
        assert tl
        status, body = _get(base + tl.group(1))
        data = json.loads(body)
        assert status == 200 and data["frame_steps"][0] == [0, 0] and "joints" in data["state"]


@pytest.mark.parametrize("camera", ["missing", "left_camera.mp4"])
def test_unknown_camera_is_404(tmp_path: Path, camera: str) -> None:
    write_client_run(tmp_path, "b", "r", tasks={"t/lift": [1.0]}, steps=3, cameras=("left_camera",))
    with VizServer(tmp_path, warm=False) as srv:
        assert _get(f"{srv.base_url}/frame/0123456789ab/{camera}/0/t/lift/0")[0] == 404
