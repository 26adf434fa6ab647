"""Names from the wire never become paths unchecked: hostile camera keys, planted symlinks and
foreign directories against the recorder (real files, real ffmpeg; no server needed).

Every case asserts the same three things: nothing is written outside the results root (a
sentinel directory next to it is scanned), no file gmp did not create is modified (hashed before
and after), and a refusal is a typed :class:`RecordingError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from genmanip_eval.errors import RecordingError
from genmanip_eval.recording import Recorder
from genmanip_protocol.codec import JpegFrame, Observation
from genmanip_protocol.errors import ExitCode
from genmanip_protocol.schema import EpisodeResult

EID = "testbed/run1/testbed/reach/red_easy/000"
ACTION = {"control_type": "joint_position", "action": [0.0] * 16, "is_rel": True,
          "base_motion": [0.0, 0.0, 0.0], "base_is_rel": True}
NOTHING_OUTSIDE = "nothing was written outside the results root"


def _obs(ts: int, cams: dict[str, JpegFrame], *, reset: bool = False, eid: str = EID) -> Observation:
    return Observation({
        "instruction": "reach", "state.joints": np.arange(12, dtype=np.float32) + ts,
        "timestep": ts, "reset": reset, "episode_id": eid, "robot_id": "manip/lift2/R5a", **cams,
    })


def _jpeg(v: int = 0) -> JpegFrame:
    return JpegFrame.encode(np.full((16, 16, 3), v, np.uint8))


def _result(eid: str = EID) -> EpisodeResult:
    parts = eid.split("/")
    return EpisodeResult(eid, "/".join(parts[2:-1]), parts[-1], 1.0, 1.0)


def _record(rec: Recorder, cams: dict[str, JpegFrame], *, eid: str = EID, steps: int = 3) -> None:
    rec.observation("0", _obs(0, cams, reset=True, eid=eid))
    for t in range(steps):
        rec.executed("0", [ACTION], obs_timesteps=[t], chunk=[None], latency=None)
        if t < steps - 1:
            rec.observation("0", _obs(t + 1, cams, eid=eid))
    rec.episode_end("0", _result(eid), lock_lost=False)


def _tree(box: Path) -> dict[str, str]:
    """Every path under ``box`` -> sha256 of its content (``link:<target>`` for a symlink)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(box):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(p.relative_to(box))] = f"link:{os.readlink(p)}"
            elif p.is_file():
                out[str(p.relative_to(box))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    """``results/`` (the root) next to ``sentinel/`` (user files that must never change) and a
    user file right next to the root."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "victim.mp4").write_bytes(b"user video")
    (sentinel / "victim.jpegs").write_bytes(b"user frames")
    (tmp_path / "x.mp4").write_bytes(b"user file next to the root")
    (tmp_path / "x.jpegs").write_bytes(b"user file next to the root")
    root = tmp_path / "results"
    root.mkdir()
    return {"tmp": tmp_path, "root": root, "sentinel": sentinel}


def _outside(box: dict[str, Path], before: dict[str, str]) -> dict[str, str]:
    """What changed outside the results root (added, removed or modified)."""
    after = {k: v for k, v in _tree(box["tmp"]).items() if not k.startswith("results")}
    return {k: v for k, v in (after.items() ^ before.items())}


#: hostile camera keys (label, key): each must refuse the episode's recording
HOSTILE_CAMERAS: list[tuple[str, str]] = [
    ("dotdot", "video.../../x_view"),
    ("deep dotdot", "video.../../../../../sentinel/victim_view"),
    ("absolute", "video./abs_view"),
    ("absolute into sentinel", "video./{sentinel}/victim_view"),
    ("slash", "video.a/b_view"),
    ("empty", "video._view"),
    ("dot", "video.._view"),
    ("hidden", "video..hidden_view"),
    ("dash", "video.-rf_view"),
    ("NUL", "video.a\x00b_view"),
    ("newline", "video.a\nb_view"),
    ("backslash", "video.a\\..\\..\\x_view"),
    ("300 bytes", "video." + "c" * 300 + "_view"),
    ("space", "video.left camera_view"),
    ("one-dot leader", "video.\u2024\u2024_view"),
    ("fullwidth", "video.\uff0e\uff0e\uff0fx_view"),
    ("fraction slash", "video..\u2215..\u2215x_view"),
    ("RTL override", "video.cam\u202egpj_view"),
]


@pytest.mark.parametrize(("label", "key"), HOSTILE_CAMERAS, ids=[h[0] for h in HOSTILE_CAMERAS])
def test_hostile_camera_key_refuses_the_recording(label: str, key: str, box: dict[str, Path]) -> None:
    key = key.replace("{sentinel}", str(box["sentinel"]).lstrip("/"))
    before = {k: v for k, v in _tree(box["tmp"]).items() if not k.startswith("results")}
    rec = Recorder(box["root"])
    with pytest.raises(RecordingError) as ei:
        try:
            _record(rec, {"video.left_camera_view": _jpeg(), key: _jpeg(1)})
        finally:
            rec.close(timeout=60)
    msg = str(ei.value)
    assert msg.startswith("camera:"), msg
    assert NOTHING_OUTSIDE in msg and "refusing to record episode" in msg
    assert ei.value.exit_code == ExitCode.FAILURE  # a named code, never 70
    assert _outside(box, before) == {}, f"{label}: written outside the root"
    ep = box["root"] / EID
    assert not (ep / "result.json").exists()
    marker = json.loads((ep / "INCOMPLETE").read_text())
    assert marker["reason"].startswith("recording refused: camera:")
    assert not (ep / ".frames").exists()
    # nothing of the hostile camera anywhere in the root, under any spelling
    assert {p.name for p in ep.iterdir()} <= {"INCOMPLETE", "steps.jsonl"}


def test_colliding_camera_keys_refuse_the_recording(box: dict[str, Path]) -> None:
    """``video.a_view`` and ``video.a`` both name ``a.mp4``: one camera would silently vanish."""
    rec = Recorder(box["root"])
    with pytest.raises(RecordingError, match=r"^camera: .*both name the camera 'a'"):
        try:
            _record(rec, {"video.a_view": _jpeg(), "video.a": _jpeg(2)})
        finally:
            rec.close(timeout=60)
    assert "recording refused" in (box["root"] / EID / "INCOMPLETE").read_text()


def test_plain_camera_names_still_record(box: dict[str, Path]) -> None:
    rec = Recorder(box["root"])
    cams = {f"video.{c}_view": _jpeg(i) for i, c in enumerate(["left_camera", "obs_camera_2", "cam.v2@x+y=z-w"])}
    _record(rec, cams)
    rec.close(timeout=120)
    ep = box["root"] / EID
    assert (ep / "result.json").is_file()
    assert sorted(p.name for p in ep.glob("*.jpegs")) == ["cam.v2@x+y=z-w.jpegs", "left_camera.jpegs", "obs_camera_2.jpegs"]
    from genmanip_results.frames import transcode_episode

    made = transcode_episode(ep, within=box["root"])  # the camera names become mp4 names too
    assert sorted(p.name for p in made) == ["cam.v2@x+y=z-w.mp4", "left_camera.mp4", "obs_camera_2.mp4"]


def test_existing_user_directory_is_never_taken_over(box: dict[str, Path]) -> None:
    """The server names an episode directory that exists and holds the user's files (a video
    named like a camera among them): refused, nothing deleted or overwritten."""
    ep = box["root"] / EID
    ep.mkdir(parents=True)
    (ep / "left_camera.mp4").write_bytes(b"the user's own video")
    (ep / "notes.txt").write_text("mine")
    before = _tree(box["tmp"])
    rec = Recorder(box["root"])
    with pytest.raises(RecordingError, match=r"^episode: .*holds files gmp did not write"):
        try:
            _record(rec, {"video.left_camera_view": _jpeg()})
        finally:
            rec.close(timeout=60)
    after = _tree(box["tmp"])
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    # only gmp's run manifest (and its lock) may appear, in the run directory
    assert {Path(k).name for k in changed} <= {"run.json", ".run.json.lock"}, changed


def test_planted_symlinks_in_the_episode_directory_are_not_followed(box: dict[str, Path]) -> None:
    """A previous attempt's directory where someone planted symlinks out of the root under the
    names the recorder writes (the spool directory, the steps file, a video and its part file)."""
    ep = box["root"] / EID
    ep.mkdir(parents=True)
    (ep / "INCOMPLETE").write_text("{}")  # a gmp episode directory
    s = box["sentinel"]
    (s / "frames").mkdir()
    (ep / ".frames").symlink_to(s / "frames", target_is_directory=True)
    (ep / "steps.jsonl").symlink_to(s / "victim.jpegs")
    (ep / "left_camera.mp4").symlink_to(s / "victim.mp4")
    (ep / "left_camera.mp4.part").symlink_to(s / "victim.mp4")
    before = {k: v for k, v in _tree(box["tmp"]).items() if not k.startswith("results")}
    rec = Recorder(box["root"])
    _record(rec, {"video.left_camera_view": _jpeg()})
    rec.close(timeout=120)
    assert _outside(box, before) == {}
    assert list((s / "frames").iterdir()) == []
    assert (ep / "result.json").is_file() and not (ep / "left_camera.mp4").is_symlink()
    assert not (ep / "steps.jsonl").is_symlink() and len((ep / "steps.jsonl").read_text().splitlines()) == 3


def test_symlinked_episode_directory_is_refused(box: dict[str, Path]) -> None:
    task = box["root"] / "testbed" / "run1" / "testbed" / "reach" / "red_easy"
    task.mkdir(parents=True)
    (task / "000").symlink_to(box["sentinel"], target_is_directory=True)
    before = {k: v for k, v in _tree(box["tmp"]).items() if not k.startswith("results")}
    rec = Recorder(box["root"])
    with pytest.raises(RecordingError):
        try:
            _record(rec, {"video.left_camera_view": _jpeg()})
        finally:
            rec.close(timeout=60)
    assert _outside(box, before) == {}


def test_recovery_note_with_a_hostile_camera_list_is_not_followed(box: dict[str, Path]) -> None:
    """A pending-result note (left by a dead recorder, or forged) whose camera list escapes: the
    resuming recorder keeps the episode INCOMPLETE and reads or writes nothing outside."""
    ep = box["root"] / EID
    (ep / ".frames").mkdir(parents=True)
    (ep / "steps.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    (ep / "INCOMPLETE").write_text("{}")
    note = {"episode": {"episode_id": EID, "task_name": "testbed/reach/red_easy", "seed": "000",
                        "worker_id": "0", "robot_id": None, "instruction": None, "started": "x", "steps": 1},
            "result": {"score": 1.0, "sr": 1.0}, "cameras": ["../../../../../../sentinel/victim"],
            "finished": "y", "host": "elsewhere-but-dead"}
    import socket

    note["host"] = socket.gethostname()
    (ep / ".pending_result.999999999.json").write_text(json.dumps(note))
    before = {k: v for k, v in _tree(box["tmp"]).items() if not k.startswith("results")}
    rec = Recorder(box["root"])
    assert rec.recover(box["root"] / "testbed" / "run1") == 0
    rec.close(timeout=60)
    assert _outside(box, before) == {}
    assert not (ep / "result.json").exists()
    assert json.loads((ep / "INCOMPLETE").read_text())["server_result"] == {"score": 1.0, "sr": 1.0}
