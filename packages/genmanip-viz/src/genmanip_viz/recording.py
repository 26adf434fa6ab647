"""Build an episode's Rerun recording (``.genmanip_vis.rrd``) from what is on disk.

Inputs, per layout (see ``docs/architecture.md``):

* client layout: ``steps.jsonl`` (one row per executed action) + ``<camera>.mp4`` + ``result.json``;
* server layout: ``<camera>.mp4`` + ``meta_record.pkl`` (read only through the allow-list unpickler
  ``genmanip_protocol.codec.safe_loads``) + ``result_info.json``; when the server wrote its own
  ``episode.rrd`` that file is used as is and nothing is built.

The recording has one timeline, ``step`` (a sequence: the simulator timestep). Each camera's mp4 goes in
once as an ``AssetVideo`` (the encoded bytes, not per-frame images) and every step refers into it with a
``VideoFrameReference``, so the recording is about as large as the source videos plus a few KiB of
series. The blueprint (one video panel per camera, state and action plots, instruction and result text)
is declared in code and saved as the recording's default blueprint.

Freshness: a JSON sidecar ``.genmanip_vis.rrd.json`` next to the recording stores the size and mtime of
every input plus the builder version; the recording is rebuilt when any of them changed. Writes go to
``<name>.part`` and are renamed into place, so a reader never sees half a recording.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import RecordingBuildError, VizDependencyError

if TYPE_CHECKING:
    from genmanip_results.discovery import EpisodeInfo

__all__ = [
    "BUILDER_VERSION",
    "RRD_NAME",
    "SIDECAR_NAME",
    "EpisodeData",
    "build_recording",
    "input_fingerprint",
    "load_episode_data",
    "recording_is_fresh",
    "recording_path",
]

#: Name of the recording this package writes next to an episode's files.
RRD_NAME = ".genmanip_vis.rrd"
#: Sidecar with the inputs' sizes/mtimes the recording was built from.
SIDECAR_NAME = ".genmanip_vis.rrd.json"
#: Bumped whenever the recording's content or blueprint changes, so old recordings are rebuilt.
BUILDER_VERSION = 3
#: The server's own recording (written with ``--save_process`` when rerun-sdk is installed there).
SERVER_RRD_NAME = "episode.rrd"

_INPUT_NAMES = ("steps.jsonl", "meta_record.pkl", "result.json", "result_info.json")


def _rerun() -> Any:
    try:
        import rerun
    except ImportError as exc:  # pragma: no cover - exercised only without the dependency
        raise VizDependencyError(
            "episode replay needs rerun-sdk 0.41",
            hint="pip install 'genmanip-viz' (it depends on rerun-sdk==0.41.*)",
        ) from exc
    return rerun


@dataclass
class EpisodeData:
    """Everything a recording is built from, already aligned on the ``step`` timeline.

    Arrays: ``*_steps`` are int64 ``(N,)`` timeline values; the matching value arrays are float64
    ``(N, D)`` (joint positions in rad or m as the joint is; actions in the action's own units).
    ``frames[camera]`` is ``(steps, frame_indices)``: at timeline step ``steps[i]`` camera shows its
    video frame ``frame_indices[i]`` (0-based index into the mp4).
    """

    episode_id: str
    layout: str
    instruction: str = ""
    robot_id: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    videos: dict[str, Path] = field(default_factory=dict)
    state: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    action: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    frames: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    n_steps: int = 0


def recording_path(episode_dir: Path) -> Path:
    """The recording this package builds for the episode directory ``episode_dir``."""
    return Path(episode_dir) / RRD_NAME


def _input_paths(episode: EpisodeInfo) -> list[Path]:
    paths = [Path(p) for p in episode.videos.values()]
    for name in _INPUT_NAMES:
        p = Path(episode.path) / name
        if p.is_file():
            paths.append(p)
    return sorted(paths)


def input_fingerprint(episode: EpisodeInfo) -> dict[str, Any]:
    """Sizes and mtimes (ns) of every input of ``episode``'s recording, keyed by file name."""
    files: dict[str, list[int]] = {}
    for p in _input_paths(episode):
        try:
            st = p.stat()
        except OSError:
            continue
        files[p.name] = [st.st_size, st.st_mtime_ns]
    return {"builder": BUILDER_VERSION, "files": files}


def recording_is_fresh(episode: EpisodeInfo) -> bool:
    """True when ``episode``'s ``.genmanip_vis.rrd`` exists and was built from its current inputs."""
    rrd = recording_path(episode.path)
    sidecar = Path(episode.path) / SIDECAR_NAME
    if not rrd.is_file() or not sidecar.is_file():
        return False
    try:
        recorded = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(recorded == input_fingerprint(episode))


# --------------------------------------------------------------------------------------------------
# Loading the inputs
# --------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RecordingBuildError(f"{path}: unreadable JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _as_vector(value: Any) -> np.ndarray | None:
    """A finite-or-NaN float64 vector from a list/array, or None when it is not numeric."""
    try:
        arr = np.asarray(value, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return None
    return arr if arr.size else None


def _stack(
    steps: Sequence[int], rows: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Stack same-length vectors; rows whose length differs from the most common one are dropped."""
    if not rows:
        return None
    lengths = [r.size for r in rows]
    width = max(set(lengths), key=lengths.count)
    keep = [i for i, n in enumerate(lengths) if n == width]
    return (
        np.asarray([steps[i] for i in keep], dtype=np.int64),
        np.vstack([rows[i] for i in keep]),
    )


def _load_client(episode: EpisodeInfo, data: EpisodeData) -> None:
    steps_file = episode.steps_file or Path(episode.path) / "steps.jsonl"
    state_rows: dict[str, tuple[list[int], list[np.ndarray]]] = {}
    action_rows: dict[str, tuple[list[int], list[np.ndarray]]] = {}
    frame_steps: list[int] = []
    frame_idx: list[int] = []
    last_step = -1
    try:
        fh = open(steps_file, encoding="utf-8")
    except FileNotFoundError:
        fh = None
    except OSError as exc:
        raise RecordingBuildError(f"{steps_file}: cannot read ({exc})") from exc
    if fh is not None:
        with fh:
            for lineno, raw in enumerate(fh, 1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    # The last line of an episode that is still being written may be partial.
                    continue
                if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                    raise RecordingBuildError(f"{steps_file}:{lineno}: row has no integer 'step'")
                step = int(row["step"])
                last_step = max(last_step, step)
                obs_t = row.get("obs_timestep")
                obs_step = int(obs_t) if isinstance(obs_t, int) else step
                data.robot_id = data.robot_id or str(row.get("robot_id") or "")
                state = row.get("state")
                if isinstance(state, dict):
                    for key, value in state.items():
                        vec = _as_vector(value)
                        if vec is not None:
                            s, v = state_rows.setdefault(str(key), ([], []))
                            s.append(obs_step)
                            v.append(vec)
                    frame = row.get("frame")
                    if isinstance(frame, int) and frame >= 0:
                        frame_steps.append(obs_step)
                        frame_idx.append(frame)
                action = row.get("action")
                if isinstance(action, dict):
                    vec = _as_vector(action.get("action"))
                    if vec is not None:
                        s, v = action_rows.setdefault("arm", ([], []))
                        s.append(step)
                        v.append(vec)
                    base = _as_vector(action.get("base_motion"))
                    if base is not None and _is_mobile(episode, data):
                        s, v = action_rows.setdefault("base_motion", ([], []))
                        s.append(step)
                        v.append(base)
    for key, (s, v) in state_rows.items():
        stacked = _stack(s, v)
        if stacked is not None:
            data.state[key] = stacked
    for key, (s, v) in action_rows.items():
        stacked = _stack(s, v)
        if stacked is not None:
            data.action[key] = stacked
    if frame_steps:
        fs = np.asarray(frame_steps, dtype=np.int64)
        fi = np.asarray(frame_idx, dtype=np.int64)
        for cam in data.videos:
            data.frames[cam] = (fs, fi)
    data.n_steps = last_step + 1
    result = _read_json(Path(episode.path) / "result.json")
    data.instruction = str(result.get("instruction") or "")
    data.robot_id = data.robot_id or str(result.get("robot_id") or "")
    data.result = {
        k: result[k]
        for k in ("score", "sr", "steps", "worker_id", "started", "finished")
        if k in result
    }


def _is_mobile(episode: EpisodeInfo, data: EpisodeData) -> bool:
    """Whether the episode's robot has a mobile base (dual-arm robots); unknown robots: yes."""
    try:
        from genmanip_protocol.robots import get_robot

        return bool(get_robot(data.robot_id).dual_arm) if data.robot_id else True
    except Exception:  # an unknown robot id must not stop a replay
        return True


def _load_server(episode: EpisodeInfo, data: EpisodeData) -> None:
    from genmanip_protocol.codec import safe_loads

    meta_path = episode.meta_record or Path(episode.path) / "meta_record.pkl"
    meta: Any = {}
    if Path(meta_path).is_file():
        try:
            meta = safe_loads(Path(meta_path).read_bytes())
        except Exception as exc:
            raise RecordingBuildError(f"{meta_path}: cannot load ({exc})") from exc
    if not isinstance(meta, Mapping):
        meta = {}
    data.instruction = str(meta.get("instruction") or "")
    data.robot_id = str(meta.get("robot_id") or "")
    n = 0
    for key, name in (
        ("joint_positions", "joints"),
        ("gripper_positions", "gripper"),
        ("base_positions", "base"),
    ):
        seq = meta.get(key)
        if isinstance(seq, (list, tuple)) or (isinstance(seq, np.ndarray) and seq.ndim >= 1):
            vecs = [_as_vector(x) for x in seq]
            pairs = [(i, v) for i, v in enumerate(vecs) if v is not None]
            stacked = _stack([i for i, _ in pairs], [v for _, v in pairs])
            if stacked is not None:
                data.state[name] = stacked
                n = max(n, len(seq))
    outputs = meta.get("model_output")
    if isinstance(outputs, (list, tuple)):
        arm_s: list[int] = []
        arm_v: list[np.ndarray] = []
        base_s: list[int] = []
        base_v: list[np.ndarray] = []
        for i, out in enumerate(outputs):
            if not isinstance(out, Mapping):
                continue
            vec = _as_vector(out.get("arm_action"))
            if vec is not None:
                arm_s.append(i)
                arm_v.append(vec)
            base = _as_vector(out.get("base_motion"))
            if base is not None:
                base_s.append(i)
                base_v.append(base)
        for name, s, v in (("arm", arm_s, arm_v), ("base_motion", base_s, base_v)):
            stacked = _stack(s, v)
            if stacked is not None:
                data.action[name] = stacked
        n = max(n, len(outputs))
    data.n_steps = n
    result = _read_json(Path(episode.path) / "result_info.json")
    data.result = {k: result[k] for k in ("score", "success_rate", "sr") if k in result}


def load_episode_data(episode: EpisodeInfo) -> EpisodeData:
    """Read ``episode``'s inputs (either layout) into an :class:`EpisodeData`."""
    data = EpisodeData(
        episode_id=episode.episode_id,
        layout=episode.layout,
        videos={str(k): Path(v) for k, v in sorted(episode.videos.items())},
    )
    if episode.layout == "server":
        _load_server(episode, data)
    else:
        _load_client(episode, data)
    return data


# --------------------------------------------------------------------------------------------------
# Writing the recording
# --------------------------------------------------------------------------------------------------


def _blueprint(data: EpisodeData) -> Any:
    import rerun.blueprint as rrb

    cams = [rrb.Spatial2DView(origin=f"cameras/{cam}", name=cam) for cam in data.videos]

    def plot(group: str, key: str, width: int) -> Any:
        # Legends of 12- or 16-wide series would cover the curves; hovering names them anyway.
        return rrb.TimeSeriesView(
            origin=f"{group}/{key}",
            name=f"{group}: {key}",
            plot_legend=rrb.PlotLegend(visible=width <= 4),
        )

    plots = [plot("state", k, v[1].shape[1]) for k, v in data.state.items()] + [
        plot("action", k, v[1].shape[1]) for k, v in data.action.items()
    ]
    text = [
        rrb.TextDocumentView(origin="instruction", name="instruction"),
        rrb.TextDocumentView(origin="result", name="result"),
    ]
    rows: list[Any] = []
    if cams:
        rows.append(rrb.Grid(*cams, name="cameras"))
    lower: list[Any] = []
    if plots:
        lower.append(rrb.Grid(*plots, name="series"))
    lower.append(rrb.Vertical(*text, name="episode", row_shares=[1, 1]))
    rows.append(rrb.Horizontal(*lower, column_shares=[3, 1] if plots else None))
    return rrb.Blueprint(
        rrb.Vertical(*rows, row_shares=[3, 2] if cams else None),
        # Collapsed time panel = the compact play/scrub bar: the panels get the space.
        rrb.TimePanel(state="collapsed"),
        rrb.BlueprintPanel(state="collapsed"),
        rrb.SelectionPanel(state="collapsed"),
        collapse_panels=False,
    )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _result_markdown(data: EpisodeData) -> str:
    lines = [f"**episode** `{data.episode_id}`", ""]
    if data.robot_id:
        lines.append(f"- robot: `{data.robot_id}`")
    lines.append(f"- layout: {data.layout}")
    lines.append(f"- steps: {data.n_steps}")
    for key, value in data.result.items():
        lines.append(f"- {key}: {_fmt(value)}")
    return "\n".join(lines)


def _recording_id(episode_id: str) -> uuid.UUID:
    # Stable per episode so re-opening a rebuilt recording replaces rather than duplicates it.
    return uuid.UUID(bytes=hashlib.sha256(episode_id.encode("utf-8")).digest()[:16], version=4)


def _browser_playable(mp4: Path, layout: str, tmpdir: Path) -> Path:
    """``mp4`` itself when browsers can decode it, else an H.264 copy in ``tmpdir``.

    This project's recordings are H.264 already (no probe). The real server falls back to ``mp4v``
    (MPEG-4 Part 2), which no browser decodes: those are transcoded for the recording only.
    """
    if layout == "client":
        return mp4
    from genmanip_results.video import ffmpeg_executable, video_info

    try:
        codec = video_info(mp4).codec
    except Exception as exc:
        raise RecordingBuildError(f"{mp4}: cannot read video ({exc})") from exc
    if codec in ("h264", "hevc", "av1", "vp9"):
        return mp4
    import subprocess

    target = tmpdir / f"{mp4.stem}.h264.mp4"
    args = [
        ffmpeg_executable(), "-nostdin", "-loglevel", "error", "-y", "-i", str(mp4),
        "-map", "0:v:0", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
        "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-movflags", "+faststart", str(target),
    ]  # fmt: skip
    res = subprocess.run(args, capture_output=True, check=False, timeout=600)
    if res.returncode != 0:
        tail = res.stderr.decode("utf-8", "replace")[-400:]
        raise RecordingBuildError(f"{mp4}: cannot transcode {codec} video to H.264 ({tail})")
    return target


def _write(data: EpisodeData, out: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gmp-viz-") as tmp:
        _write_in(data, out, Path(tmp))


def _write_in(data: EpisodeData, out: Path, tmpdir: Path) -> None:
    rr = _rerun()
    rec = rr.RecordingStream(
        "genmanip", recording_id=_recording_id(data.episode_id), send_properties=True
    )
    rec.save(out, default_blueprint=_blueprint(data))
    try:
        rec.send_recording_name(data.episode_id)
        rec.log(
            "instruction",
            rr.TextDocument(data.instruction or "(no instruction recorded)"),
            static=True,
        )
        rec.log(
            "result",
            rr.TextDocument(_result_markdown(data), media_type=rr.MediaType.MARKDOWN),
            static=True,
        )
        for cam, mp4 in data.videos.items():
            entity = f"cameras/{cam}"
            try:
                asset = rr.AssetVideo(path=_browser_playable(mp4, data.layout, tmpdir))
                ts = np.asarray(asset.read_frame_timestamps_nanos(), dtype=np.int64)
            except RecordingBuildError:
                raise
            except Exception as exc:
                raise RecordingBuildError(f"{mp4}: cannot read video ({exc})") from exc
            rec.log(entity, asset, static=True)
            if ts.size == 0:
                continue
            if cam in data.frames:
                steps, idx = data.frames[cam]
                ok = idx < ts.size
                steps, idx = steps[ok], idx[ok]
            else:
                # Server layout: frame i was rendered at timestep i.
                steps = np.arange(ts.size, dtype=np.int64)
                idx = steps
            if steps.size:
                rec.send_columns(
                    entity,
                    indexes=[rr.TimeColumn("step", sequence=steps)],
                    columns=rr.VideoFrameReference.columns_nanos(ts[idx]),
                )
        for group, series in (("state", data.state), ("action", data.action)):
            for key, (steps, values) in series.items():
                entity = f"{group}/{key}"
                names = [f"{key}[{i}]" for i in range(values.shape[1])]
                rec.log(entity, rr.SeriesLines(names=names), static=True)
                rec.send_columns(
                    entity,
                    indexes=[rr.TimeColumn("step", sequence=steps)],
                    columns=rr.Scalars.columns(scalars=values),
                )
        rec.flush()
    finally:
        rec.disconnect()


def build_recording(episode: EpisodeInfo, *, force: bool = False) -> Path:
    """Return the recording to show for ``episode``, building ``.genmanip_vis.rrd`` when needed.

    Uses the server's own ``episode.rrd`` when present. Otherwise builds (or reuses, when its sidecar
    matches the inputs and ``force`` is false) ``<episode>/.genmanip_vis.rrd``. Raises
    :class:`RecordingBuildError` when the inputs cannot be read.
    """
    ep_dir = Path(episode.path)
    server_rrd = ep_dir / SERVER_RRD_NAME
    if episode.layout == "server" and server_rrd.is_file() and not force:
        return server_rrd
    out = recording_path(ep_dir)
    if not force and recording_is_fresh(episode):
        return out
    fingerprint = input_fingerprint(episode)
    data = load_episode_data(episode)
    part = ep_dir / f"{RRD_NAME}.{os.getpid()}.part"
    try:
        _write(data, part)
        os.replace(part, out)
        from genmanip_runtime.atomic import atomic_write_json

        atomic_write_json(ep_dir / SIDECAR_NAME, fingerprint)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise RecordingBuildError(
            f"cannot write the recording next to {ep_dir}: {exc}",
            hint="the results directory must be writable (or pre-build with gmp viz build elsewhere)",
        ) from exc
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return out
