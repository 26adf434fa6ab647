"""``gmp validate``: check action / observation / ``steps.jsonl`` files before a run finds out.

Formats: JSON, JSON lines, msgpack (the genmanip frame or plain msgpack) and pickle — pickle
only through the allow-list unpickler (:func:`genmanip_protocol.codec.safe_loads`, via
:class:`~genmanip_protocol.codec.LegacyCodec`), so validating a hostile file cannot run code.
Every format is read within the codec's decoding limits (``genmanip_protocol.codec.limits``:
depth, container and value counts, array shapes; JSON text is measured before ``json.loads``), so
a hostile file is a finding (exit 4), never a crash or a runaway allocation.

What a file may hold (``--kind auto`` tells them apart by shape):

* an action dict, a ``/step`` body ``{worker_id: action}``, a chunk (a list of either, or
  ``{worker_id: [action, ...]}``) — checked with :func:`genmanip_protocol.check_action`;
* an observation, or a ``/step`` reply ``{worker_id: {"obs": ...}}`` — checked with
  :func:`genmanip_protocol.check_observation`; decoded msgpack and pickle replies hold
  :class:`~genmanip_protocol.codec.Observation` mappings whose JPEG camera frames
  (:class:`~genmanip_protocol.codec.JpegFrame`) are checked by their header, never decoded;
* ``steps.jsonl`` rows of this project's recordings (schema in ``docs/architecture.md``):
  row fields, the row's action, and step continuity within each episode.

Every violation is printed on stdout as ``<location>: <field>: expected ..., got ...`` where the
location is ``file:line`` (JSON lines) or ``file[3].action`` (a path into the object); a summary
goes to stderr. Exit 0 when clean, ``ExitCode.INVALID_INPUT`` (4) when anything is wrong.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genmanip_protocol import (
    ExitCode,
    RobotSpec,
    ValidationError,
    Violation,
    check_action,
    check_observation,
    get_robot,
    safe_relative_path,
)
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec, Observation
from genmanip_protocol.codec.jpeg import jpeg_size
from genmanip_protocol.codec.limits import check_json_limits
from genmanip_protocol.errors import ConfigError, DecodeError
from genmanip_results.layout import STEPS_JSONL
from genmanip_runtime.console import Console

__all__ = ["KINDS", "Report", "run_validate", "validate_file", "validate_object"]

KINDS = ("auto", "action", "observation", "steps")

_JSONL_SUFFIXES = {".jsonl", ".ndjson"}
_JSON_SUFFIXES = {".json"}
_PICKLE_SUFFIXES = {".pkl", ".pickle", ".pkl5"}
_MSGPACK_SUFFIXES = {".msgpack", ".mpk", ".msgpk", ".gmpk"}
_STEP_ROW_KEYS = {
    "episode_id", "worker_id", "robot_id", "step", "obs_timestep", "frame", "state", "action",
    "chunk", "latency_ms",
}


@dataclass
class Report:
    """What :func:`validate_file` found: ``records`` checked and every ``violations`` item."""

    records: int = 0
    violations: list[Violation] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, location: str, field_: str, expected: str, actual: str) -> None:
        self.violations.append(Violation(field_, expected, actual, location=location))

    def extend(self, location: str, found: list[Violation]) -> None:
        for v in found:
            # Keep the validator's own location when it set a more precise one.
            v.location = location if not v.location else v.location
            self.violations.append(v)

    def count(self, kind: str) -> None:
        self.records += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1


# -- reading -------------------------------------------------------------------------------------


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_objects(path: Path, report: Report) -> Iterator[tuple[str, Any]]:
    """Yield ``(location, object)`` for every record of ``path``; format errors become violations."""
    name = str(path)
    suffix = path.suffix.lower()
    try:
        if suffix in _JSONL_SUFFIXES:
            yield from _read_jsonl(path, report)
            return
        data = path.read_bytes()
    except OSError as exc:
        report.add(name, "file", "a readable file", f"{type(exc).__name__}: {exc.strerror or exc}")
        return
    if not data.strip():
        report.add(name, "file", "a JSON, JSON lines, msgpack or pickle document", "an empty file")
        return
    fmt = _sniff(suffix, data)
    try:
        if fmt == "pickle":
            obj = LegacyCodec().decode(data)
        elif fmt == "msgpack":
            obj = _decode_msgpack(data)
        else:
            try:
                obj = _loads_json(data, "document")
            except (ValueError, DecodeError):
                if fmt == "json" and suffix in _JSON_SUFFIXES:
                    raise
                # Several JSON documents, one per line, in a file without the .jsonl suffix
                # (each line is then measured and parsed on its own).
                yield from _read_jsonl(path, report)
                return
    except DecodeError as exc:
        report.add(name, "file", f"a valid {fmt} document", _short(str(exc), 200))
        return
    except ValueError as exc:
        report.add(name, "file", "valid JSON", _short(str(exc), 200))
        return
    yield name, obj


def _sniff(suffix: str, data: bytes) -> str:
    if suffix in _PICKLE_SUFFIXES:
        return "pickle"
    if suffix in _MSGPACK_SUFFIXES or data[:4] == b"GMPK":
        return "msgpack"
    if suffix in _JSON_SUFFIXES:
        return "json"
    head = data.lstrip()[:1]
    if data[:1] == b"\x80":  # pickle protocol >= 2 starts with PROTO
        return "pickle"
    if head in (b"{", b"[", b'"') or head.isdigit():
        return "json"
    return "msgpack"


def _decode_msgpack(data: bytes) -> Any:
    if data[:4] == b"GMPK":
        return MsgpackCodec().decode(data)
    # Same limits as the wire (depth, containers, values): 4 MB of 0x90 were 4 million lists.
    return MsgpackCodec().decode_plain(data)


def _loads_json(data: bytes, what: str) -> Any:
    # json.loads recurses once per level (100,000 "[" end in RecursionError, i.e. exit 70) and
    # allocates a list per "[]": the text is measured first, in linear time (DecodeError).
    check_json_limits(data, what=f"JSON {what}")
    return json.loads(data)


def _read_jsonl(path: Path, report: Report) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            loc = f"{path}:{lineno}"
            try:
                yield loc, _loads_json(raw, "line")
            except DecodeError as exc:
                report.add(loc, "line", "one JSON value within the decoding limits",
                           _short(str(exc)))
            except ValueError as exc:
                report.add(loc, "line", "one JSON value", _short(str(exc)))


# -- classification ------------------------------------------------------------------------------


def _is_action(obj: Any) -> bool:
    return isinstance(obj, dict) and ("action" in obj or "control_type" in obj) and not _is_step_row(obj)


def _is_step_row(obj: Any) -> bool:
    return isinstance(obj, dict) and "action" in obj and (
        "obs_timestep" in obj or ("step" in obj and "episode_id" in obj)
    )


def _is_observation(obj: Any) -> bool:
    # A decoded observation is a genmanip_protocol Observation (a mapping, not a dict) whose
    # camera values may be still-encoded JpegFrames; keys() lists them without decoding.
    if not isinstance(obj, Mapping):
        return False
    return any(
        isinstance(k, str) and (k.startswith(("state.", "video.")) or k in ("instruction", "timestep"))
        for k in obj.keys()
    )


def _raw_items(obs: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """An observation's items without decoding a camera frame (an Observation's raw items)."""
    return obs.raw_items() if isinstance(obs, Observation) else list(obs.items())


def _check_jpeg_frames(obs: Mapping[Any, Any], loc: str, report: Report) -> None:
    """A still-encoded frame is checked by its header (no decode): a JPEG, of its declared shape."""
    for key, value in _raw_items(obs):
        if not isinstance(value, JpegFrame):
            continue
        want = f"a JPEG of the declared {value.shape[0]}x{value.shape[1]}"
        try:
            h, w = jpeg_size(value.data)
        except DecodeError as exc:
            report.add(loc, str(key), want, _short(str(exc)))
            continue
        if (h, w, 3) != value.shape:
            report.add(loc, str(key), want, f"a {h}x{w} JPEG header")


def _is_entry(obj: Any) -> bool:
    return isinstance(obj, dict) and "obs" in obj and ("metric" in obj or "episode_result" in obj)


# -- checking ------------------------------------------------------------------------------------


class _Checker:
    def __init__(self, robot: RobotSpec | None, kind: str, report: Report) -> None:
        self.robot = robot
        self.kind = kind
        self.report = report
        self._missing_robot_reported: set[str] = set()
        self._last_step: dict[str, tuple[int, str]] = {}

    def _robot_for(self, obj: Any, loc: str, file_key: str) -> RobotSpec | None:
        if self.robot is not None:
            return self.robot
        rid = obj.get("robot_id") if isinstance(obj, Mapping) else None
        if isinstance(rid, str):
            try:
                return get_robot(rid)
            except ValidationError as exc:
                self.report.extend(loc, exc.violations)
                return None
        if file_key not in self._missing_robot_reported:
            self._missing_robot_reported.add(file_key)
            self.report.add(loc, "robot_id", "a robot (pass --robot ID)", "none in the data")
        return None

    def check(self, loc: str, obj: Any, file_key: str, *, path: str = "") -> None:
        kind = self.kind
        here = f"{loc}{path}"
        if kind in ("steps", "auto") and _is_step_row(obj):
            self.report.count("steps")
            self._check_row(here, obj, file_key)
            return
        if kind == "steps":
            self.report.count("steps")
            self.report.add(here, "row", "a steps.jsonl row (a JSON object with 'action', "
                            "'step', 'episode_id', ...)", _type_name(obj))
            return
        if kind in ("action", "auto") and _is_action(obj):
            self.report.count("action")
            robot = self._robot_for(obj, here, file_key)
            if robot is not None:
                self.report.extend(here, check_action(robot, obj, location=here))
            return
        if kind in ("observation", "auto") and _is_observation(obj):
            self.report.count("observation")
            robot = self._robot_for(obj, here, file_key)
            if robot is not None:
                self.report.extend(here, check_observation(robot, obj))
            _check_jpeg_frames(obj, here, self.report)
            return
        if isinstance(obj, dict) and obj:
            values = list(obj.values())
            if "obs" in obj and "executed_steps" in obj:  # a /step_chunk reply
                self.check(loc, obj["obs"], file_key, path=f"{path}.obs")
                return
            if all(_is_entry(v) for v in values) and kind != "action":  # a /step or /reset reply
                for wid, entry in obj.items():
                    ob = entry.get("obs")
                    if ob is None or (isinstance(ob, Mapping) and ob.get("reset_pending")):
                        continue
                    self.check(loc, ob, file_key, path=f"{path}[{wid!r}].obs")
                return
            if all(isinstance(v, (Mapping, list)) for v in values):  # {wid: action} / {wid: [actions]}
                for wid, v in obj.items():
                    self.check(loc, v, file_key, path=f"{path}[{wid!r}]")
                return
        if isinstance(obj, list) and obj:
            for i, item in enumerate(obj):
                self.check(loc, item, file_key, path=f"{path}[{i}]")
            return
        self.report.count("unknown")
        expected = {
            "auto": "an action, an observation or a steps.jsonl row",
            "action": "an action dict with 'action' and 'control_type'",
            "observation": "an observation dict (state.*, video.*, instruction, ...)",
        }[kind]
        self.report.add(here, "value", expected, _describe(obj))

    def _check_row(self, loc: str, row: dict[str, Any], file_key: str) -> None:
        add = self.report.add
        unknown = sorted(str(k) for k in row if k not in _STEP_ROW_KEYS)
        if unknown:
            add(loc, "row", f"only the keys {', '.join(sorted(_STEP_ROW_KEYS))}",
                f"also {', '.join(unknown)}")
        for name in ("episode_id", "worker_id", "robot_id", "step", "obs_timestep", "action"):
            if name not in row:
                add(loc, name, "present", "missing")
        ep = row.get("episode_id")
        if "episode_id" in row:
            try:
                safe_relative_path(ep, field="episode_id")
            except ValidationError as exc:
                self.report.extend(loc, exc.violations)
        wid = row.get("worker_id")
        if "worker_id" in row and not isinstance(wid, str):
            add(loc, "worker_id", "a string", _describe(wid))
        step = row.get("step")
        if "step" in row and not _is_int(step, 0):
            add(loc, "step", "an int >= 0", _describe(step))
            step = None
        ots = row.get("obs_timestep")
        if "obs_timestep" in row and not _is_int(ots, 0):
            add(loc, "obs_timestep", "an int >= 0", _describe(ots))
        elif _is_int(ots, 0) and step is not None and ots > step:
            add(loc, "obs_timestep", f"<= step ({step}): an action comes from an earlier "
                "observation", str(ots))
        frame = row.get("frame")
        if frame is not None and not _is_int(frame, 0):
            add(loc, "frame", "an int >= 0 or null", _describe(frame))
        state = row.get("state")
        if state is not None:
            if not isinstance(state, dict):
                add(loc, "state", "an object or null", _describe(state))
            else:
                for key, val in state.items():
                    if not (isinstance(val, list) and all(_is_finite(x) for x in val)):
                        add(loc, f"state.{key}", "a list of finite numbers", _describe(val))
        chunk = row.get("chunk")
        if chunk is not None:
            if not (isinstance(chunk, dict) and _is_int(chunk.get("index"), 0)
                    and _is_int(chunk.get("size"), 1) and chunk["index"] < chunk["size"]):
                add(loc, "chunk", '{"index": i, "size": n} with 0 <= i < n, or null',
                    _describe(chunk))
        lat = row.get("latency_ms")
        if lat is not None:
            if not isinstance(lat, dict) or not all(
                v is None or (_is_finite(v) and v >= 0) for v in lat.values()
            ):
                add(loc, "latency_ms", "an object of non-negative numbers, or null", _describe(lat))
        # Rows of one episode are consecutive steps: a gap or a repeat means rows from several
        # attempts were mixed, or rows were lost.
        if isinstance(ep, str) and step is not None:
            prev = self._last_step.get(ep)
            if prev is not None and step != prev[0] + 1:
                add(loc, "step", f"{prev[0] + 1} (previous row {prev[1]} has step {prev[0]})",
                    str(step))
            self._last_step[ep] = (step, loc)
        if "action" in row:
            robot = self._robot_for(row, loc, file_key)
            if robot is not None:
                self.report.extend(f"{loc}.action", check_action(robot, row["action"],
                                                                 location=f"{loc}.action"))


def _is_int(x: Any, minimum: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= minimum


def _is_finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _type_name(obj: Any) -> str:
    return "null" if obj is None else type(obj).__name__


def _describe(obj: Any) -> str:
    text = json.dumps(obj, default=repr) if isinstance(obj, (dict, list, str, int, float)) else repr(obj)
    return _short(f"{_type_name(obj)} {text}" if not isinstance(obj, (int, float)) else text, 80)


# -- API -----------------------------------------------------------------------------------------


def validate_object(obj: Any, *, robot: str | RobotSpec | None = None, kind: str = "auto",
                    location: str = "<object>") -> Report:
    """Validate one in-memory object like a file's content; returns the :class:`Report`."""
    if kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    report = Report()
    spec = get_robot(robot) if robot is not None else None
    _Checker(spec, kind, report).check(location, obj, location)
    return report


def validate_file(path: str | Path, *, robot: str | RobotSpec | None = None,
                  kind: str = "auto") -> Report:
    """Validate every record of ``path`` (see the module docstring for formats and kinds)."""
    if kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    p = Path(path)
    report = Report()
    spec = get_robot(robot) if robot is not None else None
    checker = _Checker(spec, "steps" if kind == "auto" and p.name == STEPS_JSONL else kind, report)
    for loc, obj in _read_objects(p, report):
        checker.check(loc, obj, str(p))
    return report


_NOUNS = {"action": "action", "observation": "observation", "steps": "steps.jsonl row",
          "unknown": "unrecognised value"}


def _plural(n: int, kind: str) -> str:
    noun = _NOUNS.get(kind, kind)
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run_validate(*, files: list[str], robot: str | None, kind: str, console: Console) -> int:
    """``gmp validate [--robot ID] [--kind K] FILE...``: violations on stdout, summary on stderr."""
    kind = kind or "auto"
    if robot is not None:
        try:
            get_robot(robot)
        except ValidationError as exc:
            raise ConfigError(f"--robot: {exc}") from None
    total = Report()
    bad_files = 0
    out = sys.stdout
    for name in files:
        report = validate_file(name, robot=robot, kind=kind)
        total.records += report.records
        for k, n in report.kinds.items():
            total.kinds[k] = total.kinds.get(k, 0) + n
        if report.violations:
            bad_files += 1
        for v in report.violations:
            out.write(f"{v}\n")
        total.violations.extend(report.violations)
    out.flush()
    what = ", ".join(_plural(n, k) for k, n in sorted(total.kinds.items())) or "no records"
    nfiles = len(files)
    files_text = f"{nfiles} file{'s' if nfiles != 1 else ''}"
    if total.violations:
        n = len(total.violations)
        console.error(f"{n} violation{'s' if n != 1 else ''} in {bad_files} of {files_text} ({what})")
        return int(ExitCode.INVALID_INPUT)
    console.success(f"{files_text} clean ({what})")
    return int(ExitCode.OK)
