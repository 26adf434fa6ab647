from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from genmanip_protocol.codec import encode_jpeg
from genmanip_protocol.errors import UnsafePayloadError
from genmanip_results.discovery import load_episode
from genmanip_results.series import SeriesError
from genmanip_results.testing import write_client_episode, write_client_run, write_server_run
from genmanip_viz.errors import RecordingBuildError
from genmanip_viz.recording import (
    RRD_NAME,
    SIDECAR_NAME,
    build_recording,
    load_episode_data,
    recording_is_fresh,
)
from rerun.chunk import RrdReader


def _entities(rrd: Path) -> dict[str, int]:
    """Entity path -> rows of temporal (non-static) data in the recording."""
    out: dict[str, int] = {}
    for chunk in RrdReader(str(rrd)).store().stream():
        if not chunk.is_static:
            out[str(chunk.entity_path)] = out.get(str(chunk.entity_path), 0) + chunk.num_rows
        else:
            out.setdefault(str(chunk.entity_path), 0)
    return out


def test_client_episode_recording(tmp_path: Path) -> None:
    run = write_client_run(
        tmp_path, "b", "r", tasks={"t/lift": [1.0]}, steps=24, cameras=("left_camera", "top_camera")
    )
    ep = load_episode(run / "t/lift/0")
    out = build_recording(ep)
    assert out == run / "t/lift/0" / RRD_NAME and out.read_bytes()[:4] == b"RRF2"
    ents = _entities(out)
    assert ents["/cameras/left_camera"] == 24 and ents["/cameras/top_camera"] == 24
    assert (
        ents["/state/joints"] == 24 and ents["/state/gripper"] == 24 and ents["/action/arm"] == 24
    )
    assert "/instruction" in ents and "/result" in ents
    assert "/action/base_motion" in ents  # lift2 is dual-arm with a mobile base
    # the recording holds each mp4 once plus small series, not decoded frames
    src = sum(p.stat().st_size for p in (run / "t/lift/0").glob("*.mp4"))
    assert out.stat().st_size < src + 200_000
    assert not list((run / "t/lift/0").glob("*.part"))
    side = json.loads((run / "t/lift/0" / SIDECAR_NAME).read_text())
    assert set(side["files"]) == {"left_camera.mp4", "top_camera.mp4", "steps.jsonl", "result.json"}
    assert recording_is_fresh(ep)


def test_chunked_steps_align_frames_by_obs_timestep(tmp_path: Path) -> None:
    run = tmp_path / "b" / "r"
    write_client_episode(run, "t/push", "3", score=0.0, steps=12, chunk=4)
    ep = load_episode(run / "t/push/3")
    data = load_episode_data(ep)
    steps, frames = data.frames["left_camera"]
    assert steps.tolist() == [0, 4, 8] and frames.tolist() == [0, 1, 2]
    assert data.state["joints"][0].tolist() == [0, 4, 8]
    assert data.action["arm"][0].tolist() == list(range(12))
    assert data.instruction == "pick up the cube" and data.n_steps == 12
    ents = _entities(build_recording(ep))
    assert ents["/cameras/left_camera"] == 3 and ents["/action/arm"] == 12


def test_rebuilt_when_inputs_change(tmp_path: Path) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0]}, steps=8)
    ep_dir = run / "t/a/0"
    out = build_recording(load_episode(ep_dir))
    first = out.stat().st_mtime_ns
    assert build_recording(load_episode(ep_dir)).stat().st_mtime_ns == first  # reused
    time.sleep(0.01)
    with open(ep_dir / "steps.jsonl", "a", encoding="utf-8") as fh:
        row = json.loads((ep_dir / "steps.jsonl").read_text().splitlines()[-1])
        row["step"] = 8
        fh.write(json.dumps(row) + "\n")
    ep = load_episode(ep_dir)
    assert not recording_is_fresh(ep)
    out2 = build_recording(ep)
    assert out2.stat().st_mtime_ns != first and _entities(out2)["/action/arm"] == 9


def test_server_episode_uses_meta_record(tmp_path: Path) -> None:
    run = write_server_run(tmp_path, "ebench", "s1", tasks={"ebench/k/open": [1.0]}, steps=15)
    ep = load_episode(run / "ebench/k/open/0")
    data = load_episode_data(ep)
    assert data.instruction == "open the drawer" and data.robot_id == "manip/lift2/R5a"
    assert data.state["joints"][1].shape == (15, 12)
    assert data.state["joints"][0].tolist() == list(range(1, 16))  # record i: state after step i
    assert data.action["arm"][1].shape == (15, 16)
    assert data.result["score"] == 1.0 and data.problems == []
    ents = _entities(build_recording(ep))
    # frame j is timestep j: the reset observation's frame, then one per step
    assert ents["/cameras/left_camera"] == 16 and ents["/state/base"] == 15


def test_server_own_rrd_is_used_as_is(tmp_path: Path) -> None:
    run = write_server_run(tmp_path, "ebench", "s1", tasks={"ebench/k/open": [1.0]}, steps=5)
    ep_dir = run / "ebench/k/open/0"
    (ep_dir / "episode.rrd").write_bytes(b"RRF2-server-recording")
    assert build_recording(load_episode(ep_dir)) == ep_dir / "episode.rrd"
    assert not (ep_dir / RRD_NAME).exists()


def test_meta_record_goes_through_the_allow_list(tmp_path: Path) -> None:
    run = write_server_run(tmp_path, "ebench", "s1", tasks={"ebench/k/open": [1.0]}, steps=3)
    ep_dir = run / "ebench/k/open/0"
    sentinel = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {sentinel}",))

    (ep_dir / "meta_record.pkl").write_bytes(pickle.dumps({"instruction": Evil()}))
    with pytest.raises(RecordingBuildError) as ei:
        build_recording(load_episode(ep_dir))
    assert "meta_record.pkl" in str(ei.value)
    assert isinstance(ei.value.__cause__, SeriesError)  # the one loader, genmanip_results.series
    assert isinstance(ei.value.__cause__.__cause__, UnsafePayloadError)
    assert not sentinel.exists()


def test_unreadable_video_is_a_typed_error(tmp_path: Path) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0]}, steps=4)
    ep_dir = run / "t/a/0"
    (ep_dir / "left_camera.mp4").write_bytes(b"not an mp4")
    with pytest.raises(RecordingBuildError):
        build_recording(load_episode(ep_dir))
    assert not list(ep_dir.glob("*.part")) and not (ep_dir / RRD_NAME).exists()


def test_ragged_and_cut_rows_are_gaps_and_reported(tmp_path: Path) -> None:
    """The one bad-row policy (genmanip_results.series): the recording is built, a ragged row is
    a gap at its step (not dropped), a cut line is skipped, and the result panel says so."""
    run = tmp_path / "b" / "r"
    ep_dir = write_client_episode(run, "t/a", "0", score=1.0, steps=6)
    lines = (ep_dir / "steps.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["action"]["action"] = [1.0, 2.0]  # wrong length: a gap in the plot, not fatal
    lines[2] = json.dumps(bad)
    (ep_dir / "steps.jsonl").write_text("\n".join(lines) + '\n{"step": 6, "trunc')
    data = load_episode_data(load_episode(ep_dir))
    steps, values = data.action["arm"]
    assert steps.tolist() == [0, 1, 2, 3, 4, 5] and values.shape == (6, 16)
    assert np.isnan(values[2]).all() and np.isfinite(np.delete(values, 2, axis=0)).all()
    assert data.problem_summary == (
        "steps.jsonl: 2 of 7 rows with problems (1 unreadable, 1 ragged): 1 skipped, "
        "1 kept with gaps"
    )
    assert data.problems[0].startswith("steps.jsonl:3: action.action: 2 values where")
    assert data.problems[1].startswith("steps.jsonl:7: not JSON")
    out = build_recording(load_episode(ep_dir))
    assert _entities(out)["/action/arm"] == 6
    assert b"recording problems" in out.read_bytes()


def test_mp4v_server_video_is_transcoded_for_the_browser(tmp_path: Path) -> None:
    import subprocess

    from genmanip_results.video import ffmpeg_executable, video_info

    run = write_server_run(
        tmp_path, "ebench", "s1", tasks={"ebench/k/open": [1.0]}, steps=10, cameras=("left_camera",)
    )
    ep_dir = run / "ebench/k/open/0"
    src = ep_dir / "left_camera.mp4"
    tmp = ep_dir / "tmp.mp4"
    subprocess.run(
        [
            ffmpeg_executable(),
            "-nostdin",
            "-loglevel",
            "error",
            "-y",
            "-i",
            str(src),
            "-c:v",
            "mpeg4",
            str(tmp),
        ],
        check=True,
    )
    tmp.replace(src)
    assert video_info(src).codec == "mpeg4"
    out = build_recording(load_episode(ep_dir))
    assert _entities(out)["/cameras/left_camera"] == 11  # the reset frame + one per step
    blob = out.read_bytes()
    assert b"avc1" in blob  # the embedded video is H.264 now


def test_read_only_episode_dir_is_a_typed_error(tmp_path: Path) -> None:
    import os as _os

    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0]}, steps=4)
    ep_dir = run / "t/a/0"
    ep_dir.chmod(0o555)
    try:
        if _os.access(ep_dir, _os.W_OK):  # root ignores permissions: make the target a directory
            ep_dir.chmod(0o755)
            (ep_dir / RRD_NAME).mkdir()
        with pytest.raises(RecordingBuildError) as ei:
            build_recording(load_episode(ep_dir))
        assert "cannot write the recording" in str(ei.value)
        assert not list(ep_dir.glob("*.part"))
    finally:
        ep_dir.chmod(0o755)


def test_deferred_episode_replays_its_jpeg_frames(tmp_path: Path) -> None:
    """``gmp eval --transcode deferred``: the camera's JPEG frame store goes into the replay as one
    EncodedImage per frame, byte for byte (no mp4 is made for it)."""
    import struct

    from genmanip_results.frames import FrameStore
    from genmanip_results.video import read_video_frames

    run = write_client_run(tmp_path, "b", "r", tasks={"t/lift": [1.0]}, steps=12, cameras=("left_camera",))
    d = run / "t/lift/0"
    mp4 = d / "left_camera.mp4"
    jpegs = [bytes(encode_jpeg(f)) for f in read_video_frames(mp4)]
    with open(d / "left_camera.jpegs", "wb") as fh:
        for j in jpegs:
            fh.write(struct.pack(">I", len(j)) + j)
    mp4.unlink()
    ep = load_episode(d)
    assert ep.videos == {"left_camera": d / "left_camera.jpegs"}
    out = build_recording(ep)
    ents = _entities(out)
    assert ents["/cameras/left_camera"] == 12 and ents["/state/joints"] == 12
    assert out.stat().st_size >= sum(len(j) for j in jpegs[:12]) * 0.5  # the frames are in it
    assert not mp4.exists()
    with FrameStore(d / "left_camera.jpegs") as st:
        assert len(st) == len(jpegs)
