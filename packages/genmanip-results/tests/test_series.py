"""genmanip_results.series: the one episode-series loader and its one bad-row policy."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_protocol.errors import UnsafePayloadError
from genmanip_results.discovery import load_episode
from genmanip_results.errors import GenmanipResultsError
from genmanip_results.series import (
    ISSUE_KINDS,
    SeriesError,
    SeriesIssue,
    SeriesNotFoundError,
    load_series,
    order_cameras,
)
from genmanip_results.testing import (
    server_run_dir,
    write_client_episode,
    write_server_episode,
)

PANDA = "manip/franka/panda_hand"


def _episode(tmp_path: Path, text: str | bytes, *, incomplete: bool = False) -> Path:
    """A client-layout episode directory holding only ``steps.jsonl`` (and ``run.json``)."""
    run = tmp_path / "res" / "bench" / "r1"
    ep = run / "bench" / "t" / "000"
    ep.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "benchmark": "bench"}))
    data = text.encode() if isinstance(text, str) else text
    (ep / "steps.jsonl").write_bytes(data)
    if incomplete:
        (ep / "INCOMPLETE").write_text("")
    return ep


def _row(step: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "episode_id": "bench/r1/bench/t/000",
        "worker_id": "0",
        "robot_id": PANDA,
        "step": step,
        "obs_timestep": step,
        "frame": step,
        "state": {"joints": [0.1 * step] * 7, "gripper": [0.04, 0.04], "base": [0.0] * 3},
        "action": {"control_type": "joint_position", "action": [0.01 * step] * 9, "is_rel": False},
        "chunk": None,
        "latency_ms": {"network": 1.0, "server": 2.0, "policy": 0.5},
    }
    row.update(over)
    return row


def _lines(*rows: dict[str, Any] | str) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


# --------------------------------------------------------------------------- both layouts


def test_client_layout_chunked_episode(tmp_path: Path) -> None:
    ep = write_client_episode(
        tmp_path / "b" / "r", "t/push", "3", steps=12, chunk=4, cameras={"left_camera": (64, 48)}
    )
    s = load_series(ep)
    assert s.layout == "client" and s.source == ep / "steps.jsonl"
    assert s.episode_id == "b/r/t/push/3" and s.robot is not None
    assert s.instruction == "pick up the cube"  # from result.json, through the discovery
    assert s.state_t.tolist() == [0, 4, 8]
    assert {k: v.shape for k, v in s.state.items()} == {
        "base": (3, 3),
        "gripper": (3, 4),
        "joints": (3, 12),
    }
    assert s.action_t.tolist() == list(range(12)) and s.action.shape == (12, 16)
    assert s.base_motion is not None and s.base_motion.shape == (12, 3)
    assert s.is_rel is False and s.base_is_rel is True and s.control_type == "joint_position"
    assert s.frame_timesteps == {0: 0, 1: 4, 2: 8} and s.frames_required == 3
    steps, frames = s.frame_steps()
    assert steps.tolist() == [0, 4, 8] and frames.tolist() == [0, 1, 2]
    # latencies: on the first row of every request (one request per chunk)
    assert s.latency_t.tolist() == [0, 4, 8]
    assert sorted(s.latency_ms) == ["network", "policy", "server"]
    assert s.latency_ms["server"].tolist() == [2.0, 2.0, 2.0]
    assert s.last_obs_t == 12 and s.t_range == (0, 12) and s.rows == 12
    assert s.issues == () and s.warnings == [] and s.summary() is None
    assert list(s.videos) == ["left_camera"]


def test_server_layout_reads_meta_record(tmp_path: Path) -> None:
    run = server_run_dir(tmp_path, "ebench", "s1")
    ep = write_server_episode(run, "ebench/k/open", "0", steps=6, robot_id=PANDA, cameras=())
    s = load_series(ep)
    assert s.layout == "server" and s.source.name == "meta_record.pkl"
    assert s.robot is not None and s.robot.robot_id == PANDA
    assert s.instruction == "open the drawer"
    # record i: the action of step i and the state after it (timestep i + 1)
    assert s.state_t.tolist() == [1, 2, 3, 4, 5, 6] and s.action_t.tolist() == list(range(6))
    assert s.state["joints"].shape == (6, 7) and s.state["gripper"].shape == (6, 2)
    assert s.action.shape == (6, 9) and s.control_type == "joint_position"
    assert s.frame_timesteps == {j: j for j in range(7)} and s.frames_required == 6
    assert s.latency_t.size == 0 and s.latency_ms == {}
    assert s.issues == ()


def test_episode_info_is_accepted_without_a_rescan(tmp_path: Path) -> None:
    ep = write_client_episode(tmp_path / "b" / "r", "t/a", "0", steps=3, videos=False)
    info = load_episode(ep)
    s = load_series(info)
    assert s.path == ep and s.n_steps == 3 and s.videos == {}


# --------------------------------------------------------------------------- missing files


def test_missing_recording_and_missing_directory(tmp_path: Path) -> None:
    ep = tmp_path / "res" / "b" / "r" / "t" / "0"
    ep.mkdir(parents=True)
    (ep / "result.json").write_text('{"score": 1.0, "sr": 1.0}')
    with pytest.raises(SeriesNotFoundError, match=r"no steps\.jsonl or meta_record\.pkl"):
        load_series(ep)
    with pytest.raises(SeriesNotFoundError, match="not a directory"):
        load_series(tmp_path / "nope")
    assert issubclass(SeriesNotFoundError, SeriesError)
    assert issubclass(SeriesError, GenmanipResultsError)


def test_empty_steps_file_is_an_empty_series(tmp_path: Path) -> None:
    s = load_series(_episode(tmp_path, ""))
    assert s.n_steps == 0 and s.state_t.size == 0 and s.rows == 0
    assert s.action.shape == (0, 0) and s.state == {} and s.issues == ()
    assert s.t_range == (0, 1)


def test_recording_gone_since_the_discovery(tmp_path: Path) -> None:
    ep = _episode(tmp_path, _lines(_row(0)))
    info = load_episode(ep)
    (ep / "steps.jsonl").unlink()
    (ep / "steps.jsonl").mkdir()  # still listed by the old EpisodeInfo, no longer a file
    with pytest.raises(SeriesNotFoundError):
        load_series(info)


# --------------------------------------------------------------------------- the bad-row policy


def test_ragged_row_is_kept_as_a_gap_and_reported(tmp_path: Path) -> None:
    act5 = {"control_type": "joint_position", "action": [0.0] * 5}
    s = load_series(_episode(tmp_path, _lines(_row(0), _row(1), _row(2, action=act5), _row(3))))
    assert s.action_t.tolist() == [0, 1, 2, 3] and s.action.shape == (4, 9)
    assert np.isnan(s.action[2]).all()
    assert np.isfinite(np.delete(s.action, 2, axis=0)).all()
    assert s.state["joints"].shape == (4, 7) and np.isfinite(s.state["joints"]).all()
    assert s.frame_timesteps == {0: 0, 1: 1, 2: 2, 3: 3}  # the row's frame is still used
    (issue,) = s.issues
    assert issue == SeriesIssue(
        "ragged",
        "steps.jsonl",
        3,
        "action.action",
        "5 values where the episode's rows have 9 (first on line 1); kept as a gap",
        skipped=False,
    )
    assert s.issue_counts() == {"ragged": 1} and s.skipped_rows == 0
    assert s.summary() == (
        "steps.jsonl: 1 of 4 rows with problems (1 ragged): 0 skipped, 1 kept with gaps"
    )


def test_one_bad_first_row_does_not_define_the_width(tmp_path: Path) -> None:
    rows = [_row(0, state={"joints": [0.0] * 3, "gripper": [0.0] * 2, "base": [0.0] * 3})]
    rows += [_row(i) for i in range(1, 4)]
    s = load_series(_episode(tmp_path, _lines(*rows)))
    assert s.state["joints"].shape == (4, 7) and np.isnan(s.state["joints"][0]).all()
    assert [(i.kind, i.line, i.field) for i in s.issues] == [("ragged", 1, "state.joints")]
    assert "first on line 2" in s.issues[0].message


def test_corrupt_json_lines_are_skipped_and_reported(tmp_path: Path) -> None:
    raw = _lines(_row(0), "not json", "[1, 2]", _row(1)).encode() + b"\xff\xfe\n\n\n"
    s = load_series(_episode(tmp_path, raw))
    assert s.action_t.tolist() == [0, 1]
    kinds = [(i.kind, i.line, i.skipped) for i in s.issues]
    assert kinds == [("unreadable", 2, True), ("unreadable", 3, True), ("unreadable", 5, True)]
    assert s.warnings[0].startswith("steps.jsonl:2: not JSON")
    assert "expected a JSON object per line, got list" in s.warnings[1]
    assert "not UTF-8" in s.warnings[2]
    assert s.rows == 5 and s.skipped_rows == 3


def test_cut_last_line_is_partial_while_recording_else_unreadable(tmp_path: Path) -> None:
    text = _lines(_row(0), _row(1)) + '{"step": 2, "obs_ti'
    done = load_series(_episode(tmp_path / "a", text))
    assert [(i.kind, i.line) for i in done.issues] == [("unreadable", 3)]
    live = load_series(_episode(tmp_path / "b", text, incomplete=True))
    assert [(i.kind, i.line) for i in live.issues] == [("partial", 3)]
    assert live.warnings == ["steps.jsonl:3: row still being written; ignored"]
    assert live.n_steps == done.n_steps == 2


def test_rows_that_cannot_be_placed_are_skipped(tmp_path: Path) -> None:
    rows = [_row(0), _row(1), {**_row(2), "step": "two"}, _row(1), {**_row(3), "step": -1}]
    s = load_series(_episode(tmp_path, _lines(*rows)))
    assert s.action_t.tolist() == [0, 1] and s.skipped_rows == 3
    assert [(i.kind, i.line, i.field) for i in s.issues] == [
        ("invalid", 3, "step"),
        ("conflict", 4, None),
        ("invalid", 5, "step"),
    ]
    assert "step 1 already recorded on line 2 (rows of two attempts mixed?)" in s.warnings[1]


def test_bad_fields_are_gaps_or_ignored_never_fatal(tmp_path: Path) -> None:
    rows = [
        _row(0),
        _row(1, action={"control_type": "joint_position", "action": [0.0] * 8 + ["x"]}),
        _row(2, state={"joints": [0.0] * 7, "gripper": None, "base": [0.0] * 3}),
        _row(3, obs_timestep=9),  # after its own step: state and frame unusable
        _row(4, frame=2),  # frame 2 is timestep 2 already
        _row(5, action={"control_type": "warp", "action": [0.0] * 9}),
        _row(6, latency_ms={"network": "fast"}),
        _row(7, robot_id="manip/other/robot"),
        _row(8, action={"control_type": "ee_pose", "action": [[0.0] * 3, [1.0, 0, 0, 0], [0.0]]}),
        _row(9, action={**_row(9)["action"], "base_motion": [1.0, 2.0]}),
    ]
    s = load_series(_episode(tmp_path, _lines(*rows)))
    assert s.action_t.tolist() == list(range(10)) and s.skipped_rows == 0
    assert s.robot_id == PANDA and s.control_type == "joint_position"
    nan_rows = [i for i in range(10) if np.isnan(s.action[i]).all()]
    assert nan_rows == [1, 5, 8]
    assert s.state_t.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]  # row 3's state is not used
    assert np.isnan(s.state["gripper"][2]).all() and np.isfinite(s.state["joints"]).all()
    assert 3 not in s.frame_timesteps and s.frame_timesteps[2] == 2
    assert s.base_motion is not None and np.isnan(s.base_motion[9]).all()
    assert s.latency_t.tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    by_line = {i.line: (i.kind, i.field) for i in s.issues}
    assert by_line == {
        2: ("invalid", "action.action[8]"),
        3: ("invalid", "state.gripper"),
        4: ("invalid", "obs_timestep"),
        5: ("conflict", "frame"),
        6: ("invalid", "action.control_type"),
        7: ("invalid", "latency_ms.network"),
        8: ("conflict", "robot_id"),
        9: ("conflict", "action.control_type"),
        10: ("invalid", "action.base_motion"),
    }
    assert all(str(i).startswith(f"steps.jsonl:{i.line}: ") for i in s.issues)


def test_warnings_are_capped_but_counted(tmp_path: Path) -> None:
    act = {"control_type": "joint_position", "action": [0.0]}
    rows = [_row(i) for i in range(40)] + [_row(40 + i, action=act) for i in range(30)]
    s = load_series(_episode(tmp_path, _lines(*rows)))
    assert len(s.issues) == 30 and len(s.warnings) == 21
    assert s.warnings[-1].startswith("... and 10 more (steps.jsonl: 30 of 70 rows")


def test_fuzzed_rows_never_raise(tmp_path: Path) -> None:
    """Whatever a row holds, loading reports it; only whole-file problems raise."""
    rng = random.Random(7)
    junk: list[Any] = [None, "x", -1, 1.5, [], {}, [1, "a"], True, 10**400, [[1.0]], {"a": 1}]
    base = [_row(i) for i in range(5)]
    for k in range(150):
        rows = json.loads(json.dumps(base))
        row = rows[rng.randrange(len(rows))]
        key = rng.choice(list(row))
        row[key] = rng.choice(junk)
        if isinstance(row.get("action"), dict) and rng.random() < 0.5:
            row["action"]["action"] = rng.choice(junk)
        data = bytearray(_lines(*rows).encode())
        for _ in range(rng.randint(0, 2)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        s = load_series(_episode(tmp_path / str(k), bytes(data)))
        assert s.action.shape[0] == s.action_t.shape[0] == s.n_steps <= 5
        assert all(v.shape[0] == s.state_t.shape[0] for v in s.state.values())
        assert all(i.kind in ISSUE_KINDS and "\n" not in str(i) for i in s.issues)


# --------------------------------------------------------------------------- meta_record.pkl


def _server_episode(tmp_path: Path, meta: object) -> Path:
    ep = write_server_episode(
        server_run_dir(tmp_path, "ebench", "s1"), "ebench/k/open", "0", steps=3, robot_id=PANDA,
        cameras=(),
    )  # fmt: skip
    (ep / "meta_record.pkl").write_bytes(pickle.dumps(meta, protocol=4))
    return ep


def test_meta_record_goes_through_the_allow_list(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {sentinel}",))

    ep = _server_episode(tmp_path, {"joint_positions": [Evil()]})
    with pytest.raises(SeriesError, match=r"meta_record\.pkl") as ei:
        load_series(ep)
    assert isinstance(ei.value.__cause__, UnsafePayloadError)
    assert not sentinel.exists()


@pytest.mark.parametrize("data", [b"", b"\x80\x05garbage", pickle.dumps([1, 2])])
def test_corrupt_or_foreign_meta_record_raises(tmp_path: Path, data: bytes) -> None:
    ep = _server_episode(tmp_path, None)
    (ep / "meta_record.pkl").write_bytes(data)
    with pytest.raises(SeriesError, match=r"^meta_record\.pkl: "):
        load_series(ep)


def test_meta_record_ragged_records_are_gaps(tmp_path: Path) -> None:
    meta = {
        "joint_positions": [np.zeros(7), np.zeros(6), np.zeros(7), "bad"],
        "gripper_positions": [np.zeros(2)] * 3,  # one record short
        "model_output": [{"arm_action": np.zeros(9)}] * 3 + [{"no": "arm"}],
        "robot_id": PANDA,
        "instruction": "x",
    }
    s = load_series(_server_episode(tmp_path, meta))
    assert s.state_t.tolist() == [1, 2, 3, 4] and s.state["joints"].shape == (4, 7)
    assert [bool(np.isnan(r).all()) for r in s.state["joints"]] == [False, True, False, True]
    assert np.isnan(s.state["gripper"][3]).all()
    assert s.action.shape == (4, 9) and np.isnan(s.action[3]).all()
    assert {(i.kind, i.line, i.field) for i in s.issues} == {
        ("ragged", 1, "joint_positions"),
        ("invalid", 3, "joint_positions[3]"),
        ("ragged", None, "gripper_positions"),
        ("invalid", 3, "model_output[3]"),
    }
    assert "first on record 0" in next(i.message for i in s.issues if i.line == 1)


def test_meta_record_missing_parts_are_reported(tmp_path: Path) -> None:
    s = load_series(_server_episode(tmp_path, {"robot_id": PANDA, "joint_positions": "abc"}))
    assert s.state == {} and s.n_steps == 0
    assert {(i.kind, i.field) for i in s.issues} == {
        ("invalid", "joint_positions"),
        ("invalid", "gripper_positions"),
    }


# --------------------------------------------------------------------------- cameras


def test_camera_order_puts_known_cameras_first_and_drops_generated() -> None:
    vids = {
        n: Path(f"{n}.mp4")
        for n in ("zeta", "right_camera", "merged_with_plot", "left_camera", "merged_ab12cd34")
    }
    assert list(order_cameras(vids)) == ["left_camera", "right_camera", "zeta"]
