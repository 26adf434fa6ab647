"""Conformance of the testbed with the real server, written from the reference facts only.

Plain HTTP (``http.client``) and the allow-list unpickler; no eval client.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tbhelpers import Raw, poll_reset, untag
from genmanip_protocol.codec import safe_loads
from genmanip_results.video import ffmpeg_executable, probe_video
from genmanip_testbed import expert_policy, serve_testbed

pytestmark = pytest.mark.timeout(120)

LIFT2_SHAPES = {
    "video.left_camera_view": [480, 640, 3],
    "video.right_camera_view": [480, 640, 3],
    "video.top_camera_view": [720, 1280, 3],
    "video.overlook_camera_view": [720, 1280, 3],
}


def _zero_action(dim: int = 16) -> dict[str, Any]:
    return {"control_type": "joint_position", "action": [0.0] * dim, "is_rel": True}


def _check_raw_obs(obs: dict[str, Any], episode_id: str) -> None:
    """The observation as it is on the wire (tagged values), facts §7 and §7.3."""
    for key, shape in LIFT2_SHAPES.items():
        v = obs[key]
        assert v["type"] == "jpeg_bytes" and v["dtype"] == "uint8" and list(v["shape"]) == shape
        assert isinstance(v["data"], bytes) and v["data"][:2] == b"\xff\xd8"
    for key, n in (("state.joints", 12), ("state.gripper", 4), ("state.base", 3)):
        v = obs[key]
        assert v["type"] == "numpy_array" and v["dtype"] == "float32" and list(v["shape"]) == [n]
    ee = obs["state.ee_pose"]
    assert len(ee) == 2 and all(len(p) == 2 and len(p[0]) == 3 and len(p[1]) == 4 for p in ee)
    for _pos, quat in ee:
        assert abs(float(np.linalg.norm(quat)) - 1.0) < 1e-6
    assert isinstance(obs["instruction"], str) and obs["instruction"]
    assert obs["robot_id"] == "manip/lift2/R5a"
    assert obs["episode_id"] == episode_id
    assert isinstance(obs["timestep"], int)
    assert "video.camera1_view" not in obs


def _drive_to_end(
    raw: Raw, wid: str, first: dict[str, Any], *, chunk: int = 0
) -> tuple[dict[str, Any], int]:
    """Step worker ``wid`` with the expert until its episode ends; returns (next entry, executed steps)."""
    policy = expert_policy(chunk=str(max(chunk, 1)))
    obs = untag(first["obs"])
    executed = 0
    while True:
        if chunk:
            acts = policy.get_action_chunk(obs)
            st, resp = raw.pickle_post("/step_chunk", [{wid: a} for a in acts])
            assert st == 200, resp
            executed += resp["executed_steps"]
            assert resp["executed_steps"] <= len(acts)
            entry = resp["obs"][wid]
            if entry.get("reset_pending"):
                assert resp["stopped_early"] is True or resp["executed_steps"] == len(acts)
        else:
            st, resp = raw.pickle_post("/step", {wid: policy.get_action(obs)})
            assert st == 200, resp
            executed += 1
            entry = resp[wid]
        if entry.get("reset_pending"):
            # The ending step's observation is never returned: the pending form (facts §5).
            assert entry["obs"] == {"reset": True, "reset_pending": True}
            assert entry["episode_result"] is None
            return poll_reset(raw, [wid])[wid], executed
        obs = untag(entry["obs"])
        assert obs["reset"] is False


def test_full_job_legacy_wire(tmp_path: Path, raw_factory: Any) -> None:
    with serve_testbed(
        tasks=("testbed/smoke",),
        run_id="conf",
        results_root=tmp_path,
        save_process=True,
        wire="legacy",
    ) as tb:
        raw = raw_factory(tb.url)
        st, hdr, _ = raw.request("GET", "/docs")
        assert st == 200 and hdr["content-type"].startswith("text/html")
        st, status = raw.get_json("/status")
        assert st == 200
        data = status["data"]
        assert data == {
            "status": "idle",
            "benchmark_id": "testbed",
            "run_id": "conf",
            "total_episodes": 2,
            "completed_episodes": 0,
            "in_progress_episodes": 0,
            "active_workers": [],
            "results": {},
        }
        st, resp = raw.pickle_post("/reset", {"worker_ids": ["0"]})
        assert st == 200
        assert resp["0"] == {
            "obs": {"reset": True, "reset_pending": True},
            "metric": {"*testbed/smoke/red_block_easy": {"score": 0.0, "sr": 0.0}},
            "episode_result": None,
            "reset_pending": True,
        }
        assert raw.get_json("/status")[1]["data"]["status"] == "running"
        first = poll_reset(raw, ["0"])["0"]
        assert first["episode_result"] is None
        _check_raw_obs(first["obs"], "testbed/conf/testbed/smoke/red_block_easy/000")
        assert first["obs"]["timestep"] == 0 and first["obs"]["reset"] is True
        # Lock file while the episode runs (facts §12.1).
        lock = tb.run_dir / "testbed/smoke/red_block_easy/000.lock"
        info = json.loads(lock.read_text())
        assert set(info) == {"worker_id", "timestamp", "pid", "host", "task_name", "seed"}
        assert info["worker_id"] == "0" and info["seed"] == "000"

        nxt, n1 = _drive_to_end(raw, "0", first)
        # Results one hop late: the finished episode's result arrives with the next first obs.
        assert nxt["episode_result"] == {
            "episode_id": "testbed/conf/testbed/smoke/red_block_easy/000",
            "task_name": "testbed/smoke/red_block_easy",
            "seed": "000",
            "score": 1.0,
            "sr": 1.0,
        }
        assert nxt["obs"]["episode_id"].endswith("/001") and nxt["obs"]["timestep"] == 0
        assert nxt["metric"] == {"*(1/2)testbed/smoke/red_block_easy": {"score": 1.0, "sr": 1.0}}
        # Second episode in chunk mode.
        last, n2 = _drive_to_end(raw, "0", nxt, chunk=4)
        assert last["obs"] is None  # worker finished
        assert last["metric"] == {"(2/2)testbed/smoke/red_block_easy": {"score": 1.0, "sr": 1.0}}
        assert last["episode_result"]["seed"] == "001"
        assert tb.stats.steps_by_worker["0"] == n1 + n2
        tb.wait_finalizes()
        st, status = raw.get_json("/status")
        assert status["data"]["status"] == "complete"
        assert status["data"]["completed_episodes"] == 2
        assert status["data"]["results"] == {"testbed/smoke/red_block_easy": 1.0}
        st, status = raw.get_json("/status?refresh=1")
        assert (
            status["data"]["completed_episodes"] == 2
            and status["data"]["in_progress_episodes"] == 0
        )

        run_dir = tmp_path / "saved/eval_results/testbed/conf"
        assert json.loads((run_dir / "result.json").read_text()) == last["metric"]
        for seed, steps in (("000", n1), ("001", n2)):
            d = run_dir / "testbed/smoke/red_block_easy" / seed
            ri = json.loads((d / "result_info.json").read_text())
            assert set(ri) == {"score", "success_rate", "log_info"}
            assert (
                ri["score"] == 1.0
                and ri["success_rate"] == 1
                and isinstance(ri["success_rate"], int)
            )
            assert set(ri["log_info"]) == {"episode_start_time", "episode_end_time", "metric_score"}
            time.strptime(ri["log_info"]["episode_start_time"][:19], "%Y-%m-%d_%H_%M_%S")
            assert ri["log_info"]["metric_score"] == [[[1.0], [1.0]]]
            assert not (run_dir / "testbed/smoke/red_block_easy" / f"{seed}.lock").exists()
            meta = safe_loads((d / "meta_record.pkl").read_bytes())
            assert set(meta) == {
                "joint_positions",
                "gripper_positions",
                "base_positions",
                "instruction",
                "model_output",
                "robot_id",
            }
            assert meta["robot_id"] == "manip/lift2/R5a" and len(meta["model_output"]) == steps
            assert set(meta["model_output"][0]) == {"arm_action", "base_motion"}
            for cam, (h, w) in (
                ("left_camera", (480, 640)),
                ("right_camera", (480, 640)),
                ("top_camera", (720, 1280)),
                ("overlook_camera", (720, 1280)),
            ):
                n, width, height = probe_video(d / f"{cam}.mp4")
                assert (width, height) == (w, h) and n == steps + 1  # first obs + one per step
            err = subprocess.run(
                [ffmpeg_executable(), "-hide_banner", "-i", str(d / "left_camera.mp4")],
                check=False,
                capture_output=True,
                text=True,
            ).stderr
            assert "Video: h264" in err


def test_malformed_requests_and_details(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), capacity=4, run_id="errs") as tb:
        raw = raw_factory(tb.url)
        cases = [
            ("/step", b"not a pickle", 400, "Invalid pickle in request body: "),
            ("/step_chunk", b"\x80\x05junk", 400, "Invalid pickle in request body: "),
            ("/reset", b"garbage", 400, "Invalid pickle in reset body: "),
            ("/reset_result", b"garbage", 400, "Invalid pickle in reset_result body: "),
        ]
        for path, body, code, prefix in cases:
            st, _, data = raw.request("POST", path, body, ctype="application/octet-stream")
            assert st == code, (path, data)
            assert json.loads(data)["detail"].startswith(prefix)
        assert raw.pickle_post("/reset", ["0"]) == (
            400,
            {"detail": "Reset body must decode to a dict"},
        )
        assert raw.pickle_post("/reset_result", ["0"]) == (
            400,
            {"detail": "Reset result body must decode to a dict"},
        )
        assert raw.pickle_post("/step_chunk", {"0": {}}) == (
            400,
            {"detail": "action_chunk must be a list[action_dict]"},
        )
        assert raw.pickle_post("/step_chunk", []) == (
            500,
            {"detail": "action_chunk must be a non-empty list"},
        )
        assert raw.pickle_post("/step_chunk", [{}]) == (
            500,
            {"detail": "Each action in action_chunk must be a non-empty dict"},
        )
        # Unknown worker: a KeyError, which /step_chunk reports as bare text.
        st, hdr, data = raw.request(
            "POST",
            "/step_chunk",
            __import__("pickle").dumps([{"9": _zero_action()}]),
            ctype="application/octet-stream",
        )
        assert (st, data) == (500, b"Internal Server Error") and hdr["content-type"].startswith(
            "text/plain"
        )
        assert raw.pickle_post("/step", {"9": _zero_action()}) == (500, {"detail": "KeyError: '9'"})

        j = raw.json_post
        assert j("/start_new_job", []) == (400, {"detail": "Request body must be a JSON object"})
        assert j("/start_new_job", {}) == (
            400,
            {"detail": "Request body must contain data.config_path"},
        )
        assert j("/start_new_job", {"data": {"config_path": []}}) == (
            400,
            {"detail": "config_path must be a non-empty list of strings"},
        )
        assert j("/start_new_job", {"data": {"config_path": [" "]}}) == (
            400,
            {"detail": "config_path must contain non-empty strings only"},
        )
        assert j("/start_new_job", {"data": {"config_path": ["testbed/smoke"], "run_id": 5}}) == (
            400,
            {"detail": "run_id must be a string when provided"},
        )
        assert j("/start_new_job", {"data": {"config_path": ["testbed/nope"]}}) == (
            500,
            {"detail": "ValueError: Config file testbed/nope not found"},
        )
        assert j(
            "/start_new_job", {"data": {"config_path": ["testbed/smoke"], "run_id": "../x"}}
        ) == (500, {"detail": "ValueError: run_id contains invalid path segments"})
        st, _, data = raw.request("POST", "/start_new_job", b"{nope", ctype="application/json")
        assert st == 500 and json.loads(data)["detail"].startswith("JSONDecodeError: ")
        assert j("/create_workers", {"data": {}}) == (
            400,
            {"detail": "Request body must contain data.worker_ids"},
        )
        assert j("/kill", {}) == (400, {"detail": "Request body must contain data.worker_ids"})
        assert j("/create_workers", {"data": {"worker_ids": ["a", "b", "c", "d", "e"]}}) == (
            500,
            {
                "detail": "InsufficientResourcesError: Insufficient resources: requested 5 workers, "
                "but only 4 slots available"
            },
        )
        st, _, data = raw.request("POST", "/reset", b"", ctype="application/octet-stream")
        assert (st, json.loads(data)) == (
            500,
            {
                "detail": "ValueError: worker_ids not provided and no active "
                "workers exist; create workers first"
            },
        )
        st, _, data = raw.request("POST", "/reset_result", b"", ctype="application/octet-stream")
        assert (st, json.loads(data)) == (
            500,
            {"detail": "ValueError: worker_ids must be a non-empty list"},
        )
        assert raw.pickle_post("/reset", {"worker_ids": [" "]}) == (
            500,
            {"detail": "ValueError: worker_ids must contain non-empty values"},
        )

        # A worker with an episode: wrong action length -> RayTaskError(ValueError), episode continues.
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        assert raw.pickle_post("/reset_result", {"worker_ids": ["1"]}) == (
            500,
            {"detail": "ValueError: worker 1 has no pending reset result"},
        )
        first = poll_reset(raw, ["0"])["0"]
        assert raw.pickle_post("/reset_result", {"worker_ids": ["0"]}) == (
            500,
            {"detail": "ValueError: worker 0 has no pending reset result"},
        )  # destructive read
        st, resp = raw.pickle_post("/step", {"0": _zero_action(9)})
        assert st == 500
        assert resp["detail"].startswith("RayTaskError(ValueError): ")
        assert "shape mismatch: value array of shape (9,) could not be broadcast" in resp["detail"]
        st, resp = raw.pickle_post(
            "/step", {"0": {"control_type": "joint_velocity", "action": [0.0] * 16}}
        )
        assert st == 500 and "Unsupported control_type: joint_velocity" in resp["detail"]
        st, resp = raw.pickle_post("/step_chunk", [{"0": _zero_action(9)}])
        assert (
            st == 500 and resp["detail"].startswith("ray::") and "shape mismatch" in resp["detail"]
        )
        st, resp = raw.pickle_post("/step", {"0": _zero_action()})
        assert st == 200 and resp["0"]["obs"]["timestep"] == 1  # the bad actions were not executed
        assert untag(first["obs"])["timestep"] == 0


def test_no_job_and_token() -> None:
    with serve_testbed(job=False, token="s3cret") as tb:
        for token, code in ((None, 401), ("wrong", 401), ("s3cret", 200)):
            raw = Raw(tb.url, token)
            st, body = raw.get_json("/status")
            assert st == code
            if code == 401:
                assert "detail" in body and "s3cret" not in json.dumps(body)
            else:
                assert body["data"]["status"] == "idle" and body["data"]["benchmark_id"] is None
            raw.close()
        raw = Raw(tb.url)
        assert raw.request("GET", "/docs")[0] == 200  # liveness needs no token
        raw.close()
        raw = Raw(tb.url, "s3cret")
        assert raw.pickle_post("/reset", {"worker_ids": ["0"]}) == (
            500,
            {"detail": "ValueError: No job started. Call start_new_job first."},
        )
        assert raw.json_post("/start_new_job", {"data": {"config_path": ["testbed/smoke"]}}) == (
            200,
            {"data": {"success": True}},
        )
        st, body = raw.get_json("/status")
        # No run id given and none stored: a timestamp run id (facts §9.2).
        assert len(body["data"]["run_id"]) == len("2026-01-01_00_00_00_000000")
        raw.close()


def test_kill_requeues_and_resume(tmp_path: Path, raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), run_id="rk", results_root=tmp_path) as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        first = poll_reset(raw, ["0"])["0"]
        assert first["obs"]["episode_id"].endswith("/000")
        assert raw.json_post("/kill", {"data": {"worker_ids": ["0", "unknown"]}}) == (
            200,
            {"data": {"success": True}},
        )
        assert not (tb.run_dir / "testbed/smoke/red_block_easy/000.lock").exists()
        _st, status = raw.get_json("/status")
        assert status["data"]["active_workers"] == [] and status["data"]["status"] == "idle"
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        again = poll_reset(raw, ["0"])["0"]
        assert again["obs"]["episode_id"].endswith("/000")  # re-queued at the front
        nxt, _ = _drive_to_end(raw, "0", again)
        assert nxt["obs"]["episode_id"].endswith("/001")
        tb.wait_finalizes()
        # Resume: a new job on the same run id keeps the finished seed.
        assert (
            raw.json_post(
                "/start_new_job", {"data": {"config_path": ["testbed/smoke"], "run_id": "rk"}}
            )[0]
            == 200
        )
        _, status = raw.get_json("/status")
        assert status["data"]["completed_episodes"] == 1 and status["data"]["active_workers"] == []
        assert status["data"]["status"] == "incomplete"
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        resumed = poll_reset(raw, ["0"])["0"]
        assert resumed["obs"]["episode_id"].endswith("/001")
        assert resumed["metric"] == {
            "*(1/2)testbed/smoke/red_block_easy": {"score": 1.0, "sr": 1.0}
        }
        # Without run_id the stored one is reused.
        assert (
            raw.json_post("/start_new_job", {"data": {"config_path": ["testbed/smoke"]}})[0] == 200
        )
        assert raw.get_json("/status")[1]["data"]["run_id"] == "rk"


def test_chunk_fast_path_swallows_unpolled_reset(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), reset_delay=0.01) as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        deadline = time.monotonic() + 10
        while tb.stats.resets_finished < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        st, resp = raw.pickle_post(
            "/step_chunk?render_mode=always&subframes=x", [{"0": _zero_action()}] * 3
        )
        assert st == 200
        assert resp["executed_steps"] == 3 and resp["stopped_early"] is False
        assert resp["obs"]["0"]["obs"]["timestep"] == 3  # the actions applied to the new episode
        assert tb.stats.resets_swallowed == 1 and tb.stats.chunk_paths["fast"] == 1


def test_slow_path_stops_after_pending_worker(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), reset_delay=0.5) as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0", "1"]})
        chunk = [{"0": _zero_action(), "1": _zero_action()}] * 4
        st, resp = raw.pickle_post("/step_chunk", chunk)
        assert st == 200
        assert resp["executed_steps"] == 1 and resp["stopped_early"] is True
        assert resp["obs"]["0"]["reset_pending"] is True
        assert tb.stats.total_steps == 0 and tb.stats.chunk_paths["slow"] == 1
        # A reset that is still running sends a single-worker chunk down the slow path too.
        st, resp = raw.pickle_post("/step_chunk", [{"0": _zero_action()}] * 2)
        assert resp["executed_steps"] == 1 and resp["obs"]["0"]["reset_pending"] is True


def test_step_while_pending_drops_action_and_collects_result(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), reset_delay=0.05) as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        time.sleep(0.5)
        st, resp = raw.pickle_post("/step", {"0": _zero_action()})
        assert st == 200
        e = resp["0"]
        assert (
            e["obs"]["reset"] is True and e["obs"]["timestep"] == 0
        )  # stored first obs, action dropped
        assert tb.stats.total_steps == 0


def test_lock_lost_after_three_failed_refreshes(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), run_id="lk") as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        poll_reset(raw, ["0"])
        lock = tb.run_dir / "testbed/smoke/red_block_easy/000.lock"
        lock.unlink()  # someone else removed our lock (facts §5: lock loss)
        st, resp = raw.pickle_post("/step", {"0": _zero_action()})
        assert st == 200 and "lock_lost" not in resp["0"]  # failures 1 and 2: still ours
        st, resp = raw.pickle_post("/step", {"0": _zero_action()})
        assert st == 200 and resp["0"]["lock_lost"] is True and resp["0"]["reset_pending"] is True
        nxt = poll_reset(raw, ["0"])["0"]
        # The seed was re-queued at the front and the worker moved on to it again.
        assert nxt["obs"]["episode_id"].endswith("/000") and nxt["obs"]["timestep"] == 0
        assert tb.stats.steps_by_worker["0"] == 1


def test_a_lock_made_again_by_another_process_is_lost(raw_factory: Any) -> None:
    # Removed and made again at once, the new file often gets the old inode (ext4): the testbed
    # must still see that the lock there is no longer its own.
    with serve_testbed(tasks=("testbed/smoke",), run_id="lk2") as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        poll_reset(raw, ["0"])
        lock = tb.run_dir / "testbed/smoke/red_block_easy/000.lock"
        mine = json.loads(lock.read_text())
        lock.unlink()
        lock.write_text(json.dumps({**mine, "pid": mine["pid"] + 1, "host": "elsewhere"}))
        st, resp = raw.pickle_post("/step", {"0": _zero_action()})
        assert st == 200 and "lock_lost" not in resp["0"]
        st, resp = raw.pickle_post("/step", {"0": _zero_action()})
        assert st == 200 and resp["0"]["lock_lost"] is True
        # (and the other process's lock is left alone)
        assert json.loads(lock.read_text())["host"] == "elsewhere"


def test_chunk_stops_at_episode_end(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=5) as tb:
        raw = raw_factory(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        poll_reset(raw, ["0"])
        st, resp = raw.pickle_post("/step_chunk?render_suffix=1", [{"0": _zero_action()}] * 8)
        assert st == 200
        assert resp["executed_steps"] == 5 and resp["stopped_early"] is True
        assert resp["obs"]["0"]["reset_pending"] is True
        assert tb.stats.steps_by_worker["0"] == 5
        nxt = poll_reset(raw, ["0"])["0"]
        assert nxt["episode_result"]["score"] == 0.0 and nxt["episode_result"]["sr"] == 0.0
        # The next chunk: the whole chunk runs.
        st, resp = raw.pickle_post("/step_chunk", [{"0": _zero_action()}] * 3)
        assert resp["executed_steps"] == 3 and resp["stopped_early"] is False


def test_worker_id_quirks_and_busy_reset_leak(raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",)) as tb:
        raw = raw_factory(tb.url)
        # /create_workers keeps ids as sent: an int id is a different worker from "0".
        assert raw.json_post("/create_workers", {"data": {"worker_ids": [0]}})[0] == 200
        raw.pickle_post("/reset", {"worker_ids": [0]})  # /reset stringifies
        _, status = raw.get_json("/status")
        assert sorted(map(str, status["data"]["active_workers"])) == ["0", "0"]
        poll_reset(raw, ["0"])
        # /reset on a busy worker takes a new seed without releasing the old one.
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        second = poll_reset(raw, ["0"])["0"]
        assert second["obs"]["episode_id"].endswith("/001")
        _, status = raw.get_json("/status")
        assert status["data"]["in_progress_episodes"] == 2  # 000 leaked, 001 running


# ======================================================================= unknown workers ====
# A worker id the server does not know (never created, killed, or lost in a server restart),
# route by route, as the real server answers (facts §1.1 errors, §2 route notes).

_NO_JOB = "No job started. Call start_new_job first."


def _bare_500(raw: Raw, path: str, obj: Any) -> None:
    """A bare text 500 (FastAPI's answer for an exception the route does not format)."""
    st, hdr, data = raw.request("POST", path, pickle.dumps(obj), ctype="application/octet-stream")
    assert (st, data) == (500, b"Internal Server Error")
    assert hdr["content-type"].startswith("text/plain")


def _ready_worker(raw: Raw, wid: str = "0") -> dict[str, Any]:
    raw.pickle_post("/reset", {"worker_ids": [wid]})
    return poll_reset(raw, [wid])[wid]


@pytest.mark.parametrize(
    "route", ["step", "step_chunk", "reset", "reset_result", "kill", "create_workers"]
)
def test_unknown_worker_answers_like_the_real_server(route: str, raw_factory: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), run_id="unk") as tb:
        raw = raw_factory(tb.url)
        _ready_worker(raw)  # a known worker next to the unknown one
        steps = tb.stats.total_steps
        if route == "step":
            # /step stringifies ids, then looks the worker up: a KeyError, formatted (§1.1)
            assert raw.pickle_post("/step", {"7": _zero_action()}) == (
                500, {"detail": "KeyError: '7'"})
            assert raw.pickle_post("/step", {7: _zero_action()}) == (
                500, {"detail": "KeyError: '7'"})
            # one failure fails the whole request and loses the others' results, though they
            # advanced (§2 /step)
            assert raw.pickle_post("/step", {"0": _zero_action(), "7": _zero_action()}) == (
                500, {"detail": "KeyError: '7'"})
            assert tb.stats.steps_by_worker["0"] == 1
            st, resp = raw.pickle_post("/step", {"0": _zero_action()})
            assert st == 200 and resp["0"]["obs"]["timestep"] == 2
        elif route == "step_chunk":
            # the KeyError is not one of the types /step_chunk formats: bare text (§1.1)
            _bare_500(raw, "/step_chunk", [{"7": _zero_action()}])
            _bare_500(raw, "/step_chunk", [{7: _zero_action()}] * 3)
            _bare_500(raw, "/step_chunk", [{"0": _zero_action(), "7": _zero_action()}])
        elif route == "reset":
            # /reset creates missing workers (§2)
            st, resp = raw.pickle_post("/reset", {"worker_ids": [7]})
            assert st == 200 and resp["7"]["reset_pending"] is True
            assert "7" in raw.get_json("/status")[1]["data"]["active_workers"]
        elif route == "reset_result":
            # nothing pending for it: the whole call fails (§2), a pending reset listed with it
            # is not consumed
            assert raw.pickle_post("/reset_result", {"worker_ids": ["7"]}) == (
                500, {"detail": "ValueError: worker 7 has no pending reset result"})
            raw.json_post("/kill", {"data": {"worker_ids": ["0"]}})
            raw.pickle_post("/reset", {"worker_ids": ["0"]})
            time.sleep(0.2)  # the reset has finished: its result is stored
            assert raw.pickle_post("/reset_result", {"worker_ids": ["0", "7"]}) == (
                500, {"detail": "ValueError: worker 7 has no pending reset result"})
            assert poll_reset(raw, ["0"])["0"]["obs"]["timestep"] == 0
        elif route == "kill":
            # unknown ids are accepted, nothing happens (§2)
            kills = tb.stats.kills
            assert raw.json_post("/kill", {"data": {"worker_ids": ["7", 7]}}) == (
                200, {"data": {"success": True}})
            assert tb.stats.kills == kills
            st, resp = raw.pickle_post("/step", {"0": _zero_action()})
            assert st == 200
        else:
            assert raw.json_post("/create_workers", {"data": {"worker_ids": ["7"]}}) == (
                200, {"data": {"success": True}})
            assert "7" in raw.get_json("/status")[1]["data"]["active_workers"]
        assert tb.stats.total_steps >= steps  # (no route above stepped the unknown worker)


@pytest.mark.parametrize("route", ["step", "step_chunk", "reset", "reset_result", "kill"])
def test_unknown_worker_without_a_job(route: str, raw_factory: Any) -> None:
    # A server with no job yet (a real one after a restart, until /start_new_job).
    with serve_testbed(job=False) as tb:
        raw = raw_factory(tb.url)
        expected: tuple[int, Any] = {
            "step": (500, {"detail": f"ValueError: {_NO_JOB}"}),
            # ValueError is one of the types /step_chunk formats, as str(e) only (§1.1)
            "step_chunk": (500, {"detail": _NO_JOB}),
            "reset": (500, {"detail": f"ValueError: {_NO_JOB}"}),
            "reset_result": (500, {"detail": f"ValueError: {_NO_JOB}"}),
            "kill": (200, {"data": {"success": True}}),
        }[route]
        if route == "kill":
            assert raw.json_post("/kill", {"data": {"worker_ids": ["0"]}}) == expected
        else:
            body: Any = {
                "step": {"0": _zero_action()},
                "step_chunk": [{"0": _zero_action()}],
                "reset": {"worker_ids": ["0"]},
                "reset_result": {"worker_ids": ["0"]},
            }[route]
            assert raw.pickle_post(f"/{route}", body) == expected
        data = raw.get_json("/status")[1]["data"]
        assert data["status"] == "idle" and data["benchmark_id"] is None and data["run_id"] is None
        assert data["active_workers"] == []


def test_restarted_server_knows_no_worker_and_resumes_the_run(tmp_path: Path, raw_factory: Any) -> None:
    """A new server process on the same results tree and run id (what a restart is): the old
    process's workers are unknown on every route, the run resumes from disk (finished seeds kept),
    and a seed the dead process held stays locked until its lock goes stale (§9.2, §12.1)."""
    with serve_testbed(tasks=("testbed/smoke",), run_id="rs", results_root=tmp_path) as old:
        raw = raw_factory(old.url)
        first = _ready_worker(raw)
        assert first["obs"]["episode_id"].endswith("/000")
        for _ in range(3):
            assert raw.pickle_post("/step", {"0": _zero_action()})[0] == 200
        lock = old.run_dir / "testbed/smoke/red_block_easy/000.lock"
        info = json.loads(lock.read_text())
    # The dead process's lock: not ours (another pid), fresh.
    info["pid"] = info["pid"] + 1_000_000
    lock.write_text(json.dumps(info))
    with serve_testbed(tasks=("testbed/smoke",), run_id="rs", results_root=tmp_path) as new:
        raw = raw_factory(new.url)
        data = raw.get_json("/status")[1]["data"]
        assert data["run_id"] == "rs" and data["active_workers"] == [] and data["status"] == "idle"
        assert raw.get_json("/status?refresh=1")[1]["data"]["in_progress_episodes"] == 1
        assert raw.pickle_post("/step", {"0": _zero_action()}) == (500, {"detail": "KeyError: '0'"})
        _bare_500(raw, "/step_chunk", [{"0": _zero_action()}])
        assert raw.pickle_post("/reset_result", {"worker_ids": ["0"]}) == (
            500, {"detail": "ValueError: worker 0 has no pending reset result"})
        assert raw.json_post("/kill", {"data": {"worker_ids": ["0"]}})[0] == 200
        assert lock.exists()  # not this process's: /kill of an unknown id touches nothing
        # /reset re-creates the worker; the locked seed is skipped, the next one served
        again = _ready_worker(raw)
        assert again["obs"]["episode_id"].endswith("/001") and again["obs"]["timestep"] == 0
        assert new.stats.steps_by_attempt == {again["obs"]["episode_id"]: [0]}
