"""The overlay video plays one observation per control step (``PLAYBACK_FPS``), not at the camera
videos' 30 fps: a 45-step episode lasts 4.5 s, not 1.5 s."""

from __future__ import annotations

from pathlib import Path

from genmanip_artifacts import load_series, plot_episode
from genmanip_artifacts.overlay import PLAYBACK_FPS, write_overlay_video
from genmanip_results.testing import write_client_episode
from genmanip_results.video import video_info

CAMERAS = {"left_camera": (64, 48), "right_camera": (64, 48)}


def _episode(root: Path) -> Path:
    return write_client_episode(root / "bench" / "run1", "bench/suite/task_a", "000", steps=45,
                                chunk=1, cameras=CAMERAS)


def test_a_45_step_episode_plays_at_the_control_rate(tmp_path: Path) -> None:
    ep = _episode(tmp_path)
    camera = video_info(ep / "left_camera.mp4")
    assert camera.fps == 30.0  # the recording's videos: the server's frame rate, left alone
    r = plot_episode(ep)
    assert r.video is not None
    info = video_info(r.video)
    assert PLAYBACK_FPS == 10.0
    assert info.fps == PLAYBACK_FPS
    assert info.n_frames == camera.n_frames >= 45
    assert info.n_frames / info.fps >= 4.5  # seconds of playback


def test_an_explicit_rate_is_kept(tmp_path: Path) -> None:
    ep = _episode(tmp_path)
    n, _ = write_overlay_video(load_series(ep), tmp_path / "o.mp4", fps=5)
    info = video_info(tmp_path / "o.mp4")
    assert info.fps == 5.0 and info.n_frames == n
