"""Read one episode's recorded state/action series and its frame alignment, for either layout.

Client layout (``gmp eval``): ``steps.jsonl`` rows as specified in ``docs/architecture.md``.
Server layout (the GenManip server): ``meta_record.pkl``, read ONLY through the allow-list
unpickler (``genmanip_protocol.codec``). Where the episode and its videos are is decided by
``genmanip_results.discovery.load_episode``; nothing here scans directories.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from genmanip_protocol.errors import GenmanipError
from genmanip_protocol.robots import CAMERA_ORDER, ROBOTS, RobotSpec

from .errors import EpisodeDataError

__all__ = ["EpisodeSeries", "load_series", "order_cameras"]

#: Files in an episode directory that look like camera videos but are outputs of gmp plot / the
#: reference client, never cameras.
_GENERATED_VIDEO_PREFIXES = ("merged_with_plot", "merged_")


@dataclass(frozen=True)
class EpisodeSeries:
    """The plottable content of one episode.

    Attributes:
        path: the episode directory.
        layout: ``"client"`` (steps.jsonl) or ``"server"`` (meta_record.pkl).
        episode_id: ``<benchmark>/<run_id>/<task_name>/<seed>`` (from the results discovery).
        robot_id: as recorded; ``robot`` is its spec or None for a robot gmp does not know.
        instruction: the task instruction when recorded.
        state_t: (N,) int64 simulator timesteps of the observations that carry a state.
        state: state part name -> (N, d) float64. Known robots: ``joints`` (rad), ``gripper``
            (joint units), ``base`` (x m, y m, yaw rad). Unknown robots: every recorded part.
        action_t: (M,) int64 step index of each executed action (= the timestep it was applied at).
        action: (M, A) float64: the ``joint_position`` vector, or the flattened ``ee_pose``
            (per arm: position m (3), quaternion wxyz (4), gripper (dof)).
        control_type: ``"joint_position"`` or ``"ee_pose"``.
        is_rel, base_is_rel: the action flags when every row agrees, else None (absent or mixed).
        base_motion: (M, 3) float64 ``[x m, y m, yaw deg]`` or None when never sent.
        frame_timesteps: video frame index -> simulator timestep of that observation, for every
            frame whose timestep the recording states (client: the rows' ``frame``/``obs_timestep``;
            server: frame ``j`` is the observation at timestep ``j``, frame 0 the reset one).
        frames_required: how many frames every camera video must have at least (client: the
            highest referenced frame + 1; server: one per recorded step).
        last_obs_t: the last timestep an observation can have (the last step + 1).
        videos: camera name (``left_camera``) -> mp4 path, in display order.
        warnings: non-fatal findings (unreferenced frames, ...), one line each.
    """

    path: Path
    layout: Literal["client", "server"]
    episode_id: str
    robot_id: str | None
    robot: RobotSpec | None
    instruction: str | None
    state_t: np.ndarray
    state: dict[str, np.ndarray]
    action_t: np.ndarray
    action: np.ndarray
    control_type: str
    is_rel: bool | None
    base_motion: np.ndarray | None
    base_is_rel: bool | None
    frame_timesteps: dict[int, int]
    frames_required: int
    last_obs_t: int
    videos: dict[str, Path]
    warnings: list[str] = field(default_factory=list)

    @property
    def n_steps(self) -> int:
        return int(self.action_t.shape[0])

    @property
    def t_range(self) -> tuple[int, int]:
        """The plotted time range: first timestep to the end of the last action (step + 1)."""
        ts = [a for a in (self.state_t, self.action_t) if a.size]
        if not ts:
            return (0, 1)
        lo = min(int(a.min()) for a in ts)
        hi = int(self.state_t.max()) if self.state_t.size else lo
        if self.action_t.size:
            hi = max(hi, int(self.action_t.max()) + 1)
        return (lo, max(hi, lo + 1))


def order_cameras(videos: Mapping[str, Path]) -> dict[str, Path]:
    """Known cameras in the documented order (``robots.CAMERA_ORDER``), then the others sorted.

    Generated videos (``merged_with_plot*.mp4``, the reference's ``merged_<uid>.mp4``) are dropped.
    """
    cams = {k: v for k, v in videos.items() if not k.startswith(_GENERATED_VIDEO_PREFIXES)}
    rank = {name.removesuffix("_view"): i for i, name in enumerate(CAMERA_ORDER)}
    names = sorted(cams, key=lambda c: (rank.get(c.removesuffix("_view"), len(rank)), c))
    return {n: cams[n] for n in names}


def _robot_for(robot_id: str | None) -> RobotSpec | None:
    if robot_id is None:
        return None
    spec = ROBOTS.get(robot_id)
    if spec is not None:
        return spec
    # Accept aliases (older servers, hand-written files) without treating them as errors.
    from genmanip_protocol.robots import get_robot

    try:
        return get_robot(robot_id)
    except GenmanipError:
        return None


def _base_motion(value: Any, where: str) -> list[float] | None:
    """A step's base motion as 3 numbers (None when the step has none); ValueError naming
    ``where`` otherwise."""
    if value is None:
        return None
    vals = _flatten_numbers(value, where)
    if len(vals) != 3:
        raise ValueError(f"{where}: expected 3 values, got {len(vals)}")
    return vals


def _flatten_numbers(value: Any, where: str) -> list[float]:
    """Flatten nested lists/arrays of numbers into one list of floats (NaN allowed, bools not)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            raise ValueError(f"{where}: expected numbers, got an array of dtype {value.dtype}")
        return [float(x) for x in value.ravel()]
    if isinstance(value, (list, tuple)):
        out: list[float] = []
        for i, v in enumerate(value):
            out.extend(_flatten_numbers(v, f"{where}[{i}]"))
        return out
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{where}: expected a number, got {type(value).__name__} {value!r:.40}")
    return [float(value)]


def _stack(rows: Sequence[list[float]], what: str, lines: Sequence[int], src: str) -> np.ndarray:
    """Stack equal-length rows; ragged rows are an error naming both lines."""
    if not rows:
        return np.zeros((0, 0), dtype=np.float64)
    n0 = len(rows[0])
    for r, ln in zip(rows, lines, strict=True):
        if len(r) != n0:
            raise ValueError(
                f"{src}: ragged rows: {what} has {n0} values on line {lines[0]} "
                f"but {len(r)} on line {ln}"
            )
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), n0)


def _flag(values: Iterable[Any]) -> bool | None:
    vals = {v for v in values}
    if len(vals) == 1:
        (v,) = vals
        return v if isinstance(v, bool) else None
    return None


def _check_state_dims(robot: RobotSpec, state: dict[str, np.ndarray], src: str) -> None:
    want = {"joints": robot.joints_dim, "gripper": robot.gripper_dim, "base": 3}
    for key, n in want.items():
        arr = state.get(key)
        if arr is None:
            raise ValueError(f"{src}: state.{key} missing (needed for {robot.robot_id})")
        if arr.shape[1] != n:
            raise ValueError(
                f"{src}: state.{key}: expected {n} values for {robot.robot_id}, got {arr.shape[1]}"
            )


# ---------------------------------------------------------------- client layout: steps.jsonl


def _read_steps_jsonl(
    steps_file: Path, *, recording: bool, warnings: list[str]
) -> list[tuple[int, dict[str, Any]]]:
    """Rows with their line numbers. While an episode is still ``recording`` (``INCOMPLETE``), a
    last line without its newline is a row being written: skipped with a warning, not an error."""
    try:
        text = steps_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{steps_file.name}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{steps_file.name}: not UTF-8 text ({exc.reason})") from exc
    rows: list[tuple[int, dict[str, Any]]] = []
    lines = text.splitlines()
    if recording and lines and not text.endswith("\n"):
        warnings.append(f"{steps_file.name}:{len(lines)}: row still being written; ignored")
        lines.pop()
    for ln, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{steps_file.name}:{ln}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{steps_file.name}:{ln}: expected a JSON object per line")
        rows.append((ln, row))
    if not rows:
        raise ValueError(f"{steps_file.name}: no steps recorded")
    return rows


def _int_field(
    row: Mapping[str, Any], key: str, where: str, *, nullable: bool = False
) -> int | None:
    v = row.get(key)
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where}: {key}: expected a non-negative integer, got {v!r:.40}")
    return v


def _series_from_steps(
    steps_file: Path,
    *,
    recording: bool = False,
) -> tuple[
    str | None,
    np.ndarray,
    dict[str, np.ndarray],
    np.ndarray,
    np.ndarray,
    str,
    bool | None,
    np.ndarray | None,
    bool | None,
    dict[int, int],
    list[str],
]:
    name = steps_file.name
    warnings: list[str] = []
    rows = _read_steps_jsonl(steps_file, recording=recording, warnings=warnings)
    robot_id: str | None = None
    seen_steps: dict[int, int] = {}
    frame_ts: dict[int, int] = {}
    frame_line: dict[int, int] = {}
    state_t: list[int] = []
    state_rows: dict[str, list[list[float]]] = {}
    state_lines: list[int] = []
    act_t: list[int] = []
    act_rows: list[list[float]] = []
    act_lines: list[int] = []
    base_rows: list[list[float]] = []
    control_types: set[str] = set()
    is_rel: list[Any] = []
    base_is_rel: list[Any] = []
    any_base = False
    state_keys: list[str] | None = None
    seen_obs: set[int] = set()
    for ln, row in rows:
        where = f"{name}:{ln}"
        rid = row.get("robot_id")
        if rid is not None:
            if not isinstance(rid, str):
                raise ValueError(f"{where}: robot_id: expected a string, got {rid!r:.40}")
            if robot_id is None:
                robot_id = rid
            elif rid != robot_id:
                raise ValueError(
                    f"{where}: robot_id: {rid!r} differs from {robot_id!r} on earlier rows"
                )
        step = _int_field(row, "step", where)
        obs_t = _int_field(row, "obs_timestep", where)
        frame = _int_field(row, "frame", where, nullable=True)
        assert step is not None and obs_t is not None
        if step in seen_steps:
            raise ValueError(
                f"{where}: step {step} already recorded on line {seen_steps[step]} "
                "(rows of two attempts mixed?)"
            )
        seen_steps[step] = ln
        if obs_t > step:
            raise ValueError(f"{where}: obs_timestep {obs_t} is after the action's step {step}")
        if frame is not None:
            prev = frame_ts.get(frame)
            if prev is not None and prev != obs_t:
                raise ValueError(
                    f"{where}: frame {frame} is observation timestep {obs_t} here but {prev} "
                    f"on line {frame_line[frame]}"
                )
            frame_ts[frame] = obs_t
            frame_line.setdefault(frame, ln)
        state = row.get("state")
        if state is not None:
            if not isinstance(state, dict) or not state:
                raise ValueError(f"{where}: state: expected an object or null, got {state!r:.40}")
            if obs_t in seen_obs:
                raise ValueError(f"{where}: state of observation timestep {obs_t} recorded twice")
            seen_obs.add(obs_t)
            keys = sorted(state)
            if state_keys is None:
                state_keys = keys
            elif keys != state_keys:
                raise ValueError(
                    f"{where}: state keys {keys} differ from {state_keys} on earlier rows"
                )
            for k in keys:
                state_rows.setdefault(k, []).append(
                    _flatten_numbers(state[k], f"{where}: state.{k}")
                )
            state_t.append(obs_t)
            state_lines.append(ln)
        act = row.get("action")
        if not isinstance(act, dict):
            raise ValueError(f"{where}: action: expected an object, got {act!r:.40}")
        ctype = act.get("control_type", "joint_position")
        if ctype not in ("joint_position", "ee_pose"):
            raise ValueError(f"{where}: action.control_type: unsupported {ctype!r:.40}")
        control_types.add(ctype)
        if "action" not in act:
            raise ValueError(f"{where}: action.action missing")
        act_rows.append(_flatten_numbers(act["action"], f"{where}: action.action"))
        act_t.append(step)
        act_lines.append(ln)
        bm = _base_motion(act.get("base_motion"), f"{where}: action.base_motion")
        any_base = any_base or bm is not None
        base_rows.append(bm or [0.0, 0.0, 0.0])
        is_rel.append(act.get("is_rel"))
        base_is_rel.append(act.get("base_is_rel"))
    if len(control_types) > 1:
        raise ValueError(f"{name}: mixed control types {sorted(control_types)} in one episode")
    if not state_t:
        raise ValueError(f"{name}: no row carries a state")
    order = np.argsort(np.asarray(state_t), kind="stable")
    state_arrays = {
        k: _stack(v, f"state.{k}", state_lines, name)[order] for k, v in state_rows.items()
    }
    aorder = np.argsort(np.asarray(act_t), kind="stable")
    actions = _stack(act_rows, "action.action", act_lines, name)[aorder]
    base = np.asarray(base_rows, dtype=np.float64)[aorder] if any_base else None
    return (
        robot_id,
        np.asarray(state_t, dtype=np.int64)[order],
        state_arrays,
        np.asarray(act_t, dtype=np.int64)[aorder],
        actions,
        control_types.pop(),
        _flag(is_rel),
        base,
        _flag(base_is_rel),
        frame_ts,
        warnings,
    )


# ---------------------------------------------------------------- server layout: meta_record.pkl


def _as_matrix(value: Any, key: str, src: str) -> np.ndarray:
    """(T, d) float64 from a list of per-step vectors or a 2-D array; ragged -> error."""
    if value is None:
        raise ValueError(f"{src}: {key} missing")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            raise ValueError(f"{src}: {key}: expected numbers, got dtype {value.dtype}")
        arr = value.astype(np.float64)
        if arr.ndim == 1:
            arr = arr.reshape(-1, 1) if arr.size else arr.reshape(0, 0)
        return arr.reshape(arr.shape[0], -1)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{src}: {key}: expected a list of vectors, got {type(value).__name__}")
    rows = [_flatten_numbers(v, f"{src}: {key}[{i}]") for i, v in enumerate(value)]
    return _stack(rows, key, list(range(len(rows))), src).reshape(len(rows), -1)


def _series_from_meta(
    meta_file: Path, robot_hint: str | None
) -> tuple[
    str | None,
    str | None,
    np.ndarray,
    dict[str, np.ndarray],
    np.ndarray,
    np.ndarray,
    str,
    np.ndarray | None,
    dict[int, int],
]:
    from genmanip_protocol.codec import get_codec

    name = meta_file.name
    try:
        data = meta_file.read_bytes()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        meta = get_codec("legacy").decode(data)
    except GenmanipError as exc:
        raise ValueError(f"{name}: {exc}") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{name}: expected a dict, got {type(meta).__name__}")
    robot_id = meta.get("robot_id", robot_hint)
    if robot_id is not None and not isinstance(robot_id, str):
        raise ValueError(f"{name}: robot_id: expected a string, got {robot_id!r:.40}")
    instruction = meta.get("instruction")
    state = {
        "joints": _as_matrix(meta.get("joint_positions"), "joint_positions", name),
        "gripper": _as_matrix(meta.get("gripper_positions"), "gripper_positions", name),
    }
    if meta.get("base_positions") is not None:
        state["base"] = _as_matrix(meta.get("base_positions"), "base_positions", name)
    lengths = {k: v.shape[0] for k, v in state.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{name}: ragged rows: per-step lengths differ {lengths}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise ValueError(f"{name}: no steps recorded")
    outputs = meta.get("model_output") or []
    if not isinstance(outputs, (list, tuple)):
        raise ValueError(f"{name}: model_output: expected a list, got {type(outputs).__name__}")
    act_rows: list[list[float]] = []
    base_rows: list[list[float]] = []
    nested = False
    any_base = False
    for i, out in enumerate(outputs):
        if not isinstance(out, dict) or "arm_action" not in out:
            raise ValueError(f"{name}: model_output[{i}]: expected a dict with arm_action")
        arm = out["arm_action"]
        if isinstance(arm, np.ndarray):
            nested = nested or arm.ndim > 1
        elif isinstance(arm, (list, tuple)):
            nested = nested or any(isinstance(a, (list, tuple, np.ndarray)) for a in arm)
        act_rows.append(_flatten_numbers(arm, f"{name}: model_output[{i}].arm_action"))
        bm = _base_motion(out.get("base_motion"), f"{name}: model_output[{i}].base_motion")
        any_base = any_base or bm is not None
        base_rows.append(bm or [0.0, 0.0, 0.0])
    actions = _stack(act_rows, "model_output.arm_action", list(range(len(act_rows))), name)
    if not act_rows:
        actions = np.zeros((0, 0), dtype=np.float64)
    base = np.asarray(base_rows, dtype=np.float64) if any_base else None
    # The server's recorder (as the testbed reproduces it) stores the reset observation's frame,
    # then after every step the applied action, the resulting state and that observation's frame:
    # row i = action of step i and the state at timestep i + 1; frame j = timestep j.
    return (
        robot_id,
        instruction if isinstance(instruction, str) else None,
        np.arange(1, n + 1, dtype=np.int64),
        state,
        np.arange(len(act_rows), dtype=np.int64),
        actions,
        "ee_pose" if nested else "joint_position",
        base,
        {j: j for j in range(n + 1)},
    )


# ---------------------------------------------------------------- public entry point


def load_series(ep_dir: Path | str) -> EpisodeSeries:
    """Load the plottable series of the episode in ``ep_dir`` (either layout).

    Raises:
        EpisodeDataError: no ``steps.jsonl`` / ``meta_record.pkl``, or they are corrupt (the message
            is one line naming the file, line and field).
    """
    from genmanip_results.discovery import load_episode

    ep_dir = Path(ep_dir)
    if not ep_dir.is_dir():
        raise EpisodeDataError(f"{ep_dir}: not a directory", path=ep_dir)
    try:
        info = load_episode(ep_dir)
    except GenmanipError as exc:
        raise EpisodeDataError(f"{ep_dir}: {exc}", path=ep_dir) from exc
    videos = order_cameras(dict(info.videos))
    instruction: str | None = None
    warnings: list[str] = []
    try:
        if info.steps_file is not None and info.steps_file.is_file():
            layout: Literal["client", "server"] = "client"
            (
                robot_id,
                state_t,
                state,
                action_t,
                action,
                ctype,
                is_rel,
                base,
                base_is_rel,
                frame_ts,
                warnings,
            ) = _series_from_steps(info.steps_file, recording=(ep_dir / "INCOMPLETE").exists())
            # result.json (read by the results discovery) carries the instruction.
            instruction = info.instruction
            robot_id = robot_id or info.robot_id
            frames_required = max(frame_ts) + 1 if frame_ts else 0
        elif info.meta_record is not None and info.meta_record.is_file():
            layout = "server"
            (robot_id, instruction, state_t, state, action_t, action, ctype, base, frame_ts) = (
                _series_from_meta(info.meta_record, info.robot_id)
            )
            is_rel = base_is_rel = None
            frames_required = max(len(frame_ts) - 1, 0)
        else:
            raise ValueError(
                "no steps.jsonl or meta_record.pkl (nothing recorded for this episode)"
            )
        robot = _robot_for(robot_id)
        if robot is not None:
            _check_state_dims(
                robot, state, "steps.jsonl" if layout == "client" else "meta_record.pkl"
            )
            if ctype == "joint_position" and action.size and action.shape[1] != robot.action_dim:
                raise ValueError(
                    f"action: expected {robot.action_dim} values (joint_position for "
                    f"{robot.robot_id}), got {action.shape[1]}"
                )
        elif robot_id is not None:
            warnings.append(f"unknown robot {robot_id!r}: plotting every recorded dimension")
    except ValueError as exc:
        raise EpisodeDataError(f"{ep_dir}: {exc}", path=ep_dir) from exc
    return EpisodeSeries(
        path=ep_dir,
        layout=layout,
        episode_id=info.episode_id,
        robot_id=robot_id,
        robot=robot,
        instruction=instruction,
        state_t=state_t,
        state=state,
        action_t=action_t,
        action=action,
        control_type=ctype,
        is_rel=is_rel,
        base_motion=base,
        base_is_rel=base_is_rel,
        frame_timesteps=frame_ts,
        frames_required=frames_required,
        last_obs_t=int(
            max(action_t.max() + 1 if action_t.size else 0, state_t.max() if state_t.size else 0)
        ),
        videos=videos,
        warnings=warnings,
    )
