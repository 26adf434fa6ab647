from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from genmanip_artifacts import EpisodeDataError, load_series
from genmanip_artifacts.episode import order_cameras
from genmanip_artifacts.panels import LEFT_STYLE, RIGHT_STYLE, action_panels, state_panels


def _episode(tmp_path: Path, rows: list[object] | str, *, result: dict | None = None) -> Path:
    run = tmp_path / "res" / "bench" / "r1"
    ep = run / "bench" / "t" / "000"
    ep.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "benchmark": "bench"}))
    text = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
    (ep / "steps.jsonl").write_text(text)
    if result is not None:
        (ep / "result.json").write_text(json.dumps(result))
    return ep


def _row(
    step: int,
    *,
    robot: str = "manip/franka/panda_hand",
    obs: int | None = None,
    frame: object = "auto",
    state: object = "auto",
    action: object = None,
) -> dict:
    obs = step if obs is None else obs
    frame = obs if frame == "auto" else frame
    if state == "auto":
        state = {"joints": [0.1 * step] * 7, "gripper": [0.04, 0.04], "base": [0.0, 0.0, 0.0]}
    return {
        "episode_id": "bench/r1/bench/t/000",
        "worker_id": "0",
        "robot_id": robot,
        "step": step,
        "obs_timestep": obs,
        "frame": frame,
        "state": state,
        "action": action
        if action is not None
        else {"control_type": "joint_position", "action": [0.01 * step] * 9, "is_rel": False},
        "chunk": None,
        "latency_ms": None,
    }


def test_chunked_client_episode_aligns_frames_by_obs_timestep(lift2_episode: Path) -> None:
    s = load_series(lift2_episode)
    assert s.layout == "client"
    assert s.robot is not None and s.robot.robot_id == "manip/lift2/R5a"
    assert s.n_steps == 48
    # One observation (with state) per chunk of 4 steps: timesteps 0, 4, ..., 44.
    assert s.state_t.tolist() == list(range(0, 48, 4))
    assert s.action_t.tolist() == list(range(48))
    assert s.state["joints"].shape == (12, 12)
    assert s.state["gripper"].shape == (12, 4)
    assert s.state["base"].shape == (12, 3)
    assert s.action.shape == (48, 16)
    assert s.frame_timesteps == {j: 4 * j for j in range(12)}
    assert s.base_motion is not None and s.base_motion.shape == (48, 3)
    assert s.is_rel is False and s.base_is_rel is True
    assert s.instruction == "pick up the red block and place it in the bowl"
    assert list(s.videos) == ["left_camera", "top_camera", "overlook_camera", "right_camera"]


def test_server_episode_reads_meta_record_through_allow_list(franka_server_episode: Path) -> None:
    s = load_series(franka_server_episode)
    assert s.layout == "server"
    assert s.robot is not None and s.robot.robot_id == "manip/franka/panda_hand"
    assert s.state["joints"].shape == (20, 7)
    assert s.state["gripper"].shape == (20, 2)
    assert s.action.shape == (20, 9)
    assert s.instruction == "insert the peg"
    # Row i is the state after step i (timestep i + 1); frame 0 is the reset observation.
    assert s.state_t.tolist() == list(range(1, 21))
    assert s.action_t.tolist() == list(range(20))
    assert s.frame_timesteps == {i: i for i in range(21)}
    assert s.frames_required == 20
    assert sorted(s.videos) == ["obs_camera", "realsense"]


def test_malicious_meta_record_is_refused_and_not_executed(
    franka_server_episode: Path, tmp_path: Path
) -> None:
    sentinel = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {sentinel}",))

    (franka_server_episode / "meta_record.pkl").write_bytes(
        pickle.dumps({"joint_positions": Evil()})
    )
    with pytest.raises(EpisodeDataError, match=r"meta_record\.pkl"):
        load_series(franka_server_episode)
    assert not sentinel.exists()


def test_unknown_robot_plots_every_dimension(tmp_path: Path) -> None:
    rows = [
        _row(
            i,
            robot="acme/arm9",
            state={"joints": [float(i)] * 9, "grip": [0.5]},
            action={"control_type": "joint_position", "action": [0.0] * 10},
        )
        for i in range(5)
    ]
    s = load_series(_episode(tmp_path, rows))
    assert s.robot is None and s.robot_id == "acme/arm9"
    assert any("unknown robot" in w for w in s.warnings)
    sp = state_panels(s)
    assert {p.title for p in sp} == {"state joints (all 9 dims)", "state grip (all 1 dims)"}
    assert sum(len(p.lines) for p in sp) == 10
    ap = action_panels(s)
    assert sum(len(p.lines) for p in ap) == 10


def test_dual_arm_panels_left_solid_right_dashed(lift2_episode: Path) -> None:
    s = load_series(lift2_episode)
    sp = state_panels(s)
    assert [p.ylabel for p in sp] == [
        "joint position (rad)",
        "gripper (m)",
        "position (m)",
        "yaw (rad)",
    ]
    joints = sp[0]
    assert len(joints.lines) == 12
    assert {ln.style for ln in joints.lines if ln.label.startswith("left")} == {LEFT_STYLE}
    assert {ln.style for ln in joints.lines if ln.label.startswith("right")} == {RIGHT_STYLE}
    np.testing.assert_allclose(joints.lines[6].y, s.state["joints"][:, 6])  # right joint0
    ap = action_panels(s)
    assert [p.ylabel for p in ap] == [
        "joint target (rad)",
        "gripper target (m)",
        "position (m)",
        "yaw (deg)",
    ]
    # Right-arm joints are action[8:14] for a dual-arm robot (gripper of the left arm in between).
    np.testing.assert_allclose(ap[0].lines[6].y, s.action[:, 8])
    assert "relative" in ap[2].title


def test_single_arm_panels(tmp_path: Path) -> None:
    s = load_series(_episode(tmp_path, [_row(i) for i in range(4)]))
    assert [p.title for p in state_panels(s)] == ["state: arm joints", "state: gripper"]
    assert [p.ylabel for p in action_panels(s)] == ["joint target (rad)", "gripper target (m)"]
    assert len(action_panels(s)[0].lines) == 7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no steps recorded"),
        ('{"step": 0\n', r"steps.jsonl:1: not JSON"),
        ("[1, 2]\n", r"steps.jsonl:1: expected a JSON object"),
    ],
)
def test_corrupt_steps_file_one_line_error(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(EpisodeDataError, match=message) as exc:
        load_series(_episode(tmp_path, content))
    assert "\n" not in str(exc.value)


def test_ragged_row_is_a_reported_gap_not_an_error(tmp_path: Path) -> None:
    """The one bad-row policy (genmanip_results.series): the row keeps its place, its bad vector
    is NaN, and the warning names file, line, field and the episode's width."""
    rows = [
        _row(0),
        _row(1),
        _row(2, action={"control_type": "joint_position", "action": [0.0] * 5}),
        _row(3, action={"control_type": "joint_position", "action": [0.0] * 8 + ["x"]}),
    ]
    s = load_series(_episode(tmp_path, rows))
    assert s.action_t.tolist() == [0, 1, 2, 3] and s.action.shape == (4, 9)
    assert np.isnan(s.action[2]).all() and np.isnan(s.action[3]).all()
    assert np.isfinite(s.action[:2]).all()
    assert s.state["joints"].shape == (4, 7)  # the bad rows' states are still used
    assert s.warnings == [
        "steps.jsonl:3: action.action: 5 values where the episode's rows have 9 (first on line 1); "
        "kept as a gap",
        "steps.jsonl:4: action.action[8]: expected a number, got str 'x'; kept as a gap",
    ]
    assert s.issue_counts() == {"invalid": 1, "ragged": 1} and s.skipped_rows == 0
    # the panels still get every dimension (a gap in two of the rows)
    assert len(action_panels(s)[0].lines) == 7


def test_wrong_dimension_for_known_robot(tmp_path: Path) -> None:
    rows = [_row(0, state={"joints": [0.0] * 6, "gripper": [0.0, 0.0], "base": [0.0] * 3})]
    with pytest.raises(
        EpisodeDataError,
        match=r"state.joints: expected 7 values for manip/franka/panda_hand, got 6",
    ):
        load_series(_episode(tmp_path, rows))


def test_mixed_attempts_are_reported_not_merged(tmp_path: Path) -> None:
    rows = [_row(0), _row(1), _row(0)]
    s = load_series(_episode(tmp_path, rows))
    assert s.action_t.tolist() == [0, 1] and s.skipped_rows == 1
    assert s.warnings == [
        "steps.jsonl:3: step 0 already recorded on line 1 (rows of two attempts mixed?); "
        "row skipped"
    ]


def test_conflicting_frame_reference(tmp_path: Path) -> None:
    rows = [_row(0, frame=0), _row(1, frame=0)]
    s = load_series(_episode(tmp_path, rows))
    assert s.frame_timesteps == {0: 0}
    assert s.warnings == [
        "steps.jsonl:2: frame: frame 0 is observation timestep 1 here but 0 on line 1; ignored"
    ]
    assert [i.kind for i in s.issues] == ["conflict"]


def test_bad_field_types_are_named(tmp_path: Path) -> None:
    with pytest.raises(
        EpisodeDataError, match=r"steps.jsonl:1: step: expected a non-negative integer"
    ):
        load_series(_episode(tmp_path, [{**_row(0), "step": "zero"}]))
    with pytest.raises(EpisodeDataError, match=r"action.action\[3\]: expected a number"):
        load_series(_episode(tmp_path / "b", [_row(0, action={"action": [0, 0, 0, "x"]})]))


def test_no_recording_at_all(tmp_path: Path) -> None:
    ep = tmp_path / "res" / "bench" / "r1" / "bench" / "t" / "000"
    ep.mkdir(parents=True)
    (ep / "result.json").write_text(json.dumps({"score": 1.0, "sr": 1.0}))
    with pytest.raises(EpisodeDataError, match=r"no steps\.jsonl or meta_record\.pkl"):
        load_series(ep)


def test_camera_order_puts_known_cameras_first_and_drops_generated() -> None:
    vids = {
        n: Path(f"{n}.mp4")
        for n in ("zeta", "right_camera", "merged_with_plot", "left_camera", "merged_ab12cd34")
    }
    assert list(order_cameras(vids)) == ["left_camera", "right_camera", "zeta"]


def test_row_being_written_is_skipped_only_while_recording(tmp_path: Path) -> None:
    text = json.dumps(_row(0)) + "\n" + json.dumps(_row(1)) + "\n" + '{"step": 2, "obs_ti'
    ep = _episode(tmp_path, text)
    s = load_series(ep)  # a finished episode: the cut line is corruption (reported, skipped)
    assert s.n_steps == 2
    assert [(i.kind, i.line) for i in s.issues] == [("unreadable", 3)]
    assert s.warnings[0].startswith("steps.jsonl:3: not JSON")
    (ep / "INCOMPLETE").write_text("")
    s = load_series(ep)
    assert s.n_steps == 2
    assert s.warnings == ["steps.jsonl:3: row still being written; ignored"]
    assert [i.kind for i in s.issues] == ["partial"]


def test_ee_pose_actions_dual_and_single(tmp_path: Path) -> None:
    pose = [[0.3, 0.0, 0.2], [1.0, 0.0, 0.0, 0.0], [0.044, 0.044]]
    dual_rows = [
        _row(i, robot="manip/lift2/R5a",
             state={"joints": [0.0] * 12, "gripper": [0.0] * 4, "base": [0.0] * 3},
             action={"control_type": "ee_pose", "action": [pose, pose], "is_rel": True})
        for i in range(3)
    ]  # fmt: skip
    s = load_series(_episode(tmp_path / "d", dual_rows))
    assert s.control_type == "ee_pose" and s.action.shape == (3, 18)
    ap = action_panels(s)
    assert [p.ylabel for p in ap][:3] == ["position (m)", "quaternion w,x,y,z", "gripper (m)"]
    assert "relative" in ap[0].title
    assert [ln.label for ln in ap[1].lines][:4] == ["left w", "left x", "left y", "left z"]
    np.testing.assert_allclose(ap[0].lines[3].y, [0.3, 0.3, 0.3])  # right arm x
    single = [_row(i, action={"control_type": "ee_pose", "action": pose}) for i in range(3)]
    s1 = load_series(_episode(tmp_path / "s", single))
    assert s1.action.shape == (3, 9)
    assert [len(p.lines) for p in action_panels(s1)] == [3, 4, 2]
