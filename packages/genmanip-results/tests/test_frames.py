"""genmanip_results.frames: JPEG frame stores in every state, read frame by frame, videos made
atomically under a lock (real files, real ffmpeg)."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from genmanip_protocol.codec import encode_jpeg
from genmanip_results.discovery import load_episode
from genmanip_results.frames import (
    FrameStore,
    FrameStoreError,
    ensure_video,
    episode_streams,
    finish_spool,
    store_info,
    transcode_episode,
)
from genmanip_results.provenance import CATEGORY_VIDEOS
from genmanip_results.video import read_video_frames, video_info

_LEN = struct.Struct(">I")


def _jpegs(n: int, w: int = 64, h: int = 48) -> list[bytes]:
    out = []
    for i in range(n):
        img = np.zeros((h, w, 3), dtype=np.uint8)
        img[:, : (i * 7) % w] = (200, 40, 40)
        out.append(encode_jpeg(img, quality=90))
    return out


def _write_store(path: Path, frames: list[bytes], tail: bytes = b"") -> None:
    with open(path, "wb") as fh:
        for f in frames:
            fh.write(_LEN.pack(len(f)) + f)
        fh.write(tail)


def test_store_random_access_and_info(tmp_path: Path) -> None:
    frames = _jpegs(7)
    p = tmp_path / "left_camera.jpegs"
    _write_store(p, frames)
    with FrameStore(p, within=tmp_path) as st:
        assert len(st) == 7 and st.complete
        assert st[3] == frames[3] and st[-1] == frames[-1]
        assert list(st) == frames
    info = store_info(p)
    assert (info.n_frames, info.width, info.height, info.codec) == (7, 64, 48, "mjpeg")
    assert video_info(p) == info  # every reader takes a store or a video alike


def test_spool_with_torn_tail_finishes_whole(tmp_path: Path) -> None:
    frames = _jpegs(4)
    spool = tmp_path / "cam.spool"
    _write_store(spool, frames, tail=_LEN.pack(5000) + b"\xff\xd8partial")  # a kill mid-write
    with FrameStore(spool) as st:
        assert len(st) == 4 and not st.complete
    store = tmp_path / "cam.jpegs"
    assert finish_spool(spool, store) == 4
    assert not spool.exists()
    with FrameStore(store) as st:
        assert st.complete and list(st) == frames
    assert finish_spool(spool, store) == 4  # a recovery finding it already moved


def test_damaged_store_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "cam.jpegs"
    p.write_bytes(_LEN.pack(0) + b"xx")
    with pytest.raises(FrameStoreError, match="bad length"):
        FrameStore(p)
    q = tmp_path / "q.jpegs"
    _write_store(q, [b"not a jpeg at all"])
    with FrameStore(q) as st, pytest.raises(FrameStoreError, match="not a JPEG"):
        st[0]


def test_store_decodes_frame_by_frame_with_ffmpeg(tmp_path: Path) -> None:
    p = tmp_path / "cam.jpegs"
    _write_store(p, _jpegs(9))
    got = list(read_video_frames(p, within=tmp_path))
    assert len(got) == 9 and got[0].shape == (48, 64, 3)
    small = list(read_video_frames(p, size=(32, 24)))
    assert len(small) == 9 and small[5].shape == (24, 32, 3)
    # the red band grows frame by frame: decoding is in order
    assert (got[1][:, :, 0] > 150).sum() < (got[5][:, :, 0] > 150).sum()


def test_symlinked_store_outside_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jpegs"
    _write_store(outside, _jpegs(2))
    root = tmp_path / "root"
    root.mkdir()
    (root / "cam.jpegs").symlink_to(outside)
    with pytest.raises(Exception, match="outside the results root"):
        FrameStore(root / "cam.jpegs", within=root)


def test_episode_states_and_ensure_video(tmp_path: Path) -> None:
    ep = tmp_path / "ep"
    (ep / ".frames").mkdir(parents=True)
    _write_store(ep / ".frames" / "a.jpegs", _jpegs(3))
    _write_store(ep / "b.jpegs", _jpegs(5))
    (ep / "merged_with_plot.mp4").write_bytes(b"not a camera")
    s = episode_streams(ep)
    assert sorted(s) == ["a", "b"]
    assert s["a"].state == "spooled" and s["b"].state == "frames"
    (ep / "b.mp4.part").write_bytes(b"left by a killed maker")
    assert episode_streams(ep)["b"].making_video
    mp4 = ensure_video(ep, "b", within=tmp_path)
    assert mp4 == ep / "b.mp4" and not (ep / "b.mp4.part").exists()
    info = video_info(mp4)
    assert (info.n_frames, info.codec, info.pix_fmt) == (5, "h264", "yuv420p")
    assert episode_streams(ep)["b"].state == "frames+video"
    assert ensure_video(ep, "b") == mp4  # made once
    with pytest.raises(FrameStoreError):
        ensure_video(ep, "a")  # still spooled: not a finished store
    manifest = (ep / ".gmp-generated.jsonl").read_text()
    assert '"b.mp4"' in manifest and CATEGORY_VIDEOS in manifest


def test_concurrent_makers_make_one_video(tmp_path: Path) -> None:
    ep = tmp_path / "ep"
    ep.mkdir()
    _write_store(ep / "cam.jpegs", _jpegs(30))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_video(ep, "cam"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [ep / "cam.mp4"] * 4
    assert video_info(ep / "cam.mp4").n_frames == 30
    assert sorted(p.name for p in ep.iterdir() if p.name.endswith(".part")) == []


def test_transcode_episode_drop_frames_and_discovery(tmp_path: Path) -> None:
    ep = tmp_path / "bench" / "run" / "task" / "0"
    ep.mkdir(parents=True)
    _write_store(ep / "left_camera.jpegs", _jpegs(4))
    (ep / "steps.jsonl").write_text("")
    info = load_episode(ep)
    assert info.videos == {"left_camera": ep / "left_camera.jpegs"}  # readers find the store
    made = transcode_episode(ep, drop_frames=True)
    assert made == [ep / "left_camera.mp4"] and not (ep / "left_camera.jpegs").exists()
    assert load_episode(ep).videos == {"left_camera": ep / "left_camera.mp4"}
