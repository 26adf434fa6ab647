"""The recorder on its own: real files, real ffmpeg, real processes (no server needed)."""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
from pathlib import Path

import numpy as np
import pytest
from genmanip_eval.errors import EpisodeIdError, RecordingError
from genmanip_eval.recording import Recorder, camera_name, iter_frame_file, resolve_results_root
from genmanip_protocol.codec import JpegFrame, Observation
from genmanip_protocol.schema import EpisodeResult
from genmanip_results.video import probe_video
from genmanip_runtime.atomic import merge_json

EID = "testbed/run1/testbed/reach/red_easy/000"


def _cam(ep: Path, cam: str) -> Path:
    """The camera's recording: its mp4 (inline mode) or its JPEG frame store (deferred, default)."""
    mp4 = ep / f"{cam}.mp4"
    return mp4 if mp4.exists() else ep / f"{cam}.jpegs"


def make_obs(ts: int, *, reset: bool = False, eid: str = EID, value: int = 0) -> Observation:
    img = np.full((48, 64, 3), (value * 20) % 255, np.uint8)
    return Observation(
        {
            "instruction": "reach the red block",
            "state.joints": np.arange(12, dtype=np.float32) + ts,
            "state.gripper": np.zeros(4, np.float32),
            "state.base": np.zeros(3, np.float32),
            "timestep": ts,
            "reset": reset,
            "episode_id": eid,
            "robot_id": "manip/lift2/R5a",
            "video.left_camera_view": JpegFrame.encode(img),
            "video.top_camera_view": JpegFrame.encode(img[:, ::-1].copy()),
        }
    )


ACTION = {"control_type": "joint_position", "action": [0.0] * 16, "is_rel": True,
          "base_motion": [0.0, 0.0, 0.0], "base_is_rel": True}


def result(eid: str = EID, score: float = 1.0) -> EpisodeResult:
    parts = eid.split("/")
    return EpisodeResult(eid, "/".join(parts[2:-1]), parts[-1], score, 1.0 if score == 1.0 else 0.0)


def record_episode(rec: Recorder, wid: str, eid: str, n_steps: int, *, score: float = 1.0) -> None:
    rec.observation(wid, make_obs(0, reset=True, eid=eid))
    for t in range(n_steps):
        rec.executed(wid, [ACTION], obs_timesteps=[t], chunk=[None],
                     latency={"network": 1.0, "server": 2.0, "policy": 0.5})
        if t < n_steps - 1:
            rec.observation(wid, make_obs(t + 1, eid=eid, value=t))
    rec.episode_end(wid, result(eid, score), lock_lost=False)


def test_camera_name() -> None:
    assert camera_name("video.left_camera_view") == "left_camera"
    assert camera_name("video.realsense_view") == "realsense"
    assert camera_name("obs_camera") == "obs_camera"


def test_resolve_results_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GENMANIP_RESULT_DIR", str(tmp_path / "env"))
    assert resolve_results_root(None) == tmp_path / "env"
    assert resolve_results_root(tmp_path / "flag") == tmp_path / "flag"
    monkeypatch.delenv("GENMANIP_RESULT_DIR")
    assert resolve_results_root(None).name == "client_results"


def test_full_episode_layout(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, manifest={"server_url": "http://127.0.0.1:1", "workers": ["0"]})
    record_episode(rec, "0", EID, 5)
    rec.update_manifest(finished="now")
    rec.close()
    ep = tmp_path / EID
    assert (ep / "result.json").is_file()
    assert not (ep / "INCOMPLETE").exists()
    assert not (ep / ".frames").exists()
    res = json.loads((ep / "result.json").read_text())
    assert res["score"] == 1.0 and res["steps"] == 5 and res["seed"] == "000"
    assert res["task_name"] == "testbed/reach/red_easy" and res["worker_id"] == "0"
    rows = [json.loads(line) for line in (ep / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["frame"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["state"]["joints"][0] == 0.0 and rows[3]["state"]["joints"][0] == 3.0
    assert rows[0]["latency_ms"] == {"network": 1.0, "server": 2.0, "policy": 0.5}
    for cam in ("left_camera", "top_camera"):
        n, w, h = probe_video(_cam(ep, f"{cam}"))
        assert (n, w, h) == (5, 64, 48)  # frames = observations received in the episode
    er = json.loads((ep.parent / "episode_result.json").read_text())
    assert er == {"000": {"score": 1.0, "sr": 1.0}}
    run = json.loads((tmp_path / "testbed" / "run1" / "run.json").read_text())
    assert run["server_url"] == "http://127.0.0.1:1" and run["workers"] == ["0"]
    assert run["finished"] == "now"


def test_chunk_rows_state_only_first(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    rec.observation("0", make_obs(0, reset=True))
    rec.executed("0", [ACTION] * 3, obs_timesteps=[0, 0, 0],
                 chunk=[{"index": i, "size": 3} for i in range(3)], latency=None)
    rec.observation("0", make_obs(3))
    rec.executed("0", [ACTION], obs_timesteps=[3], chunk=[None], latency=None)
    rec.episode_end("0", result(score=0.5), lock_lost=False)
    rec.close()
    rows = [json.loads(x) for x in (tmp_path / EID / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["obs_timestep"] for r in rows] == [0, 0, 0, 3]
    assert [r["frame"] for r in rows] == [0, 0, 0, 1]
    assert rows[0]["state"] is not None and rows[1]["state"] is None and rows[2]["state"] is None
    assert rows[3]["state"] is not None
    assert [r["chunk"] for r in rows][:3] == [{"index": i, "size": 3} for i in range(3)]
    assert probe_video(_cam(tmp_path / EID, "left_camera"))[0] == 2


def test_rerun_replaces_attempt_and_abort_marks_incomplete(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    record_episode(rec, "0", EID, 4)
    # Second attempt of the same episode, aborted by a lock loss.
    rec.observation("0", make_obs(0, reset=True))
    rec.executed("0", [ACTION], obs_timesteps=[0], chunk=[None], latency=None)
    rec.episode_end("0", None, lock_lost=True)
    rec.close()
    ep = tmp_path / EID
    rows = (ep / "steps.jsonl").read_text().splitlines()
    assert len(rows) == 1  # rows of different attempts never mix
    assert not (ep / "result.json").exists()
    marker = json.loads((ep / "INCOMPLETE").read_text())
    assert "lock_lost" in marker["reason"]


def test_a_late_abort_leaves_a_later_attempt_alone(tmp_path: Path) -> None:
    # The server re-queues a killed or lock-lost seed at once: another process's recorder may
    # begin the same episode directory before this recorder's writer gets to the abort. The late
    # abort must not delete the later attempt's frame spool or overwrite its marker (seen as
    # "recording failed: No such file or directory: '<episode>/.frames'" under load).
    a, b = Recorder(tmp_path), Recorder(tmp_path)
    a.observation("0", make_obs(0, reset=True))
    a._sync()
    b.observation("1", make_obs(0, reset=True))  # begins the same directory: a's attempt is over
    b._sync()
    a.episode_aborted("0", "restarted: the failed request may have run")
    a.close()
    for t in range(3):
        b.executed("1", [ACTION], obs_timesteps=[t], chunk=[None], latency=None)
        if t < 2:
            b.observation("1", make_obs(t + 1, value=t))
    b.episode_end("1", result(), lock_lost=False)
    b.close()
    ep = tmp_path / EID
    assert json.loads((ep / "result.json").read_text())["score"] == 1.0
    assert not (ep / "INCOMPLETE").exists()
    assert len((ep / "steps.jsonl").read_text().splitlines()) == 3
    assert probe_video(_cam(ep, "left_camera"))[0] == 3


def test_an_abort_of_its_own_attempt_still_marks_it(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    rec.observation("0", make_obs(0, reset=True))
    rec.episode_aborted("0", "restarted: the failed request may have run")
    rec.close()
    marker = json.loads((tmp_path / EID / "INCOMPLETE").read_text())
    assert marker["reason"].startswith("restarted:")
    assert not (tmp_path / EID / ".frames").exists()


@pytest.mark.parametrize(
    "eid",
    ["../../etc/x/000", "/abs/run/task/000", "b/r/t/../../../x", "b\\r\\t\\0", "C:/r/t/0", "b/r/t\x00/0"],
)
def test_unsafe_episode_ids_rejected(tmp_path: Path, eid: str) -> None:
    root = tmp_path / "root"
    rec = Recorder(root)
    with pytest.raises(EpisodeIdError, match="refusing to record"):
        rec.observation("0", make_obs(0, reset=True, eid=eid))
    rec.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert list(root.iterdir()) == []


def test_symlink_escape_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "testbed").mkdir(parents=True)
    (root / "testbed" / "run1").symlink_to(outside)
    rec = Recorder(root)
    rec.observation("0", make_obs(0, reset=True))
    with pytest.raises(RecordingError, match="outside the results root"):
        rec.close()
    assert list(outside.iterdir()) == []


def test_writer_failure_reported_not_deadlocked(tmp_path: Path) -> None:
    ep = tmp_path / EID
    (ep / "steps.jsonl").mkdir(parents=True)  # cannot be replaced: the writer fails
    rec = Recorder(tmp_path, queue_size=2)
    with pytest.raises(RecordingError, match="recording failed"):
        for t in range(200):  # far more than the queue holds: must raise, never block
            rec.observation("0", make_obs(t, reset=(t == 0)))
    with pytest.raises(RecordingError):
        rec.close()


def test_encoder_failure_reported(tmp_path: Path) -> None:
    # (inline: the recorder runs the encoder; deferred stores the bytes as received)
    rec = Recorder(tmp_path, transcode="inline")
    obs = make_obs(0, reset=True)
    obs["video.left_camera_view"] = JpegFrame(b"\xff\xd8 this is not a jpeg", (48, 64, 3))
    rec.observation("0", obs)
    rec.executed("0", [ACTION], obs_timesteps=[0], chunk=[None], latency=None)
    rec.episode_end("0", result(), lock_lost=False)
    with pytest.raises(RecordingError, match="recording failed"):
        rec.close()
    assert not (tmp_path / EID / "result.json").exists()


def test_raw_frames_are_encoded_in_writer(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    obs = make_obs(0, reset=True)
    obs["video.left_camera_view"] = np.zeros((48, 64, 3), np.uint8)
    rec.observation("0", obs)
    rec.executed("0", [ACTION], obs_timesteps=[0], chunk=[None], latency=None)
    rec.episode_end("0", result(), lock_lost=False)
    rec.close()
    assert probe_video(_cam(tmp_path / EID, "left_camera")) == (1, 64, 48)


def test_live_view(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, live_every=2)
    rec.observation("0", make_obs(0, reset=True))
    for t in range(1, 4):
        rec.executed("0", [ACTION], obs_timesteps=[t - 1], chunk=[None], latency=None)
        rec.observation("0", make_obs(t))
    rec.close()
    live = tmp_path / "testbed" / "run1" / ".live" / "0"
    info = json.loads((live / "live.json").read_text())
    assert info["step"] == 3 and info["episode_id"] == EID
    assert info["instruction"] == "reach the red block"
    assert sorted(info["cameras"]) == ["left_camera", "top_camera"]
    assert (live / "left_camera.jpg").read_bytes()[:2] == b"\xff\xd8"
    # The episode never ended: it stays marked incomplete.
    assert (tmp_path / EID / "INCOMPLETE").exists()


def test_frame_file_roundtrip(tmp_path: Path) -> None:
    import struct

    p = tmp_path / "f.jpegs"
    p.write_bytes(struct.pack(">I", 3) + b"abc" + struct.pack(">I", 1) + b"d" + struct.pack(">I", 9) + b"xx")
    assert list(iter_frame_file(p)) == [b"abc", b"d"]  # a truncated tail (SIGKILL) is ignored


def _merge_many(path: str, start: int, n: int) -> None:
    for i in range(start, start + n):
        merge_json(Path(path), lambda cur, i=i: cur.__setitem__(f"{i:04d}", {"score": 1.0, "sr": 1.0}),
                   Path(path).with_name("episode_result.lock"))


@pytest.mark.slow
def test_concurrent_episode_result_merges_from_processes(tmp_path: Path) -> None:
    # The recorder's merge path: several processes write the same task's episode_result.json.
    target = tmp_path / "episode_result.json"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_merge_many, args=(str(target), k * 20, 20)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = json.loads(target.read_text())
    assert len(data) == 80


def _record_in_process(root: str, wid: str, seeds: list[str]) -> None:
    rec = Recorder(root)
    for s in seeds:
        record_episode(rec, wid, f"testbed/run1/testbed/reach/red_easy/{s}", 2)
    rec.close()


@pytest.mark.slow
def test_recorders_in_several_processes_share_task_results(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_record_in_process, args=(str(tmp_path), str(k), [f"{k}{j:02d}" for j in range(3)]))
        for k in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    er = json.loads((tmp_path / "testbed/run1/testbed/reach/red_easy/episode_result.json").read_text())
    assert len(er) == 9
    run = json.loads((tmp_path / "testbed/run1/run.json").read_text())
    assert run["workers"] == [] or isinstance(run["workers"], list)


def test_live_view_refuses_unsafe_worker_id(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "root", live_every=1)
    rec.observation("../../evil", make_obs(0, reset=True))
    rec.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert not (tmp_path / "root" / "testbed" / "evil").exists()
    assert not list((tmp_path / "root").rglob("live.json"))


def _dead_pid() -> int:
    p = mp.get_context("spawn").Process(target=int)
    p.start()
    p.join()
    assert p.pid is not None
    return p.pid


def write_dead_pending(d: Path, pid: int, *, steps: int, eid: str = EID) -> None:
    """The ``.pending_result`` note a recorder (process ``pid``, now dead) leaves in episode
    directory ``d`` once it has saved the server's result (score 1) of ``eid``, ``steps`` rows."""
    (d / f".pending_result.{pid}.json").write_text(json.dumps({
        "episode": {"episode_id": eid, "task_name": "testbed/reach/red_easy", "seed": eid[-3:],
                    "worker_id": "0", "robot_id": "manip/lift2/R5a", "instruction": "x",
                    "started": "t", "steps": steps},
        "result": {"score": 1.0, "sr": 1.0}, "cameras": ["left_camera", "top_camera"],
        "finished": "t", "host": socket.gethostname(),
    }))


def test_recover_finishes_a_dead_recorders_episode_and_refuses_a_short_one(tmp_path: Path) -> None:
    """A result saved by a recorder that then died: the next recorder finishes the episode when
    every row it counted is on disk, else keeps it INCOMPLETE with the server's result."""
    eid_ok, eid_short = EID, EID[:-1] + "1"
    rec = Recorder(tmp_path)
    for eid in (eid_ok, eid_short):
        rec.observation("0", make_obs(0, reset=True, eid=eid))
        for t in range(4):
            rec.executed("0", [ACTION], obs_timesteps=[t], chunk=[None], latency=None)
            rec.observation("0", make_obs(t + 1, eid=eid, value=t))
        rec.episode_ended("0")  # rows and frames on disk, marker written
        rec._episodes.pop("0")  # the process "dies" here: nothing more is written for it
    rec.close()
    dead = _dead_pid()
    run_dir = tmp_path / "testbed" / "run1"
    for eid in (eid_ok, eid_short):
        d = tmp_path / eid
        (d / "INCOMPLETE").write_text(json.dumps({"episode_id": eid, "reason": None}))
        write_dead_pending(d, dead, steps=4 if eid == eid_ok else 6, eid=eid)
        for marker in d.glob(".awaiting_result.*.json"):
            marker.unlink()
    with open(tmp_path / eid_ok / "steps.jsonl", "ab") as fh:
        fh.write(b'{"torn": ')  # a half-written row after the 4 counted ones
    rec2 = Recorder(tmp_path)
    assert rec2.recover(run_dir) == 1
    rec2.close()
    ok = tmp_path / eid_ok
    assert json.loads((ok / "result.json").read_text())["steps"] == 4
    assert len((ok / "steps.jsonl").read_text().splitlines()) == 4  # the torn row is gone
    assert probe_video(_cam(ok, "left_camera"))[0] == 5
    short = tmp_path / eid_short
    info = json.loads((short / "INCOMPLETE").read_text())
    assert info["server_result"] == {"score": 1.0, "sr": 1.0} and not (short / "result.json").exists()
    assert not list(short.glob(".pending_result.*"))
    assert json.loads((ok.parent / "episode_result.json").read_text()) == {"000": {"score": 1.0, "sr": 1.0}}


def test_a_saved_result_is_not_taken_for_lost_when_the_end_note_outlived_it(tmp_path: Path) -> None:
    """A recorder killed after saving a result and before its writer removed the episode's
    "awaiting" note leaves both; the next client on the worker finds nothing held on the server
    (the result was handed out): the episode is finished from the saved result, not marked lost
    (that removed its frames while they were being finished; found on a Ray node's loss)."""
    rec = Recorder(tmp_path)
    rec.observation("0", make_obs(0, reset=True))
    for t in range(3):
        rec.executed("0", [ACTION], obs_timesteps=[t], chunk=[None], latency=None)
        rec.observation("0", make_obs(t + 1, value=t))
    rec.episode_ended("0")
    rec._episodes.pop("0")  # the process "dies" here
    rec.close()
    d = tmp_path / EID
    dead = _dead_pid()
    (awaiting,) = d.glob(".awaiting_result.*.json")
    awaiting.rename(d / f".awaiting_result.{dead}.json")
    write_dead_pending(d, dead, steps=3)
    rec2 = Recorder(tmp_path)
    rec2.results_not_held(["0"])  # what the resumed client's probe of worker 0 found
    assert rec2.recover(tmp_path / "testbed" / "run1") == 1
    rec2.close()
    assert json.loads((d / "result.json").read_text())["score"] == 1.0
    assert not (d / "INCOMPLETE").exists() and not list(d.glob(".*_result.*.json"))
    assert probe_video(_cam(d, "left_camera"))[0] == 4


def test_recover_tidies_a_finished_episode_killed_before_its_marker_was_removed(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    record_episode(rec, "0", EID, 3)
    rec.close()
    ep = tmp_path / EID
    before = (ep / "result.json").read_bytes()
    # the state a kill between writing result.json and removing INCOMPLETE leaves
    (ep / "INCOMPLETE").write_text("{}")
    (ep / ".pending_result.999999999.json").write_text("{}")
    rec2 = Recorder(tmp_path)
    assert rec2.recover(tmp_path / "testbed" / "run1") == 0
    rec2.close()
    assert not (ep / "INCOMPLETE").exists() and not list(ep.glob(".pending_result.*"))
    assert (ep / "result.json").read_bytes() == before
