"""Corrupt recordings load with their problems reported, or give EpisodeDataError (one line);
never another exception.

Mutations of a valid steps.jsonl (field values swapped for wrong types, lines dropped, duplicated,
truncated, bytes flipped) and of a valid meta_record.pkl. Under the one bad-row policy
(genmanip_results.series) most corrupt rows become reported gaps; only episodes with nothing left
to plot are errors. GMP_FUZZ_N scales the count.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_artifacts import EpisodeDataError, load_series

N = int(os.environ.get("GMP_FUZZ_N", "300"))
_JUNK: list[Any] = [
    None,
    "x",
    -1,
    1.5,
    [],
    {},
    [1, "a"],
    True,
    1e308,
    float("nan"),
    [[1.0]],
    {"a": 1},
    2**70,
]


def _rows(n: int = 6) -> list[dict[str, Any]]:
    rows = []
    for s in range(n):
        rows.append({
            "episode_id": "b/r/b/t/000", "worker_id": "0", "robot_id": "manip/lift2/R5a",
            "step": s, "obs_timestep": s - s % 2, "frame": (s - s % 2) // 2,
            "state": None if s % 2 else {"joints": [0.1] * 12, "gripper": [0.0] * 4, "base": [0.0] * 3},
            "action": {"control_type": "joint_position", "action": [0.0] * 16, "is_rel": False,
                       "base_motion": [0.0, 0.0, 0.0], "base_is_rel": True},
            "chunk": {"index": s % 2, "size": 2}, "latency_ms": None,
        })  # fmt: skip
    return rows


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


def _episode(tmp_path: Path, name: str) -> Path:
    ep = tmp_path / name / "b" / "r" / "b" / "t" / "000"
    ep.mkdir(parents=True)
    (ep.parent.parent.parent / "run.json").write_text("{}")
    return ep


def _mutate_text(rng: random.Random, rows: list[dict[str, Any]]) -> str:
    kind = rng.randrange(5)
    rows = copy.deepcopy(rows)
    if kind == 0:  # a wrong value anywhere
        i = rng.randrange(len(rows))
        path = rng.choice(_paths(rows[i]))
        rows[i] = _set(rows[i], path, copy.deepcopy(rng.choice(_JUNK)))
    elif kind == 1:  # a key removed
        i = rng.randrange(len(rows))
        paths = [p for p in _paths(rows[i]) if p and isinstance(p[-1], str)]
        path = rng.choice(paths)
        parent = rows[i]
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
    elif kind == 2:  # lines dropped or duplicated
        i = rng.randrange(len(rows))
        rows = rows[:i] + rows[i + 1 :] if rng.random() < 0.5 else rows[: i + 1] + rows[i:]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    data = bytearray(text.encode())
    if kind == 3:  # truncated
        data = data[: rng.randrange(len(data))]
    elif kind == 4:  # bytes flipped
        for _ in range(rng.randint(1, 5)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    return data.decode("utf-8", errors="surrogateescape")


def test_mutated_steps_jsonl(tmp_path: Path) -> None:
    rng = random.Random(1234)
    base = _rows()
    outcomes = {"ok": 0, "reported": 0, "error": 0}
    for k in range(N):
        ep = _episode(tmp_path, f"e{k}")
        text = _mutate_text(rng, base)
        (ep / "steps.jsonl").write_bytes(text.encode("utf-8", errors="surrogateescape"))
        try:
            s = load_series(ep)
        except EpisodeDataError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
            continue
        assert all("\n" not in w for w in s.warnings)
        assert s.action.shape[0] == s.action_t.shape[0] == s.n_steps
        assert all(v.shape[0] == s.state_t.shape[0] for v in s.state.values())
        outcomes["reported" if s.issues else "ok"] += 1
    # Every branch is exercised: harmless mutations, reported ones and fatal ones.
    assert outcomes["ok"] > 0 and outcomes["reported"] > N // 4 and outcomes["error"] > 0, outcomes


def test_mutated_meta_record(tmp_path: Path) -> None:
    rng = random.Random(99)
    meta = {
        "joint_positions": [np.zeros(7, np.float32) for _ in range(4)],
        "gripper_positions": [np.zeros(2, np.float32) for _ in range(4)],
        "base_positions": [[0.0, 0.0, 0.0]] * 4,
        "instruction": "x",
        "model_output": [{"arm_action": np.zeros(9), "base_motion": [0.0, 0.0, 0.0]}] * 4,
        "robot_id": "manip/franka/panda_hand",
    }
    good = pickle.dumps(meta, protocol=4)
    errors = 0
    for k in range(max(N // 3, 50)):
        ep = _episode(tmp_path, f"m{k}")
        (ep / "result_info.json").write_text('{"score": 1.0, "success_rate": 1}')
        data = bytearray(good)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        (ep / "meta_record.pkl").write_bytes(bytes(data))
        try:
            load_series(ep)
        except EpisodeDataError as exc:
            assert "\n" not in str(exc)
            errors += 1
    assert errors > 0


@pytest.mark.parametrize("value", [[[0.0] * 16], "abc", {"a": 1}, None])
def test_meta_record_wrong_shapes(tmp_path: Path, value: Any) -> None:
    ep = _episode(tmp_path, "w")
    (ep / "result_info.json").write_text('{"score": 1.0, "success_rate": 1}')
    meta = {
        "joint_positions": value,
        "gripper_positions": [[0.0, 0.0]],
        "robot_id": "manip/franka/panda_hand",
    }
    (ep / "meta_record.pkl").write_bytes(pickle.dumps(meta))
    with pytest.raises(EpisodeDataError):
        load_series(ep)
