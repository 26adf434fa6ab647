from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from genmanip_artifacts import (
    AlignmentError,
    EpisodeDataError,
    load_series,
    plot_episode,
)
from genmanip_artifacts.overlay import frame_timesteps, plan_layout, write_overlay_video
from genmanip_artifacts.panels import action_panels, state_panels
from genmanip_artifacts.plot import PLOT_LOG_SIGNATURE
from genmanip_artifacts.render import render_cursor_panel
from genmanip_results.testing import MARKER_SIZE, frame_marker, write_client_episode
from genmanip_results.video import read_video_frames, video_info
from PIL import Image

SMALL = {"left_camera": (64, 48), "right_camera": (64, 48)}


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith((".part", ".tmp")))


def _assert_png(path: Path) -> None:
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size[0] == 1320 and im.size[1] > 600
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 50  # really drawn, not a blank canvas


@pytest.mark.slow
def test_plot_episode_writes_all_outputs(lift2_episode: Path) -> None:
    r = plot_episode(lift2_episode)
    assert r.out_dir == lift2_episode
    _assert_png(r.state_plot)
    _assert_png(r.action_plot)
    assert r.video == lift2_episode / "merged_with_plot.mp4"
    info = video_info(r.video)
    assert info.codec == "h264" and info.pix_fmt == "yuv420p"
    assert info.n_frames == r.frames == 13  # 12 observations + 1 trailing (terminal) frame
    assert r.steps == 48
    assert "1 of 13 video frames have no recorded timestep (cursor held)" in r.warnings
    log = (lift2_episode / "plot.log").read_text().splitlines()
    assert log[0] == PLOT_LOG_SIGNATURE
    assert "output: merged_with_plot.mp4" in log
    assert _leftovers(lift2_episode) == []


def test_out_dir_and_no_video(lift2_episode: Path, tmp_path: Path) -> None:
    out = tmp_path / "plots" / "x"
    r = plot_episode(lift2_episode, out=out, video=False)
    assert r.video is None and r.frames == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".gmp-generated.jsonl",  # the provenance manifest every output is registered in
        "action_plot.png",
        "plot.log",
        "state_plot.png",
    ]
    assert not (lift2_episode / "state_plot.png").exists()


@pytest.mark.slow
def test_overlay_frames_are_synchronized(lift2_episode: Path) -> None:
    """Output frame j shows source frame j of every camera and a cursor at its observation's timestep."""
    r = plot_episode(lift2_episode)
    s = load_series(lift2_episode)
    sizes = [(320, 240), (640, 360), (640, 360), (320, 240)]
    layout = plan_layout(sizes)
    panel = render_cursor_panel(
        s, state_panels(s), action_panels(s), layout.width, layout.panel_height
    )
    ts, _ = frame_timesteps(s, 13)
    assert ts.tolist() == [4.0 * j for j in range(12)] + [44.0]
    frames = list(read_video_frames(r.video))
    assert len(frames) == 13
    for j, f in enumerate(frames):
        assert f.shape == (layout.height, layout.width, 3)
        for (x, _w), (_src_w, src_h) in zip(layout.cams, sizes, strict=True):
            m = int(MARKER_SIZE * layout.cam_height / src_h)
            block = f[2 : m - 2, x + 2 : x + m - 2].astype(int)
            assert abs(int(np.median(block)) - frame_marker(j)) <= 8, (j, x)
        diff = np.abs(f[layout.cam_height :].astype(int) - panel.image.astype(int)).sum(axis=2)
        expected = panel.columns(ts[j])
        for k, (r0, r1) in enumerate(panel.rows):
            c0, c1 = int(panel.cols0[k]) - 3, int(panel.cols1[k]) + 4
            found = c0 + int(np.argmax(diff[r0 + 2 : r1 - 2, c0:c1].sum(axis=0)))
            assert abs(found - int(expected[k])) <= 2, (j, k, found, expected[k])
    # The cursor moves: first and last frames put it at opposite ends of the axes.
    assert panel.columns(ts[0])[0] < panel.columns(ts[-1])[0] - 100


def test_overlay_draws_one_figure_not_one_per_frame(
    lift2_episode: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.figure

    created = []
    original = matplotlib.figure.Figure.__init__

    def counting(self, *a, **kw):  # type: ignore[no-untyped-def]
        created.append(1)
        original(self, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "__init__", counting)
    n, _ = write_overlay_video(load_series(lift2_episode), tmp_path / "o.mp4")
    assert n == 13
    assert len(created) == 1


def _small_episode(root: Path, **kw: object) -> Path:
    return write_client_episode(  # type: ignore[arg-type]
        root / "bench" / "run1", "bench/suite/task_a", "000", steps=12, chunk=2, cameras=SMALL, **kw
    )


def test_camera_frame_count_mismatch_is_reported(tmp_path: Path) -> None:
    ep = _small_episode(tmp_path, frames_override={"left_camera": 4})
    with pytest.raises(
        AlignmentError, match=r"different frame counts \(left_camera 4, right_camera 6\)"
    ):
        plot_episode(ep)
    assert not (ep / "merged_with_plot.mp4").exists()
    assert _leftovers(ep) == []


def test_fewer_frames_than_referenced_is_reported(tmp_path: Path) -> None:
    ep = _small_episode(tmp_path, frames_override={"left_camera": 5, "right_camera": 5})
    with pytest.raises(
        AlignmentError, match=r"steps refer to frame 5 but the camera videos have only 5 frames"
    ):
        plot_episode(ep)
    assert not (ep / "merged_with_plot.mp4").exists()


def test_unreadable_video_is_reported(tmp_path: Path) -> None:
    ep = _small_episode(tmp_path)
    (ep / "right_camera.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video")
    with pytest.raises(EpisodeDataError, match=r"right_camera\.mp4: unreadable video") as exc:
        plot_episode(ep)
    assert "\n" not in str(exc.value)
    assert not (ep / "merged_with_plot.mp4").exists()
    assert _leftovers(ep) == []


def test_episode_without_videos_gets_plots_and_a_warning(tmp_path: Path) -> None:
    ep = _small_episode(tmp_path)
    for cam in SMALL:
        (ep / f"{cam}.mp4").unlink()
    r = plot_episode(ep)
    assert r.video is None
    assert any("no camera videos" in w for w in r.warnings)
    assert r.state_plot.exists()


def test_server_layout_overlay(franka_server_episode: Path) -> None:
    r = plot_episode(franka_server_episode)
    assert r.frames == 21  # the reset observation + one per step
    assert video_info(r.video).n_frames == 21  # type: ignore[arg-type]
    assert r.warnings == []


def test_replot_overwrites_in_place(lift2_episode: Path) -> None:
    plot_episode(lift2_episode, video=False)
    before = (lift2_episode / "state_plot.png").stat().st_ino
    plot_episode(lift2_episode, video=False)
    assert (lift2_episode / "state_plot.png").stat().st_ino != before  # replaced atomically
    assert _leftovers(lift2_episode) == []


def test_plot_layout_even_and_bounded() -> None:
    lay = plan_layout([(640, 480), (1280, 720), (1280, 720), (640, 480)])
    assert lay.width <= 1920 and lay.width % 2 == 0 and lay.height % 2 == 0
    assert len({w for _, w in lay.cams}) == 2
    lay1 = plan_layout([(641, 481)])
    assert lay1.width == 1280 and lay1.cam_height % 2 == 0


def test_reader_scales_while_decoding(tmp_path: Path) -> None:
    """The overlay asks ffmpeg for frames at their final size (genmanip_results.video)."""
    ep = _small_episode(tmp_path)
    frames = list(read_video_frames(ep / "left_camera.mp4", size=(32, 24)))
    assert len(frames) == 6
    assert {f.shape for f in frames} == {(24, 32, 3)}
    # The frame-index block (12 px at 64x48, so 6 px here) survives the scaling.
    assert abs(int(np.median(frames[3][1:5, 1:5])) - frame_marker(3)) <= 8
