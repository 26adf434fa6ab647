"""Build an episode's Rerun recording (``.genmanip_vis.rrd``) from what is on disk.

Inputs, per layout (see ``docs/architecture.md``):

* client layout: ``steps.jsonl`` (one row per executed action) + ``<camera>.mp4`` + ``result.json``;
* server layout: ``<camera>.mp4`` + ``meta_record.pkl`` (read only through the allow-list unpickler
  ``genmanip_protocol.codec.safe_loads``) + ``result_info.json``; when the server wrote its own
  ``episode.rrd`` that file is used as is and nothing is built.

The series are read by :func:`genmanip_results.series.load_series` (the one loader of both layouts,
shared with ``gmp plot``): a bad row never stops a recording; it is a gap in the plots, and the
recording's result panel lists what was skipped.

The recording has one timeline, ``step`` (a sequence: the simulator timestep). Each camera's mp4 goes in
once as an ``AssetVideo`` (the encoded bytes, not per-frame images) and every step refers into it with a
``VideoFrameReference``, so the recording is about as large as the source videos plus a few KiB of
series. A camera recorded with ``gmp eval --transcode deferred`` (the default) has no mp4 but its JPEG
frame store (``<camera>.jpegs``): its frames go in as ``EncodedImage`` (``image/jpeg``, the bytes as
recorded, each frame once), so building the replay needs no video encoder at all. The blueprint (one video panel per camera, state and action plots, instruction and result text)
is declared in code and saved as the recording's default blueprint.

Freshness: a JSON sidecar ``.genmanip_vis.rrd.json`` next to the recording stores the size and mtime of
every input plus the builder version; the recording is rebuilt when any of them changed. Writes go to
``<name>.part`` and are renamed into place, so a reader never sees half a recording.

Containment: every input (``steps.jsonl``, ``meta_record.pkl``, the videos, the sidecar) is opened
through :func:`genmanip_results.paths.open_within`, within the root the episode was found under
(:attr:`~genmanip_results.discovery.EpisodeInfo.containment`): a file that is, or became after the
scan, a symlink out of the results tree is refused where it is opened, never read or handed to
ffmpeg. The videos go into the recording as bytes read that way (never by path).

Threads: every rerun recording stream starts two native threads (a chunk batcher and a sink
writer) that outlive the Python object. A build process serves many builds, and each build used
two streams: the data stream (kept until rerun's orphan sweep, which only ``rerun.init`` runs) and
the default blueprint's stream that ``RecordingStream.save(default_blueprint=...)`` creates with
a memory sink and never disconnects (the stream and its sink keep each other alive: no sweep
frees it). So every build left four threads and their buffers behind (14 -> 142 threads over 32
builds). Now the blueprint stream is made here and disconnected after the save
(:func:`_save_with_blueprint`), and each build ends with the orphan sweep
(:func:`_release_streams`); ``tests/test_recording.py::test_rebuilds_keep_threads_bounded``
builds 32 recordings in one process and holds the thread count.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from genmanip_results.layout import (
    EPISODE_RRD,
    FRAME_STORE_SUFFIX,
    META_RECORD,
    RESULT_INFO,
    RESULT_JSON,
    STEPS_JSONL,
    VIEWER_CACHE_PREFIX,
)
from genmanip_results.paths import UnsafePathError, create_exclusive, is_within, read_bytes_within
from genmanip_results.series import order_cameras

from .errors import RecordingBuildError, VizDependencyError

if TYPE_CHECKING:
    from genmanip_results.discovery import EpisodeInfo
    from genmanip_results.series import EpisodeSeries

__all__ = [
    "BUILDER_VERSION",
    "IGNORE_SIGINT",
    "RRD_NAME",
    "SIDECAR_NAME",
    "EpisodeData",
    "build_recording",
    "input_fingerprint",
    "load_episode_data",
    "recording_is_fresh",
    "recording_path",
]

#: Name of the recording this package writes next to an episode's files (a viewer cache: the
#: prefix is what ``gmp clean`` recognizes).
RRD_NAME = f"{VIEWER_CACHE_PREFIX}rrd"
#: Sidecar with the inputs' sizes/mtimes the recording was built from.
SIDECAR_NAME = f"{RRD_NAME}.json"
#: Bumped whenever the recording's content or blueprint changes, so old recordings are rebuilt.
BUILDER_VERSION = 5  # 5: JPEG frame stores as EncodedImage frames
#: The server's own recording (written with ``--save_process`` when rerun-sdk is installed there).
SERVER_RRD_NAME = EPISODE_RRD

_INPUT_NAMES = (STEPS_JSONL, META_RECORD, RESULT_JSON, RESULT_INFO)
#: Problems listed one by one in the recording's result panel before the rest is only counted.
_MAX_PROBLEMS_SHOWN = 10


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
    video frame ``frame_indices[i]`` (0-based index into the mp4). NaN values are gaps (bad rows).
    ``problems``: what the loader skipped or blanked, one line each (shown in the result panel);
    ``problem_summary``: one line counting them (None for a clean recording).
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
    problems: list[str] = field(default_factory=list)
    problem_summary: str | None = None


def recording_path(episode_dir: Path) -> Path:
    """The recording this package builds for the episode directory ``episode_dir``."""
    return Path(episode_dir) / RRD_NAME


def _input_paths(episode: EpisodeInfo) -> list[Path]:
    # Camera videos only: a merged_with_plot.mp4 written later by gmp plot is no input.
    paths = [Path(p) for p in order_cameras(episode.videos).values()]
    for name in _INPUT_NAMES:
        p = Path(episode.path) / name
        if p.is_file():
            paths.append(p)
    # (not even the size of a file outside the tree goes into the sidecar)
    return sorted(p for p in paths if is_within(p, episode.containment))


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
    if not rrd.is_file() or not sidecar.is_file() or not is_within(rrd, episode.containment):
        return False
    try:
        raw = read_bytes_within(sidecar, episode.containment, field=SIDECAR_NAME)
        recorded = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, UnsafePathError):
        return False
    return bool(recorded == input_fingerprint(episode))


# --------------------------------------------------------------------------------------------------
# Loading the inputs
# --------------------------------------------------------------------------------------------------


#: Result fields shown in the recording, per layout (``result.json`` / ``result_info.json``).
_RESULT_KEYS = {
    "client": ("score", "sr", "steps", "worker_id", "started", "finished"),
    "server": ("score", "success_rate", "sr"),
}


def _is_mobile(series: EpisodeSeries | None) -> bool:
    """Whether the episode's robot has a mobile base (dual-arm robots); unknown robots: yes."""
    robot = series.robot if series is not None else None
    return robot.dual_arm if robot is not None else True


def load_episode_data(episode: EpisodeInfo) -> EpisodeData:
    """Read ``episode``'s inputs (either layout) into an :class:`EpisodeData`.

    The series come from :func:`genmanip_results.series.load_series`, the one loader (and its one
    bad-row policy: a bad row is a NaN gap or a skipped row, listed in ``problems``; the recording
    is built anyway and shows them). An episode with no recording file at all gets its videos
    only. Raises :class:`RecordingBuildError` when the recording file cannot be read or
    ``meta_record.pkl`` is refused by the allow-list.
    """
    from genmanip_results.series import SeriesError, SeriesNotFoundError, load_series

    data = EpisodeData(
        episode_id=episode.episode_id,
        layout=episode.layout,
        videos=order_cameras({str(k): Path(v) for k, v in episode.videos.items()}),
    )
    series: EpisodeSeries | None
    try:
        series = load_series(episode)
    except SeriesNotFoundError:
        series = None  # nothing recorded but (perhaps) the videos: a recording of those
    except SeriesError as exc:
        raise RecordingBuildError(f"{episode.path}: cannot load {exc}") from exc
    result = episode.result or {}
    data.result = {k: result[k] for k in _RESULT_KEYS[episode.layout] if k in result}
    if episode.error:
        data.problems.append(episode.error)
    if series is None:
        data.instruction = episode.instruction or ""
        data.robot_id = episode.robot_id or ""
        data.n_steps = episode.steps or 0
        return data
    data.instruction = series.instruction or ""
    data.robot_id = series.robot_id or ""
    data.n_steps = series.n_steps
    for key, values in series.state.items():
        if values.shape[1]:
            data.state[key] = (series.state_t, values)
    if series.n_steps and series.action.shape[1]:
        data.action["arm"] = (series.action_t, series.action)
    if series.base_motion is not None and _is_mobile(series):
        data.action["base_motion"] = (series.action_t, series.base_motion)
    if series.frame_timesteps:
        steps, frames = series.frame_steps()
        for cam in data.videos:
            data.frames[cam] = (steps, frames)
    data.problem_summary = series.summary()
    data.problems.extend(series.warnings)
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
    if data.problems:
        lines += ["", f"**recording problems** ({data.problem_summary or len(data.problems)})", ""]
        shown = data.problems[:_MAX_PROBLEMS_SHOWN]
        # (backticks of recorded values would end a code span early: shown as quotes)
        lines += ["- `{}`".format(p.replace("`", "'")) for p in shown]
        if len(data.problems) > len(shown):
            lines.append(f"- ... {len(data.problems) - len(shown)} more")
    return "\n".join(lines)


def _recording_id(episode_id: str) -> uuid.UUID:
    # Stable per episode so re-opening a rebuilt recording replaces rather than duplicates it.
    return uuid.UUID(bytes=hashlib.sha256(episode_id.encode("utf-8")).digest()[:16], version=4)


def _video_bytes(mp4: Path, root: Path) -> bytes:
    """The bytes of a camera video, opened within ``root`` (never a file outside the tree)."""
    try:
        return read_bytes_within(mp4, root, field="video")
    except UnsafePathError as exc:
        raise RecordingBuildError(
            f"{mp4.name}: not read: it resolves outside the results root (symlink?)"
        ) from exc
    except OSError as exc:
        raise RecordingBuildError(f"{mp4}: cannot read video ({exc.strerror or exc})") from exc


def _browser_playable(mp4: Path, data: bytes, layout: str, tmpdir: Path, index: int) -> bytes:
    """``data`` (the bytes of ``mp4``) when browsers can decode it, else an H.264 copy.

    This project's recordings are H.264 already (no probe). The real server falls back to ``mp4v``
    (MPEG-4 Part 2), which no browser decodes: those are transcoded for the recording only. ffmpeg
    only ever sees a private copy of the bytes already read within the results root.
    """
    if layout == "client":
        return data
    from genmanip_results.video import ffmpeg_executable, video_info

    src = tmpdir / f"camera{index}.src.mp4"
    src.write_bytes(data)
    try:
        codec = video_info(src).codec
    except Exception as exc:
        raise RecordingBuildError(f"{mp4}: cannot read video ({exc})") from exc
    if codec in ("h264", "hevc", "av1", "vp9"):
        return data
    import subprocess

    target = tmpdir / f"camera{index}.h264.mp4"
    args = [
        ffmpeg_executable(), "-nostdin", "-loglevel", "error", "-y", "-i", str(src),
        "-map", "0:v:0", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
        "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-movflags", "+faststart", str(target),
    ]  # fmt: skip
    res = subprocess.run(args, capture_output=True, check=False, timeout=600)
    if res.returncode != 0:
        tail = res.stderr.decode("utf-8", "replace")[-400:]
        raise RecordingBuildError(f"{mp4}: cannot transcode {codec} video to H.264 ({tail})")
    return target.read_bytes()


def _log_frame_store(
    rr: Any, rec: Any, entity: str, path: Path, *, frames: tuple[np.ndarray, np.ndarray] | None, root: Path
) -> None:
    """Log a camera's JPEG frame store (``<camera>.jpegs``) as ``EncodedImage`` frames: the JPEG
    bytes as recorded, no decoding and no video encoding (the viewer decodes the frames it shows).

    Each frame is logged once, at the first step that shows it (chunked policies show one frame for
    several steps: the viewer keeps the latest).
    """
    from genmanip_results.frames import FrameStore

    try:
        store = FrameStore(path, within=root)
    except UnsafePathError as exc:
        raise RecordingBuildError(f"{path.name}: not read: it resolves outside the results root") from exc
    except Exception as exc:
        raise RecordingBuildError(f"{path}: cannot read frames ({exc})") from exc
    with store:
        n = len(store)
        if frames is not None:
            steps, idx = frames
            ok = idx < n
            steps, idx = steps[ok], idx[ok]
        else:
            steps = np.arange(n, dtype=np.int64)
            idx = steps
        if not steps.size:
            return
        keep = np.ones(steps.size, dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        steps, idx = steps[keep], idx[keep]
        try:
            blobs = [store[int(j)] for j in idx]
        except Exception as exc:
            raise RecordingBuildError(f"{path}: cannot read frames ({exc})") from exc
    rec.send_columns(
        entity,
        indexes=[rr.TimeColumn("step", sequence=steps)],
        columns=rr.EncodedImage.columns(blob=blobs, media_type=["image/jpeg"] * len(blobs)),
    )


def _save_with_blueprint(rr: Any, rec: Any, out: Path, blueprint: Any) -> Any:
    """``rec.save(out, default_blueprint=blueprint)``, returning the blueprint's stream so that
    the caller disconnects it (rerun's own ``save`` leaves it running: see the module docstring).

    Uses rerun 0.41's bindings (the same calls ``rerun.sinks.save`` makes); should they change,
    it falls back to the public call, and the build pool's process recycling bounds the leak.
    """
    import rerun_bindings as bindings  # (rerun-sdk's native module, re-exported as rerun.bindings)

    try:
        native = bindings.new_blueprint(
            application_id=rec.get_application_id() or "genmanip",
            make_default=False,
            make_thread_default=False,
            default_enabled=True,
        )
        stream = rr.RecordingStream._from_native(native)
        log_to_stream = blueprint._log_to_stream
    except AttributeError:  # pragma: no cover - a rerun whose internals moved
        rec.save(out, default_blueprint=blueprint)
        return None
    stream.set_time("blueprint", sequence=0)
    log_to_stream(stream)
    storage = stream.memory_recording().storage
    bindings.save(
        path=str(out), default_blueprint=storage, recording=rec.to_native(), write_footer=True
    )
    return stream


def _release_streams() -> None:
    """Let rerun stop the native threads of every recording stream nothing references any more.

    A dropped :class:`rerun.RecordingStream` keeps its batcher and sink threads until rerun's
    orphan sweep (the one ``rerun.init`` runs); a build process builds many recordings, so each
    build ends with it, or the process gains four threads per build (found by
    ``test_rebuilds_keep_threads_bounded``).
    """
    import rerun_bindings as bindings

    bindings.flush_and_cleanup_orphaned_recordings()


def _write(data: EpisodeData, out: Path, root: Path) -> None:
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="gmp-viz-") as tmp:
            _write_in(data, out, Path(tmp), root)
    finally:
        _release_streams()


def _write_in(data: EpisodeData, out: Path, tmpdir: Path, root: Path) -> None:
    rr = _rerun()
    rec = rr.RecordingStream(
        "genmanip", recording_id=_recording_id(data.episode_id), send_properties=True
    )
    blueprint_stream = None
    try:
        blueprint_stream = _save_with_blueprint(rr, rec, out, _blueprint(data))
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
        for i, (cam, mp4) in enumerate(data.videos.items()):
            entity = f"cameras/{cam}"
            if mp4.name.endswith(FRAME_STORE_SUFFIX):
                _log_frame_store(rr, rec, entity, mp4, frames=data.frames.get(cam), root=root)
                continue
            video = _browser_playable(mp4, _video_bytes(mp4, root), data.layout, tmpdir, i)
            try:
                asset = rr.AssetVideo(contents=video, media_type="video/mp4")
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
        if blueprint_stream is not None:
            blueprint_stream.disconnect()  # (breaks the stream <-> memory sink cycle)
        # No reference may outlive this frame (a traceback keeps frames alive): the orphan
        # sweep in _write only stops the threads of streams nothing references.
        del rec, blueprint_stream


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
        # A leftover (or planted) part file is removed, never written through: the recording is
        # written into a file this build created itself.
        part.unlink(missing_ok=True)
        # Provenance (genmanip_results.provenance): the partial is registered before it exists,
        # the recording and sidecar once written, so ``gmp clean`` can prove them ours.
        from genmanip_results.provenance import (
            CATEGORY_VIEWER_CACHE,
            register_generated,
            register_partial,
        )

        register_partial(part, category=CATEGORY_VIEWER_CACHE, by="genmanip-viz")
        create_exclusive(part, within=episode.containment, field=RRD_NAME).close()
        _write(data, part, episode.containment)
        os.replace(part, out)
        from genmanip_runtime.atomic import atomic_write_json

        atomic_write_json(ep_dir / SIDECAR_NAME, fingerprint)
        register_generated(
            out, ep_dir / SIDECAR_NAME, category=CATEGORY_VIEWER_CACHE, by="genmanip-viz"
        )
    except UnsafePathError as exc:
        raise RecordingBuildError(f"{ep_dir.name}: {exc}") from exc
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


#: ``ProcessPoolExecutor`` keywords of the processes that build recordings: they ignore SIGINT
#: (Ctrl-C is the parent's to handle: it stops the pool; a child that took it too would print a
#: traceback each). ``signal.signal`` itself is the initializer, so a child sets it before it
#: imports anything of gmp (a Ctrl-C during that import would still print one).
IGNORE_SIGINT: dict[str, Any] = {"initializer": signal.signal, "initargs": (signal.SIGINT, signal.SIG_IGN)}
