"""``gmp plot`` opens the camera videos it found within the results root: a video swapped for a
link to an outside file after discovery is refused, never decoded into the overlay video."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from genmanip_artifacts import EpisodeDataError, load_series, plot_episode
from genmanip_artifacts.overlay import write_overlay_video
from genmanip_results.testing import write_client_episode
from genmanip_results.video import video_info

SMALL = {"left_camera": (64, 48), "right_camera": (64, 48)}


def _episode(root: Path) -> Path:
    return write_client_episode(
        root / "bench" / "run1", "bench/suite/task_a", "000", steps=12, chunk=2, cameras=SMALL
    )


def _outside_video(tmp_path: Path) -> Path:
    """A user's private video outside the results root, of the same size and length as the
    episode's own (so that reading it would go unnoticed)."""
    other = write_client_episode(
        tmp_path / "private" / "b" / "r", "t", "000", steps=12, chunk=2, cameras=SMALL
    )
    return other / "left_camera.mp4"


@pytest.mark.parametrize("swap", ["file", "episode directory"])
def test_a_video_swapped_for_an_outside_link_after_discovery_is_refused(
    swap: str, tmp_path: Path
) -> None:
    ep = _episode(tmp_path / "results")
    secret = _outside_video(tmp_path)
    series = load_series(ep)  # discovery: the videos are regular files inside the root
    assert set(series.videos) == set(SMALL)
    out = tmp_path / "out" / "merged_with_plot.mp4"
    out.parent.mkdir()
    if swap == "file":
        cam = series.videos["left_camera"]
        cam.unlink()
        cam.symlink_to(secret)
    else:  # the whole episode directory becomes a link to the user's directory
        moved = ep.with_name("000.moved")
        ep.rename(moved)
        ep.symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(EpisodeDataError, match="resolves outside the results root"):
        write_overlay_video(series, out)
    assert not out.exists()
    assert sorted(os.listdir(out.parent)) == []  # no partial either


def test_plot_reads_videos_inside_the_root_and_links_within_it(tmp_path: Path) -> None:
    """The normal case still works, also through a link that stays inside the root."""
    ep = _episode(tmp_path / "results")
    keep = ep.parent / "shared_right.mp4"
    shutil.move(ep / "right_camera.mp4", keep)
    (ep / "right_camera.mp4").symlink_to(keep)
    r = plot_episode(ep)
    assert r.video is not None and video_info(r.video).n_frames == r.frames == 6
