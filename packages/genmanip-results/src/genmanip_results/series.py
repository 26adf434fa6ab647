"""One episode's recorded series (states, actions, latencies) aligned to its video frames.

The one loader of per-episode series for both layouts (``docs/architecture.md``, "On-disk
layouts"); artifacts plots from it and viz builds its ``.rrd`` from it:

* client layout: ``steps.jsonl``, one JSON row per executed action;
* server layout: ``meta_record.pkl``, read ONLY through the allow-list unpickler
  :func:`genmanip_protocol.codec.safe_loads` (nothing in the file is ever executed).

Where the episode, its recording and its videos are is decided by
:func:`genmanip_results.discovery.load_episode`; nothing here scans directories. The recording
file is opened through :func:`genmanip_results.paths.open_within`, within the root the episode
was found under (:attr:`~genmanip_results.discovery.EpisodeInfo.containment`): a ``steps.jsonl``
or ``meta_record.pkl`` that is (or became, after the scan) a symlink out of it is never read.

Bad-row policy (the same for every caller)
------------------------------------------

**A bad row never fails the episode and is never dropped silently.** Every problem found in a
row becomes a :class:`SeriesIssue` (typed by :data:`IssueKind`, with the file, line and field)
in :attr:`EpisodeSeries.issues`, counted by :meth:`EpisodeSeries.issue_counts` and spelled out by
:attr:`EpisodeSeries.warnings` / :meth:`EpisodeSeries.summary` for the caller to show. What
happens to the row:

* ``ragged`` (a vector whose length differs from the episode's) and ``invalid`` (a field of the
  wrong type, a missing field) values are **kept as gaps**: the row keeps its place on the
  timeline and the bad vector becomes a row of NaN, so a plot shows a visible hole exactly
  where the recording is bad and every other field of that row (its state, frame, latency) is
  still used. The episode's width of a vector is the most common length among its rows (ties: the
  one seen first), so one bad row cannot redefine the episode — not even when it is the first.
* ``unreadable`` rows (not UTF-8, not JSON, not an object), rows without a usable ``step`` and
  ``conflict`` rows that repeat a step already recorded (rows of two attempts mixed) cannot be
  placed on the timeline: they are **skipped**, and the issue says so (:attr:`SeriesIssue.skipped`).
* ``partial``: while an episode is still being recorded, a last line without its newline is the
  row being written; it is skipped and reported as such, not as corruption.

Why this policy: a viewer must not crash on one bad line of a long episode (the previous viz
loader dropped such rows silently, the artifacts loader refused the whole episode), and a plot or
recording of a partly corrupt episode is still useful *when it says what was skipped*. Dropping a
ragged row would also shift nothing but hide the problem; a NaN row keeps the alignment of steps
to frames exact. Only whole-file problems raise :class:`SeriesError`: no recording at all
(:class:`SeriesNotFoundError`), an unreadable file, a ``meta_record.pkl`` the allow-list refuses
or that is not a dict. An episode with no usable row loads as an empty series (callers that need
data, like the plotter, decide what that means).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_protocol.robots import CAMERA_ORDER, ROBOTS, RobotSpec

from .errors import GenmanipResultsError
from .layout import INCOMPLETE, MERGED_VIDEO, META_RECORD, STEPS_JSONL
from .paths import UnsafePathError, read_bytes_within

if TYPE_CHECKING:
    from .discovery import EpisodeInfo

__all__ = [
    "ISSUE_KINDS",
    "EpisodeSeries",
    "IssueKind",
    "SeriesError",
    "SeriesIssue",
    "SeriesNotFoundError",
    "load_series",
    "order_cameras",
]

#: What went wrong with a row (see the module docstring for what happens to the row).
IssueKind = Literal["unreadable", "partial", "invalid", "ragged", "conflict"]
#: Every :data:`IssueKind`, in the order summaries list them.
ISSUE_KINDS: tuple[IssueKind, ...] = ("unreadable", "partial", "invalid", "ragged", "conflict")

#: How many issues :attr:`EpisodeSeries.warnings` spells out before summarizing the rest.
_MAX_LISTED = 20
#: Nesting deeper than this in a vector field is not a vector (and would cost recursion).
_MAX_DEPTH = 8
#: Files in an episode directory that look like camera videos but are outputs of gmp plot / the
#: reference client, never cameras.
_GENERATED_VIDEO_PREFIXES = (Path(MERGED_VIDEO).stem, "merged_")
_CONTROL_TYPES = ("joint_position", "ee_pose")
#: Steps, timesteps and frame indices are below this (int64 arrays; no episode comes close).
_MAX_INDEX = 1 << 62


class SeriesError(GenmanipResultsError):
    """An episode's recording file cannot be read as a whole (one line naming the file).

    Problems of single rows never raise: they are :class:`SeriesIssue` entries.
    """

    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, message: str, *, path: Path | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class SeriesNotFoundError(SeriesError):
    """The episode has neither ``steps.jsonl`` nor ``meta_record.pkl`` (or is not a directory)."""


@dataclass(frozen=True)
class SeriesIssue:
    """One problem found in one row of an episode's recording.

    Attributes:
        kind: see :data:`IssueKind` and the module docstring.
        source: file name (``steps.jsonl`` or ``meta_record.pkl``).
        line: 1-based line of ``steps.jsonl``, or 0-based record index in ``meta_record.pkl``;
            None for a problem of the file as a whole.
        field: the field concerned (``action.action``, ``state.joints``, ``joint_positions``...)
            or None when the whole row is concerned.
        message: what is wrong and what was done about it (one line).
        skipped: True when the whole row was left out (it could not be placed on the timeline);
            False when the row was kept and only the named field is a gap (NaN) or ignored.
    """

    kind: IssueKind
    source: str
    line: int | None
    field: str | None
    message: str
    skipped: bool = False

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


@dataclass(frozen=True)
class EpisodeSeries:
    """The recorded series of one episode, aligned on the simulator timestep.

    Attributes:
        path: the episode directory.
        layout: ``"client"`` (``steps.jsonl``) or ``"server"`` (``meta_record.pkl``).
        source: the recording file the series was read from.
        episode_id: ``<benchmark>/<run_id>/<task_name>/<seed>`` (from the results discovery).
        robot_id: as recorded; ``robot`` is its spec, or None for a robot gmp does not know.
        instruction: the task instruction when recorded.
        state_t: (N,) int64 simulator timesteps of the observations that carry a state.
        state: state part name -> (N, d) float64 (``joints`` rad, ``gripper`` joint units, ``base``
            x m, y m, yaw rad, or whatever an unknown robot recorded). NaN rows are gaps.
        action_t: (M,) int64 step index of each executed action (= the timestep it was applied at).
        action: (M, A) float64: the ``joint_position`` vector, or the flattened ``ee_pose`` (per
            arm: position m (3), quaternion wxyz (4), gripper (dof)). NaN rows are gaps; A is 0 when
            no row had a usable action.
        control_type: ``"joint_position"`` or ``"ee_pose"`` (the most common among the rows).
        is_rel, base_is_rel: the action flags when every row agrees, else None (absent or mixed).
        base_motion: (M, 3) float64 ``[x m, y m, yaw deg]`` (zeros where a row sent none, NaN where
            it was bad), or None when no row sent one.
        latency_t: (K,) int64 step of every row that carries ``latency_ms`` (the first row of a
            request; server layout: empty).
        latency_ms: part name (``network``, ``server``, ``policy``) -> (K,) float64 milliseconds,
            NaN where a row lacks that part.
        frame_timesteps: video frame index -> simulator timestep of that observation, for every
            frame whose timestep the recording states (client: the rows' ``frame``/``obs_timestep``;
            server: frame ``j`` is the observation at timestep ``j``, frame 0 the reset one).
        frames_required: how many frames every camera video must have at least (client: the
            highest referenced frame + 1; server: one per recorded step).
        last_obs_t: the last timestep an observation can have (the last step + 1).
        videos: camera name (``left_camera``) -> mp4 path, in display order (:func:`order_cameras`).
        rows: rows read (non-blank lines of ``steps.jsonl``; records of ``meta_record.pkl``).
        issues: every problem found, in file order (see the module docstring).
        notes: findings about the episode as a whole added by a caller (e.g. "unknown robot").
        containment: the directory every file of the episode must resolve inside (the discovery's
            :attr:`~genmanip_results.discovery.EpisodeInfo.containment`): readers of ``videos``
            open them within it (:func:`genmanip_results.video.read_video_frames` ``within=``);
            ``None`` (a series built by hand): the episode directory.
    """

    path: Path
    layout: Literal["client", "server"]
    source: Path
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
    latency_t: np.ndarray
    latency_ms: dict[str, np.ndarray]
    frame_timesteps: dict[int, int]
    frames_required: int
    last_obs_t: int
    videos: dict[str, Path]
    rows: int
    issues: tuple[SeriesIssue, ...] = ()
    notes: tuple[str, ...] = ()
    containment: Path | None = None

    @property
    def n_steps(self) -> int:
        """Executed actions recorded (M)."""
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

    @property
    def skipped_rows(self) -> int:
        """Rows left out entirely (their issues have ``skipped=True``)."""
        return len({i.line for i in self.issues if i.skipped})

    def issue_counts(self) -> dict[IssueKind, int]:
        """Issues per kind, only kinds that occurred, in :data:`ISSUE_KINDS` order."""
        counts = {k: 0 for k in ISSUE_KINDS}
        for issue in self.issues:
            counts[issue.kind] += 1
        return {k: n for k, n in counts.items() if n}

    def summary(self) -> str | None:
        """One line saying what was wrong and what was skipped, or None for a clean recording."""
        if not self.issues:
            return None
        counts = ", ".join(f"{n} {k}" for k, n in self.issue_counts().items())
        bad_rows = len({i.line for i in self.issues if i.line is not None})
        skipped = self.skipped_rows
        return (
            f"{self.source.name}: {bad_rows} of {self.rows} rows with problems ({counts}): "
            f"{skipped} skipped, {bad_rows - skipped} kept with gaps"
        )

    @property
    def warnings(self) -> list[str]:
        """Everything a caller should show, one line each: the issues (the first
        ``_MAX_LISTED``, then a count of the rest) and the notes."""
        out = [str(i) for i in self.issues[:_MAX_LISTED]]
        rest = len(self.issues) - _MAX_LISTED
        if rest > 0:
            out.append(f"... and {rest} more ({self.summary()})")
        return out + list(self.notes)

    def frame_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """``(timesteps, frame_indices)``: (F,) int64 each, sorted by frame index — the observation
        timestep every referenced video frame shows."""
        frames = sorted(self.frame_timesteps)
        return (
            np.asarray([self.frame_timesteps[j] for j in frames], dtype=np.int64),
            np.asarray(frames, dtype=np.int64),
        )


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


# ------------------------------------------------------------------------------ value helpers


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _BadValue(ValueError):
    """A field value that is not what the schema says: ``where`` is its full path
    (``action.action[3]``), ``what`` the problem."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")
        self.where = where
        self.what = what


def _flatten(value: Any, where: str, depth: int = 0) -> list[float]:
    """Nested lists/arrays of numbers as one list of floats (NaN allowed, bools not); raises
    :class:`_BadValue` naming the offending element otherwise."""
    if depth > _MAX_DEPTH:
        raise _BadValue(where, "nested too deeply")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            raise _BadValue(where, f"expected numbers, got an array of dtype {value.dtype}")
        return [float(x) for x in value.ravel()]
    if isinstance(value, (list, tuple)):
        out: list[float] = []
        for i, v in enumerate(value):
            out.extend(_flatten(v, f"{where}[{i}]", depth + 1))
        return out
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _BadValue(where, f"expected a number, got {type(value).__name__} {_short(value)}")
    try:
        return [float(value)]
    except OverflowError:  # a JSON integer beyond float range
        raise _BadValue(where, "number out of range") from None


def _vector3(value: Any, where: str) -> list[float]:
    vals = _flatten(value, where)
    if len(vals) != 3:
        raise _BadValue(where, f"expected 3 values, got {len(vals)}")
    return vals


def _is_index(v: Any) -> bool:
    # Bounded: a step, timestep or frame must fit the int64 arrays it ends up in.
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_INDEX


def _flag(values: Iterable[Any]) -> bool | None:
    vals = set(values)
    if len(vals) == 1:
        (v,) = vals
        return v if isinstance(v, bool) else None
    return None


def _mode(items: Sequence[Any]) -> Any:
    """The most common item; ties go to the one seen first."""
    counts: dict[Any, int] = {}
    for it in items:
        counts[it] = counts.get(it, 0) + 1
    best = max(counts.values())
    return next(it for it in items if counts[it] == best)


class _Issues:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[SeriesIssue] = []

    def add(
        self,
        kind: IssueKind,
        line: int | None,
        message: str,
        *,
        field: str | None = None,
        skipped: bool = False,
    ) -> None:
        self.items.append(SeriesIssue(kind, self.source, line, field, message, skipped))


def _matrix(
    vecs: Sequence[list[float] | None],
    lines: Sequence[int],
    name: str,
    issues: _Issues,
    *,
    line_word: str = "line",
) -> np.ndarray:
    """(n, width) float64 of per-row vectors: ``None`` and ragged rows become NaN rows (the ragged
    ones reported); width is the most common length (:func:`_mode`), 0 when no row is usable."""
    lengths = [len(v) for v in vecs if v is not None]
    width = int(_mode(lengths)) if lengths else 0
    out = np.full((len(vecs), width), np.nan, dtype=np.float64)
    first = next(
        (ln for v, ln in zip(vecs, lines, strict=True) if v is not None and len(v) == width), None
    )
    for i, (v, ln) in enumerate(zip(vecs, lines, strict=True)):
        if v is None:
            continue
        if len(v) != width:
            issues.add(
                "ragged",
                ln,
                f"{len(v)} values where the episode's rows have {width} (first on {line_word} "
                f"{first}); kept as a gap",
                field=name,
            )
            continue
        if width:
            out[i] = v
    return out


# ---------------------------------------------------------------- client layout: steps.jsonl


@dataclass
class _Parsed:
    robot_id: str | None
    instruction: str | None
    state_t: np.ndarray
    state: dict[str, np.ndarray]
    action_t: np.ndarray
    action: np.ndarray
    control_type: str
    is_rel: bool | None
    base_motion: np.ndarray | None
    base_is_rel: bool | None
    latency_t: np.ndarray
    latency_ms: dict[str, np.ndarray]
    frame_ts: dict[int, int]
    frames_required: int
    rows: int
    issues: list[SeriesIssue] = field(default_factory=list)


def _read_within(path: Path, root: Path) -> bytes:
    """The recording file's bytes, opened within ``root`` (:func:`read_bytes_within`)."""
    try:
        return read_bytes_within(path, root, field=path.name)
    except UnsafePathError as exc:
        raise SeriesError(
            f"{path.name}: not read: it resolves outside the results root (symlink?)", path=path
        ) from exc
    except OSError as exc:
        raise SeriesError(f"{path.name}: cannot read: {exc.strerror or exc}", path=path) from exc


def _read_lines(
    path: Path, root: Path, *, recording: bool, issues: _Issues
) -> list[tuple[int, Any]]:
    """``(line number, decoded JSON)`` of every usable line; unusable ones become issues."""
    data = _read_within(path, root)
    lines = data.split(b"\n")
    complete_tail = data.endswith(b"\n")
    if complete_tail:
        lines.pop()  # the empty string after the final newline
    out: list[tuple[int, Any]] = []
    for ln, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if ln == len(lines) and not complete_tail and recording:
            issues.add("partial", ln, "row still being written; ignored", skipped=True)
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            issues.add(
                "unreadable", ln, f"not UTF-8 text ({exc.reason}); row skipped", skipped=True
            )
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            issues.add("unreadable", ln, f"not JSON ({exc.msg}); row skipped", skipped=True)
            continue
        except RecursionError:
            issues.add("unreadable", ln, "JSON nested too deeply; row skipped", skipped=True)
            continue
        if not isinstance(row, dict):
            issues.add(
                "unreadable",
                ln,
                f"expected a JSON object per line, got {type(row).__name__}; row skipped",
                skipped=True,
            )
            continue
        out.append((ln, row))
    return out


def _series_from_steps(path: Path, root: Path, *, recording: bool) -> _Parsed:
    issues = _Issues(path.name)
    rows = _read_lines(path, root, recording=recording, issues=issues)
    n_rows = len(rows) + sum(1 for i in issues.items if i.skipped)
    robot_id: str | None = None
    seen_steps: dict[int, int] = {}
    seen_obs: dict[int, int] = {}
    frame_ts: dict[int, int] = {}
    frame_line: dict[int, int] = {}
    # state rows: (obs timestep, line, {key: vector or None})
    states: list[tuple[int, int, dict[str, list[float] | None]]] = []
    state_keys: list[str] = []
    # action rows: (step, line, control type or None, vector or None, base motion)
    actions: list[tuple[int, int, str | None, list[float] | None, list[float] | None]] = []
    any_base = False
    is_rel: list[Any] = []
    base_is_rel: list[Any] = []
    latencies: list[tuple[int, dict[str, float]]] = []
    for ln, row in rows:
        step = row.get("step")
        if not _is_index(step):
            issues.add(
                "invalid",
                ln,
                f"expected a non-negative integer, got {_short(step)}; row skipped",
                field="step",
                skipped=True,
            )
            continue
        if step in seen_steps:
            issues.add(
                "conflict",
                ln,
                f"step {step} already recorded on line {seen_steps[step]} "
                "(rows of two attempts mixed?); row skipped",
                skipped=True,
            )
            continue
        seen_steps[step] = ln
        rid = row.get("robot_id")
        if rid is not None:
            if not isinstance(rid, str):
                issues.add(
                    "invalid",
                    ln,
                    f"expected a string, got {_short(rid)}; ignored",
                    field="robot_id",
                )
            elif robot_id is None:
                robot_id = rid
            elif rid != robot_id:
                issues.add(
                    "conflict",
                    ln,
                    f"{rid!r} differs from {robot_id!r} on earlier rows; ignored",
                    field="robot_id",
                )
        # --- the observation the action was computed from: state and frame
        obs_t = row.get("obs_timestep")
        if not _is_index(obs_t):
            issues.add(
                "invalid",
                ln,
                f"expected a non-negative integer, got {_short(obs_t)}; the row's "
                "state and frame are not used",
                field="obs_timestep",
            )
        elif obs_t > step:
            issues.add(
                "invalid",
                ln,
                f"{obs_t} is after the action's step {step}; the row's state and "
                "frame are not used",
                field="obs_timestep",
            )
        else:
            frame = row.get("frame")
            if frame is not None:
                if not _is_index(frame):
                    issues.add(
                        "invalid",
                        ln,
                        f"expected a non-negative integer or null, got {_short(frame)}; ignored",
                        field="frame",
                    )
                elif frame in frame_ts and frame_ts[frame] != obs_t:
                    issues.add(
                        "conflict",
                        ln,
                        f"frame {frame} is observation timestep {obs_t} here but "
                        f"{frame_ts[frame]} on line {frame_line[frame]}; ignored",
                        field="frame",
                    )
                else:
                    frame_ts[frame] = obs_t
                    frame_line.setdefault(frame, ln)
            row_state = row.get("state")
            if row_state is not None:
                if not isinstance(row_state, dict) or not row_state:
                    issues.add(
                        "invalid",
                        ln,
                        f"expected a non-empty object or null, got {_short(row_state)}; ignored",
                        field="state",
                    )
                elif obs_t in seen_obs:
                    issues.add(
                        "conflict",
                        ln,
                        f"state of observation timestep {obs_t} already recorded "
                        f"on line {seen_obs[obs_t]}; ignored",
                        field="state",
                    )
                else:
                    seen_obs[obs_t] = ln
                    parts: dict[str, list[float] | None] = {}
                    for key, value in row_state.items():
                        k = str(key)
                        if k not in state_keys:
                            state_keys.append(k)
                        try:
                            parts[k] = _flatten(value, f"state.{k}")
                        except _BadValue as exc:
                            issues.add("invalid", ln, f"{exc.what}; kept as a gap", field=exc.where)
                            parts[k] = None
                    states.append((obs_t, ln, parts))
        # --- the executed action
        act = row.get("action")
        ctype: str | None = None
        vec: list[float] | None = None
        base: list[float] | None = None
        if not isinstance(act, dict):
            issues.add(
                "invalid",
                ln,
                f"expected an object, got {_short(act)}; kept as a gap",
                field="action",
            )
        else:
            c = act.get("control_type", "joint_position")
            if c not in _CONTROL_TYPES:
                issues.add(
                    "invalid",
                    ln,
                    f"unsupported {_short(c)}; kept as a gap",
                    field="action.control_type",
                )
            elif "action" not in act:
                issues.add("invalid", ln, "missing; kept as a gap", field="action.action")
            else:
                try:
                    vec = _flatten(act["action"], "action.action")
                    ctype = c
                except _BadValue as exc:
                    issues.add("invalid", ln, f"{exc.what}; kept as a gap", field=exc.where)
            bm = act.get("base_motion")
            if bm is not None:
                any_base = True
                try:
                    base = _vector3(bm, "action.base_motion")
                except _BadValue as exc:
                    issues.add("invalid", ln, f"{exc.what}; kept as a gap", field=exc.where)
                    base = [math.nan] * 3
            is_rel.append(act.get("is_rel"))
            base_is_rel.append(act.get("base_is_rel"))
        actions.append((step, ln, ctype, vec, base))
        # --- latency of the request this row was the first of
        lat = row.get("latency_ms")
        if lat is not None:
            if not isinstance(lat, dict):
                issues.add(
                    "invalid",
                    ln,
                    f"expected an object or null, got {_short(lat)}; ignored",
                    field="latency_ms",
                )
            else:
                parts_ms: dict[str, float] = {}
                for k, v in lat.items():
                    if isinstance(v, bool) or not isinstance(v, (int, float)):
                        issues.add(
                            "invalid",
                            ln,
                            f"expected a number, got {_short(v)}; ignored",
                            field=f"latency_ms.{k}",
                        )
                        continue
                    try:
                        parts_ms[str(k)] = float(v)
                    except OverflowError:
                        issues.add(
                            "invalid", ln, "number out of range; ignored", field=f"latency_ms.{k}"
                        )
                if parts_ms:
                    latencies.append((step, parts_ms))
    # --- one control type per episode: the most common; other rows' actions become gaps
    ctypes = [a[2] for a in actions if a[2] is not None]
    control_type = str(_mode(ctypes)) if ctypes else "joint_position"
    act_vecs: list[list[float] | None] = []
    for _step, ln, ctype, vec, _base in actions:
        if ctype is not None and ctype != control_type:
            issues.add(
                "conflict",
                ln,
                f"{ctype!r} differs from the episode's {control_type!r}; kept as a gap",
                field="action.control_type",
            )
            act_vecs.append(None)
        else:
            act_vecs.append(vec)
    # --- arrays, sorted by time (rows are usually in order already; the sort is stable)
    states.sort(key=lambda s: s[0])
    state_lines = [s[1] for s in states]
    state: dict[str, np.ndarray] = {}
    for k in sorted(state_keys):
        vecs: list[list[float] | None] = []
        for _t, ln, parts in states:
            if k not in parts:
                issues.add(
                    "ragged",
                    ln,
                    "missing where other rows have it; kept as a gap",
                    field=f"state.{k}",
                )
            vecs.append(parts.get(k))
        state[k] = _matrix(vecs, state_lines, f"state.{k}", issues)
    order = np.argsort(np.asarray([a[0] for a in actions], dtype=np.int64), kind="stable")
    act_lines = [actions[i][1] for i in order]
    action = _matrix([act_vecs[i] for i in order], act_lines, "action.action", issues)
    base_motion = (
        np.asarray([actions[i][4] or [0.0, 0.0, 0.0] for i in order], dtype=np.float64)
        if any_base
        else None
    )
    lat_names = sorted({k for _s, p in latencies for k in p})
    latencies.sort(key=lambda x: x[0])
    issues.items.sort(key=lambda i: i.line if i.line is not None else -1)
    return _Parsed(
        robot_id=robot_id,
        instruction=None,
        state_t=np.asarray([s[0] for s in states], dtype=np.int64),
        state=state,
        action_t=np.asarray([actions[i][0] for i in order], dtype=np.int64),
        action=action,
        control_type=control_type,
        is_rel=_flag(is_rel),
        base_motion=base_motion,
        base_is_rel=_flag(base_is_rel),
        latency_t=np.asarray([s for s, _p in latencies], dtype=np.int64),
        latency_ms={
            k: np.asarray([p.get(k, math.nan) for _s, p in latencies], dtype=np.float64)
            for k in lat_names
        },
        frame_ts=frame_ts,
        frames_required=max(frame_ts) + 1 if frame_ts else 0,
        rows=n_rows,
        issues=issues.items,
    )


# ---------------------------------------------------------------- server layout: meta_record.pkl


def _records(value: Any, key: str, issues: _Issues) -> list[list[float] | None] | None:
    """Per-step vectors of ``meta[key]`` (a list of vectors or a 2-D array); None when absent or
    not a sequence at all (reported)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf" or value.ndim == 0:
            issues.add(
                "invalid",
                None,
                f"expected per-step vectors, got an array of dtype "
                f"{value.dtype} and shape {value.shape}; ignored",
                field=key,
            )
            return None
        arr = value.astype(np.float64)
        arr = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
        return [list(map(float, r)) for r in arr]
    if not isinstance(value, (list, tuple)):
        issues.add(
            "invalid",
            None,
            f"expected a list of per-step vectors, got {type(value).__name__}; ignored",
            field=key,
        )
        return None
    out: list[list[float] | None] = []
    for i, v in enumerate(value):
        try:
            out.append(_flatten(v, f"{key}[{i}]"))
        except _BadValue as exc:
            issues.add("invalid", i, f"{exc.what}; kept as a gap", field=exc.where)
            out.append(None)
    return out


def _series_from_meta(path: Path, root: Path, robot_hint: str | None) -> _Parsed:
    from genmanip_protocol.codec import safe_loads

    name = path.name
    issues = _Issues(name)
    data = _read_within(path, root)
    try:
        meta = safe_loads(data)
    except GenmanipError as exc:  # UnsafePayloadError (refused global), DecodeError (corrupt)
        raise SeriesError(f"{name}: {exc}", path=path) from exc
    if not isinstance(meta, dict):
        raise SeriesError(f"{name}: expected a dict, got {type(meta).__name__}", path=path)
    robot_id = meta.get("robot_id", robot_hint)
    if robot_id is not None and not isinstance(robot_id, str):
        issues.add(
            "invalid", None, f"expected a string, got {_short(robot_id)}; ignored", field="robot_id"
        )
        robot_id = robot_hint
    instruction = meta.get("instruction")
    recs: dict[str, list[list[float] | None]] = {}
    for key, part in (
        ("joint_positions", "joints"),
        ("gripper_positions", "gripper"),
        ("base_positions", "base"),
    ):
        r = _records(meta.get(key), key, issues)
        if r is not None:
            recs[part] = r
        elif key != "base_positions" and meta.get(key) is None:
            issues.add("invalid", None, "missing", field=key)
    n = max((len(r) for r in recs.values()), default=0)
    state: dict[str, np.ndarray] = {}
    src_key = {
        "joints": "joint_positions",
        "gripper": "gripper_positions",
        "base": "base_positions",
    }
    for part, r in recs.items():
        if len(r) < n:
            issues.add(
                "ragged",
                None,
                f"{len(r)} records where the episode has {n}; the last {n - len(r)} kept as gaps",
                field=src_key[part],
            )
        padded = r + [None] * (n - len(r))
        state[part] = _matrix(padded, list(range(n)), src_key[part], issues, line_word="record")
    outputs = meta.get("model_output")
    if outputs is None:
        outputs = []
    if not isinstance(outputs, (list, tuple)):
        issues.add(
            "invalid",
            None,
            f"expected a list, got {type(outputs).__name__}; ignored",
            field="model_output",
        )
        outputs = []
    act_vecs: list[list[float] | None] = []
    base_rows: list[list[float]] = []
    nested = False
    any_base = False
    for i, out in enumerate(outputs):
        where = f"model_output[{i}]"
        if not isinstance(out, dict) or "arm_action" not in out:
            issues.add("invalid", i, "expected a dict with arm_action; kept as a gap", field=where)
            act_vecs.append(None)
            base_rows.append([0.0, 0.0, 0.0])
            continue
        arm = out["arm_action"]
        if isinstance(arm, np.ndarray):
            nested = nested or arm.ndim > 1
        elif isinstance(arm, (list, tuple)):
            nested = nested or any(isinstance(a, (list, tuple, np.ndarray)) for a in arm)
        try:
            act_vecs.append(_flatten(arm, f"{where}.arm_action"))
        except _BadValue as exc:
            issues.add("invalid", i, f"{exc.what}; kept as a gap", field=exc.where)
            act_vecs.append(None)
        bm = out.get("base_motion")
        base = [0.0, 0.0, 0.0]
        if bm is not None:
            any_base = True
            try:
                base = _vector3(bm, f"{where}.base_motion")
            except _BadValue as exc:
                issues.add("invalid", i, f"{exc.what}; kept as a gap", field=exc.where)
                base = [math.nan] * 3
        base_rows.append(base)
    action = _matrix(
        act_vecs, list(range(len(act_vecs))), "model_output.arm_action", issues, line_word="record"
    )
    issues.items.sort(key=lambda i: i.line if i.line is not None else -1)
    # The server's recorder (as the testbed reproduces it) stores the reset observation's frame,
    # then after every step the applied action, the resulting state and that observation's frame:
    # row i = action of step i and the state at timestep i + 1; frame j = timestep j.
    return _Parsed(
        robot_id=robot_id,
        instruction=instruction if isinstance(instruction, str) else None,
        state_t=np.arange(1, n + 1, dtype=np.int64),
        state=state,
        action_t=np.arange(len(act_vecs), dtype=np.int64),
        action=action,
        control_type="ee_pose" if nested else "joint_position",
        is_rel=None,
        base_motion=np.asarray(base_rows, dtype=np.float64) if any_base else None,
        base_is_rel=None,
        latency_t=np.zeros(0, dtype=np.int64),
        latency_ms={},
        frame_ts={j: j for j in range(n + 1)} if n else {},
        frames_required=n,
        rows=max(n, len(act_vecs)),
        issues=issues.items,
    )


# ---------------------------------------------------------------- public entry point


def load_series(episode: EpisodeInfo | str | os.PathLike[str]) -> EpisodeSeries:
    """Load the series of one episode of either layout (see the module docstring for the policy
    on bad rows: they are reported in :attr:`EpisodeSeries.issues`, never raised).

    Args:
        episode: the episode directory, or its :class:`~genmanip_results.discovery.EpisodeInfo`
            (then nothing is scanned again).

    Raises:
        SeriesNotFoundError: not a directory, or neither ``steps.jsonl`` nor ``meta_record.pkl``.
        SeriesError: the recording file cannot be read, or ``meta_record.pkl`` is refused by the
            allow-list, corrupt or not a dict (one line naming the file).
        GenmanipResultsError: the results discovery could not read the episode directory.
    """
    from .discovery import EpisodeInfo, load_episode

    if isinstance(episode, EpisodeInfo):
        info = episode
    else:
        ep_dir = Path(episode)
        if not ep_dir.is_dir():
            raise SeriesNotFoundError(f"{ep_dir}: not a directory", path=ep_dir)
        info = load_episode(ep_dir)
    ep_dir = Path(info.path)
    if info.steps_file is not None and Path(info.steps_file).is_file():
        layout: Literal["client", "server"] = "client"
        source = Path(info.steps_file)
        # While recording (INCOMPLETE and no result yet: result.json decides) the last line may be
        # the row being written.
        recording = not info.complete and (ep_dir / INCOMPLETE).exists()
        parsed = _series_from_steps(source, info.containment, recording=recording)
        # result.json (read by the results discovery) carries the instruction.
        parsed.instruction = info.instruction
        parsed.robot_id = parsed.robot_id or info.robot_id
    elif info.meta_record is not None and Path(info.meta_record).is_file():
        layout = "server"
        source = Path(info.meta_record)
        parsed = _series_from_meta(source, info.containment, info.robot_id)
        parsed.instruction = parsed.instruction or info.instruction
    else:
        raise SeriesNotFoundError(
            f"{ep_dir}: no {STEPS_JSONL} or {META_RECORD} (nothing recorded for this episode)",
            path=ep_dir,
        )
    last_act = int(parsed.action_t.max()) + 1 if parsed.action_t.size else 0
    last_state = int(parsed.state_t.max()) if parsed.state_t.size else 0
    return EpisodeSeries(
        path=ep_dir,
        layout=layout,
        source=source,
        episode_id=info.episode_id,
        robot_id=parsed.robot_id,
        robot=_robot_for(parsed.robot_id),
        instruction=parsed.instruction,
        state_t=parsed.state_t,
        state=parsed.state,
        action_t=parsed.action_t,
        action=parsed.action,
        control_type=parsed.control_type,
        is_rel=parsed.is_rel,
        base_motion=parsed.base_motion,
        base_is_rel=parsed.base_is_rel,
        latency_t=parsed.latency_t,
        latency_ms=parsed.latency_ms,
        frame_timesteps=parsed.frame_ts,
        frames_required=parsed.frames_required,
        last_obs_t=max(last_act, last_state),
        videos=order_cameras({str(k): Path(v) for k, v in info.videos.items()}),
        rows=parsed.rows,
        issues=tuple(parsed.issues),
        containment=info.containment,
    )
