"""genmanip_results.testing: the synthetic trees follow the documented layouts exactly."""

from __future__ import annotations

import math
from pathlib import Path

from genmanip_results.discovery import find_runs, load_run
from genmanip_results.series import load_series
from genmanip_results.testing import (
    MARKER_SIZE,
    frame_marker,
    make_client_run,
    make_server_run,
    marker_size,
    robot_cameras,
    synthetic_frame,
    write_client_episode,
    write_client_run,
    write_server_run,
)
from genmanip_results.video import probe_video


def test_frames_carry_their_index() -> None:
    f = synthetic_frame(3, 64, 48, seed=1)
    assert f.shape == (48, 64, 3) and f.dtype.name == "uint8"
    m = marker_size(64, 48)
    assert m == 12 and (f[:m, :m] == frame_marker(3)).all()
    assert frame_marker(3) != frame_marker(4)
    big = synthetic_frame(3, 320, 240)
    assert marker_size(320, 240) == MARKER_SIZE and (big[:MARKER_SIZE, :MARKER_SIZE] == frame_marker(3)).all()


def test_small_frames_show_their_yellow_square_in_every_frame() -> None:
    # Viewer tests find a decoded frame on screen by its yellow square: the index block must
    # never cover it.
    for i in range(60):
        f = synthetic_frame(i, 64, 48)
        yellow = (f[..., 0] > 200) & (f[..., 1] > 200) & (f[..., 2] < 120)
        assert yellow.sum() >= 32, i


def test_robot_cameras_are_even_and_scaled() -> None:
    cams = robot_cameras("manip/lift2/R5a")
    assert cams["left_camera"] == (320, 240) and cams["top_camera"] == (640, 360)
    assert all(w % 2 == 0 and h % 2 == 0 for w, h in robot_cameras("lift2", scale=0.33).values())


def test_client_run_is_discovered_and_loads_clean(tmp_path: Path) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0, 0.0, math.nan]}, steps=6)
    info = load_run(run)
    assert info.layout == "client" and info.total_episodes == 3
    assert sorted((e.seed, e.complete, e.score) for e in info.episodes) == [
        ("0", True, 1.0),
        ("1", True, 0.0),
        ("2", False, None),
    ]
    s = load_series(run / "t/a/0")
    assert s.issues == () and s.n_steps == 6 and list(s.videos) == ["left_camera", "top_camera"]
    assert probe_video(run / "t/a/0/left_camera.mp4") == (6, 64, 48)


def test_unknown_robot_and_overrides(tmp_path: Path) -> None:
    ep = write_client_episode(
        tmp_path / "b" / "r", "t/a", "0", steps=4, robot_id="acme/arm9",
        cameras={"cam": (32, 24)}, extra_frames=2, frames_override={"cam": 3},
    )  # fmt: skip
    s = load_series(ep)
    assert s.robot is None and sorted(s.state) == ["extra", "gripper", "joints"]
    assert s.action.shape == (4, 5) and s.issues == ()
    assert probe_video(ep / "cam.mp4")[0] == 3


def test_server_run_is_discovered_and_loads_clean(tmp_path: Path) -> None:
    run = write_server_run(tmp_path, "eb", "s", tasks={"eb/k/open": [1.0, math.nan]}, steps=4)
    (info,) = find_runs(tmp_path)
    assert info.path == run and info.layout == "server" and info.live
    assert [e.complete for e in sorted(info.episodes, key=lambda e: e.seed)] == [True, False]
    s = load_series(run / "eb/k/open/0")
    assert s.layout == "server" and s.issues == () and s.frame_timesteps == {j: j for j in range(5)}
    assert probe_video(run / "eb/k/open/0/left_camera.mp4")[0] == 5  # reset frame + 4 steps


def test_light_trees(tmp_path: Path) -> None:
    srv = make_server_run(tmp_path, done={"testbed/reach/red_easy": [0]})
    assert (srv / "progress.json").is_file()
    cli = make_client_run(tmp_path / "res", incomplete=[("testbed/reach/red_easy", 1)])
    info = load_run(cli)
    assert sorted(e.complete for e in info.episodes) == [False, True]
