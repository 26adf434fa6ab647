"""genmanip_results.live: the live-view contract eval writes and viz reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from genmanip_results.layout import LIVE_DIR, LIVE_STATE
from genmanip_results.live import (
    LIVE_FRESH_S,
    live_dir,
    live_frame_path,
    live_state_path,
    live_workers,
    read_live_state,
    write_live_view,
)
from genmanip_results.paths import UnsafePathError
from genmanip_results.testing import write_live_worker

JPEG = b"\xff\xd8\xff\xe0fake-jpeg"


def test_write_then_read_roundtrip(tmp_path: Path) -> None:
    run = tmp_path / "b" / "r"
    d = write_live_view(
        run, "0", {"left_camera": JPEG, "top_camera": bytearray(JPEG)}, {"step": 3, "sr": None}
    )
    assert d == run / LIVE_DIR / "0" == live_dir(run, "0")
    assert sorted(p.name for p in d.iterdir()) == ["left_camera.jpg", "live.json", "top_camera.jpg"]
    state = json.loads((d / LIVE_STATE).read_text())
    assert state == {"step": 3, "sr": None, "cameras": ["left_camera", "top_camera"]}
    (w,) = live_workers(run)
    assert w.worker_id == "0" and w.cameras == ("left_camera", "top_camera") and w.fresh
    assert w.state["step"] == 3
    assert live_workers(run, now=w.updated + LIVE_FRESH_S + 1)[0].fresh is False
    assert live_frame_path(run, "0", "top_camera") == d / "top_camera.jpg"
    path = live_state_path(run, "0")
    assert path is not None and read_live_state(path) == state


@pytest.mark.parametrize("worker", ["../../evil", "a/b", ".hidden", "-x", "a b", "", "x\n", "é"])
def test_unsafe_worker_ids_are_refused_on_both_sides(tmp_path: Path, worker: str) -> None:
    run = tmp_path / "run"
    with pytest.raises(UnsafePathError, match="worker_id"):
        write_live_view(run, worker, {"left_camera": JPEG}, {})
    assert not list(tmp_path.rglob(LIVE_STATE))
    assert live_state_path(run, worker) is None
    assert live_frame_path(run, worker, "left_camera") is None


def test_unsafe_camera_names_are_not_published(tmp_path: Path) -> None:
    run = tmp_path / "run"
    d = write_live_view(run, "1", {"../x": JPEG, "ok_cam": JPEG, ".h": JPEG}, {"step": 0})
    assert sorted(p.name for p in d.iterdir()) == ["live.json", "ok_cam.jpg"]
    assert json.loads((d / LIVE_STATE).read_text())["cameras"] == ["ok_cam"]
    assert live_frame_path(run, "1", "../x") is None


def test_symlinks_out_of_the_run_are_neither_written_nor_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(b"secret")
    (outside / LIVE_STATE).write_text('{"secret": true}')
    (run / LIVE_DIR).mkdir(parents=True)
    os.symlink(outside, run / LIVE_DIR / "evil")
    with pytest.raises(UnsafePathError):
        write_live_view(run, "evil", {"cam": JPEG}, {})
    assert not (outside / "cam.jpg").exists()
    assert live_state_path(run, "evil") is None and live_frame_path(run, "evil", "secret") is None
    d = write_live_view(run, "1", {"cam": JPEG}, {"step": 1})
    os.symlink(outside / "secret.jpg", d / "stolen.jpg")
    (d / LIVE_STATE).unlink()
    os.symlink(outside / LIVE_STATE, d / LIVE_STATE)
    assert live_frame_path(run, "1", "stolen") is None and live_state_path(run, "1") is None
    # the workers list: the symlinked worker is no worker, the linked state is not read
    assert [(w.worker_id, w.state) for w in live_workers(run)] == [("1", {})]
    # the served root (viz): nothing outside it either
    assert live_frame_path(run, "1", "cam", within=tmp_path / "elsewhere") is None
    assert live_frame_path(run, "1", "cam", within=tmp_path) == d / "cam.jpg"


def test_write_within_a_results_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "b").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere", root / "b" / "r")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(UnsafePathError, match="outside"):
        write_live_view(root / "b" / "r", "0", {"cam": JPEG}, {}, within=root)


def test_hostile_entries_are_not_workers_or_cameras(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_live_view(run, "ok", {"left_camera": JPEG}, {})
    (run / LIVE_DIR / ".hidden").mkdir()
    (run / LIVE_DIR / "file_not_dir").write_text("x")
    (run / LIVE_DIR / "ok" / "bad name.jpg").write_bytes(JPEG)
    assert [(w.worker_id, w.cameras) for w in live_workers(run)] == [("ok", ("left_camera",))]
    assert live_workers(tmp_path / "no_such_run") == []


def test_unreadable_state_is_none(tmp_path: Path) -> None:
    p = tmp_path / LIVE_STATE
    p.write_text("{not json")
    assert read_live_state(p) is None
    p.write_text("[1]")
    assert read_live_state(p) is None
    assert read_live_state(tmp_path / "missing.json") is None


def test_synthetic_live_worker_follows_the_contract(tmp_path: Path) -> None:
    d = write_live_worker(tmp_path / "run", "1", episode_id="b/r/t/x/0", step=5)
    (w,) = live_workers(tmp_path / "run")
    assert w.cameras == ("left_camera", "top_camera") and w.state["step"] == 5
    assert w.state["task_name"] == "t/x" and w.state["cameras"] == ["left_camera", "top_camera"]
    assert (d / "left_camera.jpg").read_bytes()[:2] == b"\xff\xd8"
