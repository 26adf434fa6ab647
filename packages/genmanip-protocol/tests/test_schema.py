from __future__ import annotations

import pickle
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import pytest
from genmanip_protocol.errors import ExitCode, ResponseError, ValidationError, Violation
from genmanip_protocol.robots import ROBOTS, get_robot
from genmanip_protocol.schema import (
    EpisodeResult,
    MetricKey,
    check_action,
    is_success,
    merge_metrics,
    parse_chunk_response,
    parse_episode_result,
    parse_metric,
    parse_metric_key,
    parse_status,
    parse_step_response,
    parse_success_response,
    parse_worker_entry,
    safe_relative_path,
    split_episode_id,
    validate_action,
    validate_chunk,
)
from hypothesis import given
from hypothesis import strategies as st

LIFT2 = get_robot("manip/lift2/R5a")
PANDA = get_robot("manip/franka/panda_hand")
ROBOTIQ = get_robot("manip/franka/robotiq")


def jp(n: int, **extra: Any) -> dict[str, Any]:
    return {"action": [0.0] * n, "control_type": "joint_position", **extra}


def ee_arm(grip: int) -> list[list[float]]:
    return [[0.3, 0.0, 0.2], [1.0, 0.0, 0.0, 0.0], [0.04] * grip]


# ---------------------------------------------------------------- actions


@pytest.mark.parametrize("spec", list(ROBOTS.values()), ids=list(ROBOTS))
def test_joint_position_ok_for_every_robot(spec: Any) -> None:
    out = validate_action(spec, jp(spec.action_dim))
    assert out["action"] == [0.0] * spec.action_dim
    assert out["control_type"] == "joint_position"
    assert "is_rel" not in out  # absent: the server flag decides
    if spec.dual_arm:
        assert out["base_motion"] == [0.0, 0.0, 0.0] and out["base_is_rel"] is True
    else:
        assert "base_motion" not in out and "base_is_rel" not in out


def test_wrong_length_message_is_exact() -> None:
    with pytest.raises(ValidationError) as ei:
        validate_action(LIFT2, jp(9), worker=0, step=12)
    assert str(ei.value) == (
        "worker 0, step 12: action: expected 16 finite floats "
        "(joint_position for manip/lift2/R5a), got 9 values"
    )
    v = ei.value.violations[0]
    assert (v.field, v.worker, v.step, v.actual) == ("action", "0", 12, "9 values")
    assert ei.value.exit_code == ExitCode.INVALID_INPUT


def test_normalized_copy_is_plain_python_and_independent() -> None:
    arr = np.arange(16, dtype=np.float32)
    src = {
        "action": arr,
        "control_type": "joint_position",
        "is_rel": np.bool_(True),
        "base_motion": (0.01, 0, 1),
        "base_is_rel": False,
    }
    out = validate_action("lift2", src)
    assert out == {
        "action": [float(x) for x in range(16)],
        "control_type": "joint_position",
        "is_rel": True,
        "base_motion": [0.01, 0.0, 1.0],
        "base_is_rel": False,
    }
    assert all(type(x) is float for x in out["action"])
    assert type(out["is_rel"]) is bool
    assert list(out) == ["action", "control_type", "is_rel", "base_motion", "base_is_rel"]
    arr[0] = 99.0
    assert out["action"][0] == 0.0
    # pickles to builtins only
    assert b"numpy" not in pickle.dumps(out)


def test_every_violation_is_reported() -> None:
    bad = {
        "action": [0.0, float("nan"), "x", float("inf")] + [0.0] * 5,
        "control_type": "joint_position",
        "is_rel": 1,
        "base_motion": [0, 0],
        "speed": 3,
    }
    vs = check_action(PANDA, bad, worker="w1", step=3)
    got = {(v.field, v.expected, v.actual) for v in vs}
    assert (
        "speed",
        "only the keys action, control_type, is_rel, base_motion, base_is_rel",
        "unknown key 'speed'",
    ) in got
    assert ("is_rel", "a bool", "int 1") in got
    assert ("action[1]", "a finite float", "nan") in got
    assert ("action[2]", "a finite float", "str 'x'") in got
    assert ("action[3]", "a finite float", "inf") in got
    assert ("base_motion", "3 finite floats (x m, y m, yaw degrees)", "2 values") in got
    assert len(vs) == 6
    assert all(v.worker == "w1" and v.step == 3 for v in vs)


def test_missing_keys_and_bad_control_type() -> None:
    vs = check_action(PANDA, {})
    assert {(v.field, v.actual) for v in vs} == {("action", "missing"), ("control_type", "missing")}
    vs = check_action(PANDA, {"action": [0.0] * 9, "control_type": "velocity"})
    assert [(v.field, v.expected, v.actual) for v in vs] == [
        ("control_type", "one of joint_position, ee_pose", "str 'velocity'")
    ]
    vs = check_action(PANDA, [0.0] * 9)
    assert [(v.field, v.actual) for v in vs] == [("action_dict", "list of 9 values")]


@pytest.mark.parametrize(
    ("value", "actual"),
    [
        (np.zeros((1, 9)), "numpy array of shape (1, 9)"),
        (np.array(["a"] * 9), "numpy array of dtype <U1"),
        ([[0.0] * 9], "a nested sequence of 1 items"),
        ("000000000", "str '000000000'"),
        (None, "None"),
        ([True] + [0.0] * 8, None),
    ],
)
def test_joint_vector_shapes(value: Any, actual: str | None) -> None:
    vs = check_action(PANDA, {"action": value, "control_type": "joint_position"})
    assert len(vs) == 1
    if actual is None:
        assert (vs[0].field, vs[0].actual) == ("action[0]", "bool True")
    else:
        assert (vs[0].field, vs[0].actual) == ("action", actual)


def test_many_bad_elements_are_capped() -> None:
    vs = check_action(LIFT2, {"action": [float("nan")] * 16, "control_type": "joint_position"})
    assert len(vs) == 9
    assert vs[-1].field == "action" and vs[-1].actual == "16 bad values in total"


def test_ee_pose_single_and_dual() -> None:
    out = validate_action(ROBOTIQ, {"action": ee_arm(6), "control_type": "ee_pose"})
    assert out["action"] == [[0.3, 0.0, 0.2], [1.0, 0.0, 0.0, 0.0], [0.04] * 6]
    dual = validate_action(
        LIFT2, {"action": (ee_arm(2), ee_arm(2)), "control_type": "ee_pose", "is_rel": False}
    )
    assert dual["action"] == [ee_arm(2), ee_arm(2)]


def test_absolute_ee_pose_rejects_numpy_parts_naming_the_field() -> None:
    arm = [[0.3, 0.0, 0.2], np.array([1.0, 0, 0, 0]), [0.04, 0.04]]
    for is_rel in (None, False):
        act: dict[str, Any] = {"action": [arm, ee_arm(2)], "control_type": "ee_pose"}
        if is_rel is not None:
            act["is_rel"] = is_rel
        vs = check_action(LIFT2, act)
        assert [v.field for v in vs] == ["action[0][1]"]
        assert "Python list" in vs[0].expected and "numpy array" in vs[0].actual
    # relative: arrays are fine, and the copy is lists
    out = validate_action(
        LIFT2, {"action": [arm, ee_arm(2)], "control_type": "ee_pose", "is_rel": True}
    )
    assert out["action"][0][1] == [1.0, 0.0, 0.0, 0.0]
    vs = check_action(PANDA, {"action": np.zeros(3), "control_type": "ee_pose"})
    assert [v.field for v in vs] == ["action"]


def test_ee_pose_errors() -> None:
    vs = check_action(
        PANDA, {"action": [[0, 0, 0], [0, 0, 0, 0], [0.0, 0.0]], "control_type": "ee_pose"}
    )
    assert [(v.field, v.expected) for v in vs] == [("action[1]", "a quaternion with non-zero norm")]
    vs = check_action(PANDA, {"action": [[0, 0], [1, 0, 0, 0], [0.0]], "control_type": "ee_pose"})
    assert [(v.field, v.actual) for v in vs] == [
        ("action[0]", "2 values"),
        ("action[2]", "1 values"),
    ]
    vs = check_action(LIFT2, {"action": ee_arm(2), "control_type": "ee_pose"})
    assert [v.field for v in vs] == ["action"] and "2 arms" in vs[0].expected
    vs = check_action(
        LIFT2,
        {
            "action": [ee_arm(2), [[0, 0, float("nan")], [1, 0, 0, 0], [0, 0]]],
            "control_type": "ee_pose",
        },
    )
    assert [v.field for v in vs] == ["action[1][0][2]"]


def test_base_motion_rules() -> None:
    vs = check_action(PANDA, jp(9, base_motion=[0.1, 0, 0]))
    assert len(vs) == 1 and "ignored by the server" in vs[0].expected
    # a zero base motion on a single-arm robot is harmless and kept
    assert validate_action(PANDA, jp(9, base_motion=[0, 0, 0]))["base_motion"] == [0.0, 0.0, 0.0]
    vs = check_action(LIFT2, jp(16, base_motion=[0, 0, float("nan")], base_is_rel="yes"))
    assert {v.field for v in vs} == {"base_motion[2]", "base_is_rel"}


def test_validation_error_lists_all() -> None:
    with pytest.raises(ValidationError) as ei:
        validate_action(PANDA, {"action": [0.0] * 3, "control_type": "joint_position", "x": 1})
    assert len(ei.value.violations) == 2
    assert "(and 1 more: action)" in str(ei.value)


def test_validate_chunk() -> None:
    out = validate_chunk(PANDA, [jp(9), jp(9, is_rel=True)])
    assert [a.get("is_rel") for a in out] == [None, True]
    with pytest.raises(ValidationError) as ei:
        validate_chunk(
            PANDA, [jp(9), jp(8), jp(9), {"control_type": "joint_position"}], worker=2, step=40
        )
    vs = ei.value.violations
    assert [(v.location, v.step, v.field) for v in vs] == [
        ("chunk[1]", 41, "action"),
        ("chunk[3]", 43, "action"),
    ]
    assert str(vs[0]).startswith("chunk[1], worker 2, step 41: action: expected 9 finite floats")
    for bad in ([], {}, "x", None):
        with pytest.raises(ValidationError) as ei:
            validate_chunk(PANDA, bad)
        assert ei.value.field == "chunk"


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=20))
def test_joint_vector_property(values: list[float]) -> None:
    vs = check_action(PANDA, {"action": values, "control_type": "joint_position"})
    ok = len(values) == 9 and all(np.isfinite(values))
    assert (vs == []) == ok
    if ok:
        assert validate_action(PANDA, {"action": values, "control_type": "joint_position"})[
            "action"
        ] == [float(v) for v in values]


# ---------------------------------------------------------------- episode ids / paths


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "/etc/passwd",
        "a/../b",
        "../x",
        "a/./b",
        "a//b",
        "a/b/",
        "a\\b",
        "C:/x",
        "a/C:evil",
        "a\x00b",
        "a\nb",
        "a\x7fb",
        "x/" + "y" * 256,
        5,
        None,
        b"a/b",
    ],
)
def test_safe_relative_path_rejects(bad: Any) -> None:
    with pytest.raises(ValidationError) as ei:
        safe_relative_path(bad)
    assert ei.value.field == "episode_id"


def test_safe_relative_path_accepts_and_custom_field() -> None:
    assert safe_relative_path("ebench/r/ebench/t/000") == PurePosixPath("ebench/r/ebench/t/000")
    assert safe_relative_path("a/" + "é" * 127 + "/b").parts[1] == "é" * 127  # 254 bytes
    with pytest.raises(ValidationError) as ei:
        safe_relative_path("a/" + "é" * 128, field="run_id")  # 256 bytes
    assert ei.value.field == "run_id"


@given(st.text(min_size=1, max_size=40))
def test_safe_relative_path_never_escapes(text: str) -> None:
    try:
        p = safe_relative_path(text)
    except ValidationError:
        return
    assert not p.is_absolute()
    assert ".." not in p.parts and "." not in p.parts
    assert "\\" not in text and "\x00" not in text
    assert str(p) == text


def test_split_episode_id() -> None:
    eid = "ebench/myrun/ebench/table_top_manip/peg_in_hole/000"
    assert split_episode_id(eid) == ("ebench", "myrun", "ebench/table_top_manip/peg_in_hole", "000")
    # a run id with "/" is told apart by the task name starting with the benchmark
    assert split_episode_id("ebench/team/run1/ebench/t/001") == (
        "ebench",
        "team/run1",
        "ebench/t",
        "001",
    )
    assert split_episode_id("b/team/run1/x/y/002", task_name="x/y") == (
        "b",
        "team/run1",
        "x/y",
        "002",
    )
    with pytest.raises(ValidationError):
        split_episode_id("b/r/x/y/002", task_name="z/y")
    with pytest.raises(ValidationError) as ei:
        split_episode_id("ebench/run/000")
    assert "at least 4 segments" in ei.value.expected
    with pytest.raises(ValidationError):
        split_episode_id("ebench/../../etc/000")


# ---------------------------------------------------------------- metrics


def test_parse_metric_key() -> None:
    assert parse_metric_key("*(3/60)ebench/x/y") == MetricKey("ebench/x/y", 3, 60, False)
    assert parse_metric_key("*ebench/x") == MetricKey("ebench/x", 0, None, False)
    assert parse_metric_key("(60/60)ebench/x") == MetricKey("ebench/x", 60, 60, True)
    assert parse_metric_key("ebench/x") == MetricKey("ebench/x", None, None, False)
    for bad in ("*", "*(1/2)", "", 3):
        with pytest.raises(ResponseError):
            parse_metric_key(bad)  # type: ignore[arg-type]


def test_parse_metric_dict_and_float_forms() -> None:
    m = parse_metric(
        {
            "*(3/60)ebench/a": {"score": 0.5, "sr": 0.25},
            "(2/2)ebench/b": 1.0,  # old server: bare mean score
            "*ebench/c": {"score": 0.0, "success_rate": 0.0},
            "(1/1)ebench/d": {"score": 1.0},
        }
    )
    assert list(m) == ["ebench/a", "ebench/b", "ebench/c", "ebench/d"]
    assert (m["ebench/a"].done, m["ebench/a"].total, m["ebench/a"].score, m["ebench/a"].sr) == (
        3,
        60,
        0.5,
        0.25,
    )
    assert m["ebench/b"].complete and m["ebench/b"].sr == 1.0
    assert m["ebench/d"].sr == 1.0
    assert parse_metric({"*ebench/x": 0.3})["ebench/x"].sr == 0.0
    assert parse_metric(None) == {}
    with pytest.raises(ResponseError) as ei:
        parse_metric({"*ebench/a": {"sr": 1.0}})
    assert ei.value.field == "metric['*ebench/a'].score"
    with pytest.raises(ResponseError):
        parse_metric({"*ebench/a": "high"})
    with pytest.raises(ResponseError):
        parse_metric([1, 2])


def test_merge_metrics_keeps_most_advanced() -> None:
    a = {"*(1/3)ebench/t": {"score": 0.0, "sr": 0.0}, "*ebench/u": {"score": 0.0, "sr": 0.0}}
    b = {"*(2/3)ebench/t": {"score": 0.5, "sr": 0.5}, "(1/1)ebench/u": {"score": 1.0, "sr": 1.0}}
    m = merge_metrics(a, b, None)
    assert (m["ebench/t"].done, m["ebench/u"].complete) == (2, True)
    assert merge_metrics(b, a)["ebench/t"].done == 2


def test_is_success_tolerance() -> None:
    assert is_success(1.0) and is_success(1 - 5e-7) and not is_success(1 - 2e-6)
    assert not is_success(None) and not is_success(0.0)


# ---------------------------------------------------------------- replies

OBS = {"instruction": "x", "timestep": 0, "reset": True}
MET = {"*(1/2)ebench/t": {"score": 1.0, "sr": 1.0}}
ER = {
    "episode_id": "ebench/r/ebench/t/000",
    "task_name": "ebench/t",
    "seed": "000",
    "score": 1.0,
    "sr": 1.0,
}


def test_worker_entry_forms() -> None:
    normal = parse_worker_entry(0, {"obs": OBS, "metric": MET, "episode_result": None})
    assert (normal.worker_id, normal.obs, normal.reset_pending, normal.finished) == (
        "0",
        OBS,
        False,
        False,
    )
    assert normal.is_first and normal.metric == {"*(1/2)ebench/t": {"score": 1.0, "sr": 1.0}}

    pending = parse_worker_entry(
        "1",
        {
            "obs": {"reset": True, "reset_pending": True},
            "metric": MET,
            "episode_result": None,
            "reset_pending": True,
        },
    )
    assert pending.reset_pending and pending.obs is None and not pending.finished

    done_reset = parse_worker_entry("1", {"obs": OBS, "metric": MET, "episode_result": ER})
    assert done_reset.episode_result == EpisodeResult(
        "ebench/r/ebench/t/000", "ebench/t", "000", 1.0, 1.0
    )
    assert done_reset.episode_result is not None and done_reset.episode_result.success

    lost = parse_worker_entry(
        "2", {"obs": OBS, "metric": MET, "episode_result": None, "lock_lost": True}
    )
    assert lost.lock_lost and not lost.finished

    finished = parse_worker_entry(
        "3", {"obs": None, "metric": {"(2/2)ebench/t": 0.5}, "episode_result": None}
    )
    assert finished.finished and finished.metric == {"(2/2)ebench/t": {"score": 0.5, "sr": 0.0}}


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ([1], 'response["1"]'),
        ({"metric": None}, 'response["1"].obs'),
        ({"obs": [1, 2]}, 'response["1"].obs'),
        ({"obs": None, "metric": 3}, 'response["1"].metric'),
        ({"obs": None, "metric": {"*t": {"score": "x"}}}, "response[\"1\"].metric['*t'].score"),
        (
            {"obs": None, "episode_result": {"score": 1.0}},
            'response["1"].episode_result.episode_id',
        ),
        (
            {"obs": None, "episode_result": {"episode_id": "a/b/c/000"}},
            'response["1"].episode_result.score',
        ),
        (
            {"obs": None, "episode_result": {"episode_id": "a/b/c/000", "score": 1, "sr": "y"}},
            'response["1"].episode_result.sr',
        ),
        ({"obs": None, "reset_pending": "yes"}, 'response["1"].reset_pending'),
        ({"obs": None, "lock_lost": 1}, 'response["1"].lock_lost'),
    ],
)
def test_worker_entry_errors_name_the_field(entry: Any, field: str) -> None:
    with pytest.raises(ResponseError) as ei:
        parse_step_response({"1": entry}, ["1"])
    assert ei.value.field == field
    assert ei.value.exit_code == ExitCode.REMOTE_ERROR


def test_parse_episode_result_variants() -> None:
    r = parse_episode_result(
        {"episode_id": "ebench/r/ebench/t/007", "score": 0.999_999_5, "success_rate": 1}
    )
    assert r == EpisodeResult("ebench/r/ebench/t/007", "ebench/t", "007", 0.9999995, 1.0)
    assert r.success
    r2 = parse_episode_result({"episode_id": "ebench/r/ebench/t/007", "score": 0.5})
    assert r2 is not None and r2.sr == 0.0 and not r2.success
    assert parse_episode_result(None) is None
    assert r.to_dict()["seed"] == "007"


def test_parse_step_response_missing_and_int_keys() -> None:
    entry = {"obs": OBS, "metric": MET, "episode_result": None}
    out = parse_step_response({0: entry, "1": entry}, [0, "1"])
    assert list(out) == ["0", "1"]
    with pytest.raises(ResponseError) as ei:
        parse_step_response({"0": entry}, ["0", "1", "2"])
    assert [v.field for v in ei.value.violations] == ['response["1"]', 'response["2"]']
    assert ei.value.violations[0].actual == "missing (workers in reply: 0)"
    with pytest.raises(ResponseError) as ei:
        parse_step_response([entry], ["0"])
    assert ei.value.field == "response"
    # no expectations: everything parsed
    assert list(parse_step_response({"5": entry})) == ["5"]


def test_parse_chunk_response() -> None:
    entry = {"obs": OBS, "metric": MET, "episode_result": None}
    cr = parse_chunk_response(
        {"obs": {"0": entry}, "executed_steps": 3, "stopped_early": True}, ["0"]
    )
    assert cr.executed_steps == 3 and cr.stopped_early and cr.entries["0"].obs == OBS
    for data, field in [
        ({"executed_steps": 1, "stopped_early": False}, "response.obs"),
        ({"obs": {"0": entry}, "stopped_early": False}, "response.executed_steps"),
        (
            {"obs": {"0": entry}, "executed_steps": -1, "stopped_early": False},
            "response.executed_steps",
        ),
        ({"obs": {"0": entry}, "executed_steps": 1, "stopped_early": 0}, "response.stopped_early"),
        ({"obs": {}, "executed_steps": 1, "stopped_early": False}, 'response.obs["0"]'),
        ([], "response"),
    ]:
        with pytest.raises(ResponseError) as ei:
            parse_chunk_response(data, ["0"])
        assert ei.value.field == field


def test_parse_success_response() -> None:
    parse_success_response({"data": {"success": True}}, route="/kill")
    with pytest.raises(ResponseError) as ei:
        parse_success_response({"data": {"success": False}}, route="/kill")
    assert ei.value.field == "/kill response.data.success"
    with pytest.raises(ResponseError):
        parse_success_response({"detail": "x"})


def test_parse_status() -> None:
    s = parse_status(
        {
            "data": {
                "status": "running",
                "benchmark_id": "ebench",
                "run_id": "r1",
                "total_episodes": 60,
                "completed_episodes": 15,
                "in_progress_episodes": 4,
                "active_workers": [0, "1"],
                "results": {"ebench/t": 0.5},
            }
        }
    )
    assert (s.status, s.benchmark_id, s.run_id) == ("running", "ebench", "r1")
    assert (s.total_episodes, s.completed_episodes, s.in_progress_episodes) == (60, 15, 4)
    assert s.active_workers == ("0", "1") and s.mean_scores == {"ebench/t": 0.5}
    assert s.progress == 0.25 and not s.complete
    idle = parse_status(
        {
            "data": {
                "status": "idle",
                "benchmark_id": None,
                "run_id": None,
                "total_episodes": 0,
                "completed_episodes": 0,
                "in_progress_episodes": 0,
                "active_workers": [],
                "results": {},
            }
        }
    )
    assert idle.progress is None and idle.run_id is None
    assert parse_status({"status": "complete"}).complete
    for payload, field in [
        ({"data": {"status": 1}}, "status.data.status"),
        ({"data": {"status": "idle", "total_episodes": "3"}}, "status.data.total_episodes"),
        ({"data": {"status": "idle", "run_id": 5}}, "status.data.run_id"),
        ({"data": {"status": "idle", "active_workers": "0"}}, "status.data.active_workers"),
        ({"data": {"status": "idle", "results": {"t": "x"}}}, "status.data.results['t']"),
        ({"data": {"status": "idle", "results": [1]}}, "status.data.results"),
        ("nope", "status.data"),
    ]:
        with pytest.raises(ResponseError) as ei:
            parse_status(payload)
        assert ei.value.field == field


def test_violation_roundtrip_types() -> None:
    vs = check_action(PANDA, jp(3), worker=7)
    assert isinstance(vs[0], Violation) and vs[0].worker == "7"


_task = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1
).filter(lambda t: t.strip() != "" and not t.startswith(("*", "(")))


@given(_task, st.integers(0, 10_000), st.integers(1, 10_000), st.booleans())
def test_metric_key_roundtrip(task: str, done: int, total: int, star: bool) -> None:
    key = f"{'*' if star else ''}({done}/{total}){task}"
    mk = parse_metric_key(key)
    assert (mk.task, mk.done, mk.total) == (task, done, total)
    assert mk.complete == (not star and done >= total)
    assert parse_metric_key(f"*{task}") == MetricKey(task, 0, None, False)


@pytest.mark.parametrize("key", ["(0/1) ", "*", "*(3/4)", "   "])
def test_metric_key_without_task_is_rejected(key: str) -> None:
    with pytest.raises(ResponseError, match="metric key"):
        parse_metric_key(key)
