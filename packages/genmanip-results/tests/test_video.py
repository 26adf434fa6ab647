from __future__ import annotations

import os
import subprocess
from pathlib import Path

import genmanip_results.video as video_mod
import numpy as np
import pytest
from genmanip_protocol import ExitCode
from genmanip_protocol.codec import JpegFrame
from genmanip_results.video import (
    FfmpegError,
    FfmpegNotFoundError,
    VideoError,
    VideoWriter,
    ffmpeg_executable,
    probe_video,
    read_video_frames,
    transcode_jpegs,
    video_info,
)


def _frame(i: int, h: int = 48, w: int = 64) -> np.ndarray:
    # smooth gradients + a per-frame brightness so frames are distinguishable after encoding
    y, x = np.mgrid[0:h, 0:w]
    base = (x * 100 // w + y * 60 // h + i * 5) % 256
    return np.stack([base, np.full_like(base, 128), 255 - base], axis=-1).astype(np.uint8)


def _ffmpeg_codec_line(path: Path) -> str:
    # An independent look at the stream, from ffmpeg's own banner (not our parser).
    res = subprocess.run(
        [ffmpeg_executable(), "-hide_banner", "-i", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return next(line for line in res.stderr.splitlines() if "Video:" in line)


def test_writer_produces_browser_playable_h264(tmp_path: Path) -> None:
    path = tmp_path / "left_camera.mp4"
    frames = [_frame(i) for i in range(30)]
    with VideoWriter(path, 64, 48, fps=30) as w:
        for f in frames:
            w.write(f)
        assert not path.exists() and (tmp_path / "left_camera.mp4.part").exists()  # atomic
    assert probe_video(path) == (30, 64, 48)
    info = video_info(path)
    assert info.codec == "h264" and info.pix_fmt == "yuv420p" and info.fps == 30.0
    line = _ffmpeg_codec_line(path)
    assert "h264" in line and "yuv420p" in line
    assert path.read_bytes()[4:8] == b"ftyp"
    head = path.read_bytes()[:4096]
    assert head.find(b"moov") != -1 and (
        head.find(b"mdat") == -1 or head.find(b"moov") < head.find(b"mdat")
    )  # +faststart
    back = list(read_video_frames(path))
    assert len(back) == 30
    for i in (0, 15, 29):
        assert np.abs(back[i].astype(int) - frames[i]).mean() < 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["left_camera.mp4"]


def test_odd_sizes_are_padded_to_even(tmp_path: Path) -> None:
    path = tmp_path / "odd.mp4"
    with VideoWriter(path, 63, 47, nice=5) as w:
        for i in range(3):
            w.write(_frame(i, 47, 63))
    assert probe_video(path) == (3, 64, 48)
    first = next(read_video_frames(path))
    assert np.abs(first[:47, :63].astype(int) - _frame(0, 47, 63)).mean() < 6


def test_transcode_jpegs_without_decoding_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import genmanip_protocol.codec.jpeg as jpeg_mod
    import genmanip_protocol.codec.observation as obs_mod

    frames = [JpegFrame.encode(_frame(i)) for i in range(30)]
    calls: list[int] = []
    for mod in (jpeg_mod, obs_mod):  # Python-side JPEG decoding must never run
        monkeypatch.setattr(mod, "decode_jpeg", lambda data: calls.append(1))
    path = tmp_path / "top_camera.mp4"
    n = transcode_jpegs((f if i % 2 else f.data for i, f in enumerate(frames)), path, fps=30)
    assert n == 30 and calls == []
    assert probe_video(path) == (30, 64, 48)
    info = video_info(path)
    assert info.codec == "h264" and info.pix_fmt == "yuv420p"
    back = list(read_video_frames(path))
    assert np.abs(back[10].astype(int) - _frame(10)).mean() < 8
    assert (
        transcode_jpegs([], tmp_path / "empty.mp4") == 0 and not (tmp_path / "empty.mp4").exists()
    )


def test_transcode_failure_carries_ffmpeg_stderr_and_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.mp4"
    with pytest.raises(FfmpegError) as ei:
        transcode_jpegs([b"this is not a jpeg" * 10] * 5, path)
    assert ei.value.returncode not in (0, None)
    assert "JPEG" in ei.value.stderr or "Invalid data" in ei.value.stderr
    assert list(tmp_path.iterdir()) == []


def test_ffmpeg_failure_mid_write(tmp_path: Path) -> None:
    path = tmp_path / "x.mp4"
    # A thread count libx264 rejects: ffmpeg exits at startup, the writer notices on write/close.
    with pytest.raises(FfmpegError) as ei:
        w = VideoWriter(path, 64, 48, threads=-5)
        for i in range(200):
            w.write(_frame(i))
        w.close()
    assert ei.value.stderr
    assert list(tmp_path.iterdir()) == []


def test_exception_inside_block_aborts_and_keeps_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(b"previous")
    with pytest.raises(RuntimeError):
        with VideoWriter(path, 64, 48) as w:
            w.write(_frame(0))
            raise RuntimeError("policy crashed")
    assert path.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]


def test_zero_frames_create_nothing(tmp_path: Path) -> None:
    w = VideoWriter(tmp_path / "none.mp4", 64, 48)
    assert w.close() is None
    assert list(tmp_path.iterdir()) == []


def test_input_validation(tmp_path: Path) -> None:
    with VideoWriter(tmp_path / "a.mp4", 64, 48) as w:
        for bad in (np.zeros((48, 64, 3), np.float32), np.zeros((48, 63, 3), np.uint8), "frame"):
            with pytest.raises(VideoError, match="expected a \\(48, 64, 3\\) uint8"):
                w.write(bad)  # type: ignore[arg-type]
        w.write(_frame(0))
    with pytest.raises(VideoError, match="closed"):
        w.write(_frame(1))
    for kwargs in ({"width": 0}, {"fps": 0}, {"crf": 99}, {"preset": "warp"}):
        args = {"path": tmp_path / "b.mp4", "width": 64, "height": 48, **kwargs}
        with pytest.raises(VideoError):
            VideoWriter(**args)  # type: ignore[arg-type]
    with pytest.raises(VideoError, match="does not exist"):
        VideoWriter(tmp_path / "missing" / "c.mp4", 64, 48)
    with pytest.raises(VideoError, match="no such video"):
        probe_video(tmp_path / "nope.mp4")
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    with pytest.raises(FfmpegError):
        probe_video(tmp_path / "junk.mp4")


def test_read_frames_early_stop(tmp_path: Path) -> None:
    path = tmp_path / "r.mp4"
    with VideoWriter(path, 64, 48) as w:
        for i in range(60):
            w.write(_frame(i))
    it = read_video_frames(path)
    first = next(it)
    assert first.shape == (48, 64, 3) and first.dtype == np.uint8
    it.close()  # kills ffmpeg; must not hang or raise


def _write(path: Path, n: int, offset: int = 0) -> Path:
    with VideoWriter(path, 64, 48) as w:
        for i in range(n):
            w.write(_frame(i + offset))
    return path


def test_reading_within_a_root_refuses_links_that_leave_it(tmp_path: Path) -> None:
    """``within=``: the video is opened inside the root (links resolved) and ffmpeg reads the
    opened file; a link to an outside video is refused before ffmpeg runs, a link inside is read."""
    from genmanip_results.paths import UnsafePathError

    root = tmp_path / "results"
    root.mkdir()
    inside = _write(root / "left_camera.mp4", 6)
    outside = _write(tmp_path / "secret.mp4", 9, offset=100)
    assert probe_video(inside, within=root) == probe_video(inside) == (6, 64, 48)
    by_name = list(read_video_frames(inside))
    within = list(read_video_frames(inside, within=root, size=(64, 48)))
    assert len(within) == 6
    assert all(np.array_equal(a, b) for a, b in zip(by_name, within, strict=True))
    (root / "alias.mp4").symlink_to(inside)
    assert video_info(root / "alias.mp4", within=root).n_frames == 6
    (root / "right_camera.mp4").symlink_to(outside)
    (root / "sub").symlink_to(tmp_path, target_is_directory=True)
    for link in (root / "right_camera.mp4", root / "sub" / "secret.mp4"):
        assert probe_video(link) == (9, 64, 48)  # by name, the link is followed
        with pytest.raises(UnsafePathError, match="resolves outside the results root"):
            probe_video(link, within=root)
        with pytest.raises(UnsafePathError, match="resolves outside the results root"):
            next(read_video_frames(link, within=root))
    with pytest.raises(VideoError, match="no such video file"):
        video_info(root / "missing.mp4", within=root)


def test_missing_ffmpeg_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GMP_FFMPEG", str(tmp_path / "no-ffmpeg"))
    with pytest.raises(FfmpegNotFoundError) as ei:
        ffmpeg_executable()
    assert ei.value.exit_code == ExitCode.NOT_INSTALLED
    monkeypatch.delenv("GMP_FFMPEG")
    monkeypatch.setattr(video_mod, "_FFMPEG_EXE", {})
    import imageio_ffmpeg

    monkeypatch.setattr(
        imageio_ffmpeg, "get_ffmpeg_exe", lambda: (_ for _ in ()).throw(RuntimeError("no binary"))
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FfmpegNotFoundError) as ei2:
        ffmpeg_executable()
    assert "genmanip-results[video]" in (ei2.value.hint or "")


def test_env_override_uses_that_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ffmpeg_executable()
    monkeypatch.setenv("GMP_FFMPEG", real)
    assert ffmpeg_executable() == real
    assert os.access(real, os.X_OK)


def test_concurrent_first_lookups_run_one_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cameras transcoded at once look ffmpeg up at once: one lookup (imageio-ffmpeg runs the
    binary to check it), the others wait for its answer (a second check, cut by a Ctrl-C of the
    process group, made its thread report "ffmpeg not found")."""
    import inspect
    import sys
    import threading
    import time

    import imageio_ffmpeg

    monkeypatch.delenv("GMP_FFMPEG", raising=False)
    monkeypatch.setattr(video_mod, "_FFMPEG_EXE", {})
    real = imageio_ffmpeg.get_ffmpeg_exe
    calls: list[int] = []
    entered = threading.Event()
    release = threading.Event()

    def lookup() -> str:
        calls.append(1)
        entered.set()
        assert release.wait(30)
        return str(real())

    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lookup)
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(ffmpeg_executable())) for _ in range(4)]
    threads[0].start()
    assert entered.wait(30)
    for t in threads[1:]:
        t.start()
    # Let the first lookup answer only once every other thread is waiting for it or looking up
    # itself: at the lookup lock (its line in ffmpeg_executable), or inside lookup().
    src, first = inspect.getsourcelines(ffmpeg_executable)
    lock_line = first + next(i for i, line in enumerate(src) if "with _FFMPEG_LOOKUP" in line)
    deadline = time.monotonic() + 30

    def waiting(t: threading.Thread) -> bool:
        frame = sys._current_frames().get(t.ident or -1)
        if frame is not None and frame.f_code is ffmpeg_executable.__code__:
            return frame.f_lineno == lock_line  # blocked on the lock
        while frame is not None:  # or somewhere inside lookup() (waiting for the release)
            if frame.f_code is lookup.__code__:
                return True
            frame = frame.f_back
        return False

    while not all(waiting(t) for t in threads[1:]):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    release.set()
    for t in threads:
        t.join(30)
    assert len(calls) == 1 and len(found) == 4 and len(set(found)) == 1
    assert os.access(found[0], os.X_OK)
