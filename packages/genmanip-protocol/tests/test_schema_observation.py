from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec, Observation
from genmanip_protocol.errors import ValidationError
from genmanip_protocol.robots import ROBOTS, RobotSpec, get_robot
from genmanip_protocol.schema import (
    check_observation,
    parse_chunk_response,
    parse_metric,
    parse_step_response,
    validate_action,
    validate_observation,
)

LIFT2 = get_robot("manip/lift2/R5a")
PANDA = get_robot("manip/franka/panda_hand")


def make_obs(spec: RobotSpec, *, frames: str = "array") -> dict[str, Any]:
    """An observation shaped exactly like the real server's for ``spec``."""
    if spec.dual_arm:
        ee: Any = [[np.zeros(3, np.float32), np.array([1, 0, 0, 0], np.float32)]] * 2
        base: Any = np.zeros(3, np.float32)
    else:
        ee = [np.zeros(3, np.float32), np.array([1, 0, 0, 0], np.float32)]
        base = [0.0, 0.0, 0.0]  # single-arm servers send a plain list
    obs: dict[str, Any] = {
        "instruction": "put the cup on the plate",
        "state.joints": np.zeros(spec.joints_dim, np.float32),
        "state.gripper": np.zeros(spec.gripper_dim, np.float32),
        "state.base": base,
        "state.ee_pose": ee,
        "timestep": 0,
        "reset": True,
        "episode_id": "ebench/run/ebench/table_top/t/000",
        "robot_id": spec.robot_id,
    }
    for cam, shape in spec.cameras.items():
        img = np.zeros(shape, np.uint8)
        obs[f"video.{cam}"] = JpegFrame.encode(img) if frames == "jpeg" else img
    return obs


@pytest.mark.parametrize("spec", list(ROBOTS.values()), ids=list(ROBOTS))
def test_real_shaped_observation_is_valid(spec: RobotSpec) -> None:
    obs = make_obs(spec)
    assert check_observation(spec, obs) == []
    assert check_observation(None, obs, strict=True) == []  # robot from obs["robot_id"]
    assert validate_observation(spec, obs) is obs


def test_jpeg_frames_count_by_declared_shape_without_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    obs = Observation(make_obs(LIFT2, frames="jpeg"))

    def boom(self: JpegFrame) -> np.ndarray:
        raise AssertionError("validation must not decode frames")

    monkeypatch.setattr(JpegFrame, "decode", boom)
    assert check_observation(LIFT2, obs, strict=True) == []
    assert all(obs.is_encoded(k) for k in obs.cameras)


def test_missing_and_wrong_types() -> None:
    obs = make_obs(PANDA)
    del obs["instruction"]
    obs["timestep"] = 1.5
    obs["reset"] = "no"
    obs["state.joints"] = np.zeros(7, np.float64)
    obs["state.gripper"] = np.zeros(3, np.float32)
    obs["state.base"] = [0.0, 0.0]
    vs = check_observation(PANDA, obs, worker=1, step=4)
    got = {(v.field, v.actual) for v in vs}
    assert got == {
        ("instruction", "missing"),
        ("timestep", "float 1.5"),
        ("reset", "str 'no'"),
        ("state.joints", "dtype float64"),
        ("state.gripper", "numpy array of shape (3,)"),
        ("state.base", "2 values"),
    }
    assert all(v.worker == "1" and v.step == 4 for v in vs)
    with pytest.raises(ValidationError) as ei:
        validate_observation(PANDA, obs)
    assert len(ei.value.violations) == 6


def test_cameras() -> None:
    obs = make_obs(LIFT2)
    obs["video.top_camera_view"] = np.zeros((480, 640, 3), np.uint8)  # top is 720x1280
    obs["video.left_camera_view"] = np.zeros((480, 640, 3), np.float32)
    obs["video.front_view"] = np.zeros((10, 10, 3), np.uint8)
    del obs["video.right_camera_view"]  # absent cameras are fine (--without_render)
    vs = check_observation(LIFT2, obs)
    assert {(v.field, v.actual) for v in vs} == {
        ("video.top_camera_view", "shape (480, 640, 3)"),
        ("video.left_camera_view", "dtype float32"),
    }
    strict = check_observation(LIFT2, obs, strict=True)
    assert ("video.front_view", "an unknown camera") in {(v.field, v.actual) for v in strict}
    obs2 = make_obs(LIFT2)
    obs2["video.left_camera_view"] = b"jpeg?"
    assert [v.field for v in check_observation(LIFT2, obs2)] == ["video.left_camera_view"]


def test_robot_mismatch_and_unknown_keys() -> None:
    obs = make_obs(PANDA)
    obs["robot_id"] = "manip/lift2/R5a"
    assert [(v.field, v.expected) for v in check_observation(PANDA, obs)] == [
        ("robot_id", "manip/franka/panda_hand (or one of its aliases)")
    ]
    obs = make_obs(PANDA)
    obs["robot_id"] = "franka"  # an alias of the same robot is fine
    obs["extra"] = 1
    assert check_observation(PANDA, obs) == []
    assert [v.field for v in check_observation(PANDA, obs, strict=True)] == ["extra"]
    obs["robot_id"] = "spaceship"
    assert [v.field for v in check_observation(None, obs)] == ["robot_id"]


def test_ee_pose_and_episode_id() -> None:
    obs = make_obs(LIFT2)
    obs["state.ee_pose"] = [[np.zeros(3), np.zeros(4)]]
    obs["episode_id"] = "../../etc/passwd"
    vs = check_observation(LIFT2, obs)
    assert {v.field for v in vs} == {"state.ee_pose", "episode_id"}
    obs = make_obs(PANDA)
    obs["state.ee_pose"] = [np.zeros(3), np.zeros(5)]
    assert [v.field for v in check_observation(PANDA, obs)] == ["state.ee_pose[1]"]


def test_not_a_mapping() -> None:
    assert [v.field for v in check_observation(PANDA, [1, 2])] == ["obs"]
    # the reset-pending placeholder is not an observation
    assert len(check_observation(PANDA, {"reset": True, "reset_pending": True})) > 3


# ---- replies built like the real server's, through the real codecs, then parsed and validated

METRIC = {"*(1/60)ebench/t": {"score": 1.0, "sr": 1.0}, "*ebench/u": {"score": 0.0, "sr": 0.0}}
RESULT = {
    "episode_id": "ebench/run/ebench/t/000",
    "task_name": "ebench/t",
    "seed": "000",
    "score": 1.0,
    "sr": 1.0,
}


@pytest.fixture(params=["legacy", "msgpack"])
def codec(request: pytest.FixtureRequest) -> Any:
    return LegacyCodec() if request.param == "legacy" else MsgpackCodec()


def test_step_reply_roundtrip(codec: Any) -> None:
    obs = make_obs(LIFT2, frames="jpeg")
    reply = {
        "0": {"obs": obs, "metric": METRIC, "episode_result": RESULT},
        "1": {
            "obs": {"reset": True, "reset_pending": True},
            "metric": METRIC,
            "episode_result": None,
            "reset_pending": True,
        },
        "2": {"obs": None, "metric": METRIC, "episode_result": None},
    }
    entries = parse_step_response(codec.decode(codec.encode(reply)), ["0", "1", "2"])
    e0 = entries["0"]
    assert e0.obs is not None and check_observation(LIFT2, e0.obs, strict=True) == []
    assert e0.episode_result is not None and e0.episode_result.success
    assert entries["1"].reset_pending and entries["1"].obs is None
    assert entries["2"].finished
    assert parse_metric(e0.metric)["ebench/t"].done == 1


def test_chunk_reply_roundtrip(codec: Any) -> None:
    reply = {
        "obs": {"0": {"obs": make_obs(LIFT2), "metric": METRIC, "episode_result": None}},
        "executed_steps": 4,
        "stopped_early": False,
    }
    cr = parse_chunk_response(codec.decode(codec.encode(reply)), ["0"])
    assert cr.executed_steps == 4 and not cr.stopped_early
    assert check_observation(LIFT2, cr.entries["0"].obs) == []


def test_normalized_action_survives_legacy_wire() -> None:
    import numpy as np

    act = validate_action(
        LIFT2, {"action": np.linspace(0, 1, 16, dtype=np.float32), "control_type": "joint_position"}
    )
    body = LegacyCodec().encode({"0": act})
    assert LegacyCodec().decode(body) == {"0": act}
