"""``Recorder(transcode=...)``: the deferred mode's frame stores, the inline mode's videos, raw
frames encoded once, and a completion cut short between the cameras (real files, real ffmpeg)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import numpy as np
import pytest
from genmanip_eval.recording import RAW_JPEG_QUALITY, Recorder
from genmanip_protocol import Observation
from genmanip_protocol.codec import decode_jpeg
from genmanip_results.frames import FrameStore, episode_streams, finish_spool
from genmanip_results.video import ffmpeg_executable, read_video_frames, video_info
from test_recording import (
    ACTION,
    EID,
    _dead_pid,
    make_obs,
    record_episode,
    result,
    write_dead_pending,
)


def test_deferred_keeps_the_jpegs_as_received(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)  # the default
    sent: list[bytes] = []
    obs = make_obs(0, reset=True)
    rec.observation("0", obs)
    sent.append(bytes(obs.frame_bytes("video.left_camera_view")))
    for t in range(5):
        rec.executed("0", [ACTION], obs_timesteps=[t], chunk=[None], latency=None)
        o = make_obs(t + 1, value=t + 3)
        sent.append(bytes(o.frame_bytes("video.left_camera_view")))
        rec.observation("0", o)
    rec.episode_end("0", result(), lock_lost=False)
    rec.close()
    ep = tmp_path / EID
    assert (ep / "result.json").is_file() and not (ep / "INCOMPLETE").exists()
    assert not (ep / ".frames").exists() and not list(ep.glob("*.mp4"))
    streams = episode_streams(ep)
    assert {c: s.state for c, s in streams.items()} == {"left_camera": "frames", "top_camera": "frames"}
    with FrameStore(ep / "left_camera.jpegs") as st:
        assert list(st) == sent  # byte for byte what the server sent
    assert video_info(ep / "top_camera.jpegs").n_frames == 6


def test_inline_makes_h264_and_keeps_no_store(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, transcode="inline")
    record_episode(rec, "0", EID, 4)
    rec.close()
    ep = tmp_path / EID
    assert sorted(p.name for p in ep.glob("*.mp4")) == ["left_camera.mp4", "top_camera.mp4"]
    assert not list(ep.glob("*.jpegs"))
    assert video_info(ep / "left_camera.mp4").codec == "h264"


def test_unknown_mode_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="transcode"):
        Recorder(tmp_path, transcode="sometimes")


def test_raw_frames_encoded_once_faithfully(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    # a rendered scene: smooth shading plus a little sensor-like noise
    yy, xx = np.mgrid[0:48, 0:64]
    base = np.stack([xx * 3, yy * 4, (xx + yy) * 2], axis=-1).astype(np.float64)
    img = np.clip(base + rng.normal(0, 2, base.shape), 0, 255).astype(np.uint8)
    obs = Observation({"timestep": 0, "reset": True, "episode_id": EID, "video.left_camera_view": img})
    rec = Recorder(tmp_path)
    rec.observation("0", obs)
    rec.executed("0", [ACTION], obs_timesteps=[0], chunk=[None], latency=None)
    rec.episode_end("0", result(), lock_lost=False)
    rec.close()
    with FrameStore(tmp_path / EID / "left_camera.jpegs") as st:
        back = decode_jpeg(st[0])
    err = np.abs(back.astype(np.int16) - img.astype(np.int16))
    assert RAW_JPEG_QUALITY == 95 and float(err.mean()) < 3.0


def test_completion_cut_between_cameras_is_finished_on_resume(tmp_path: Path) -> None:
    """A kill after one camera's spool became its store and before the other's: the next recorder
    finishes the episode from the store and the spool (every state is finishable)."""
    rec = Recorder(tmp_path)
    rec.observation("0", make_obs(0, reset=True))
    for t in range(3):
        rec.executed("0", [ACTION], obs_timesteps=[t], chunk=[None], latency=None)
        rec.observation("0", make_obs(t + 1, value=t))
    rec.episode_ended("0")
    rec._episodes.pop("0")  # the process "dies" here
    rec.close()
    d = tmp_path / EID
    finish_spool(d / ".frames" / "left_camera.jpegs", d / "left_camera.jpegs")  # the cut
    dead = _dead_pid()
    for marker in d.glob(".awaiting_result.*.json"):
        marker.unlink()
    write_dead_pending(d, dead, steps=3)
    states = {c: s.state for c, s in episode_streams(d).items()}
    assert states == {"left_camera": "frames", "top_camera": "spooled"}
    rec2 = Recorder(tmp_path)
    assert rec2.recover(tmp_path / "testbed" / "run1") == 1
    rec2.close()
    assert (d / "result.json").is_file()
    assert {c: s.state for c, s in episode_streams(d).items()} == {"left_camera": "frames", "top_camera": "frames"}
    for cam in ("left_camera", "top_camera"):
        assert len(list(read_video_frames(d / f"{cam}.jpegs"))) == 4


def test_rerun_of_an_episode_replaces_its_store_and_video(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    record_episode(rec, "0", EID, 5)
    rec.close()
    d = tmp_path / EID
    from genmanip_results.frames import ensure_video

    ensure_video(d, "left_camera")
    rec = Recorder(tmp_path)
    record_episode(rec, "0", EID, 2)  # the server ran the seed again
    rec.close()
    assert not (d / "left_camera.mp4").exists()  # the old attempt's video went with it
    assert video_info(d / "left_camera.jpegs").n_frames == 2  # (the last action has no next frame)


def test_a_result_arriving_after_a_stop_ended_ffmpeg_is_saved_for_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop signal that ended episode 000's ffmpeg stops the run, but the result of the episode
    that ended meanwhile (001) is on its way and the server hands it out once: it is saved, and
    both episodes' videos are left to the resume (the stop used to drop it: 001 kept INCOMPLETE)."""
    real = ffmpeg_executable()
    fake = tmp_path / "ffmpeg"
    # A real process ended by a real stop signal (SIGTERM: a CI job may start us with SIGINT ignored).
    fake.write_text(f'#!/bin/sh\ncase "$*" in *"/000/"*) kill -TERM $$ ;; esac\nexec "{real}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("GMP_FFMPEG", str(fake))
    root = tmp_path / "results"
    eid2 = EID[:-1] + "1"
    rec = Recorder(root, transcode="inline")
    record_episode(rec, "0", EID, 3)
    deadline = time.monotonic() + 60
    while True:  # the transcoder meets the stop
        try:
            rec.check()
        except KeyboardInterrupt as exc:
            assert "stop signal" in str(exc)
            break
        assert time.monotonic() < deadline, "ffmpeg's stop was not seen"
        time.sleep(0.01)
    try:  # (a KeyboardInterrupt escaping would stop pytest itself)
        rec.observation("0", make_obs(0, reset=True, eid=eid2))
        rec.executed("0", [ACTION], obs_timesteps=[0], chunk=[None], latency=None)
        rec.episode_ended("0")
        rec.episode_end("0", result(eid2), lock_lost=False)
    except KeyboardInterrupt as exc:
        pytest.fail(f"the stop cut short the recording of the episode on its way: {exc}")
    with pytest.raises(KeyboardInterrupt):
        rec.close()
    dirs = [root / EID, root / eid2]
    assert sorted(rec.left_for_resume()) == dirs
    for d in dirs:
        assert list(d.glob(".pending_result.*.json")) and not (d / "result.json").exists()
    dead = _dead_pid()  # the stopped process has exited when the run is resumed
    for d in dirs:
        for note in d.glob(".pending_result.*.json"):
            note.rename(d / f".pending_result.{dead}.json")
    monkeypatch.delenv("GMP_FFMPEG")
    again = Recorder(root, transcode="inline")
    assert again.recover(root / "testbed" / "run1") == 2
    again.close()
    for d in dirs:
        assert json.loads((d / "result.json").read_text())["seed"] == d.name
        assert sorted(p.name for p in d.glob("*.mp4")) == ["left_camera.mp4", "top_camera.mp4"]
        assert not (d / "INCOMPLETE").exists() and not (d / ".frames").exists()
