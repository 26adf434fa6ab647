"""``merged_with_plot.mp4``: every camera side by side over a synchronized state/action panel.

Frame ``j`` of the output is frame ``j`` of every camera video (the ``j``-th observation of the
episode); its cursor sits at that observation's simulator timestep, taken from ``steps.jsonl``
(``frame``/``obs_timestep``) or, for the server layout, from the row index of ``meta_record.pkl``.
Mismatches (cameras with different frame counts, steps referencing frames a video does not have)
raise :class:`~genmanip_artifacts.errors.AlignmentError` instead of being papered over.

It plays at :data:`PLAYBACK_FPS` (10 frames per second), one frame per observation: an episode
runs about as fast as the robot acted, instead of 30 steps a second. GenManip records no control
rate (neither the server's nor the client's files, nor the robot specs, have one); 10 Hz is a
typical manipulation control rate, and at it a 45-step episode lasts 4.5 s, long enough to follow
each step on the cursor. The camera mp4s keep the server's 30 fps: they are the recording, this
is a viewer's replay.

Cost per frame: the camera decoders and the H.264 encoder are ffmpeg processes; Python only resizes
the camera frames (Pillow, C), copies the pre-rendered panel and writes the cursor columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from genmanip_protocol.errors import GenmanipError

from .episode import EpisodeSeries
from .errors import AlignmentError, EpisodeDataError
from .panels import action_panels, state_panels
from .render import render_cursor_panel

__all__ = ["PLAYBACK_FPS", "OverlayLayout", "frame_timesteps", "plan_layout", "write_overlay_video"]

#: Output frame limits: wide enough for the 2 x 4 panel grid, narrow enough for a laptop screen.
MAX_WIDTH = 1920
MIN_WIDTH = 1280
CAMERA_HEIGHT = 360
#: Frames (= observations, = control steps) per second of the overlay video (module docstring).
PLAYBACK_FPS = 10.0


def _even(x: float) -> int:
    return max(2, round(x / 2.0) * 2)


@dataclass(frozen=True)
class OverlayLayout:
    """Pixel layout of one output frame: cameras in a row on top, the panel below.

    ``cams[i] = (x, width)`` of camera ``i`` scaled to ``cam_height`` (aspect kept); ``width`` and
    ``height`` are the whole frame (both even, as yuv420p needs).
    """

    width: int
    height: int
    cam_height: int
    panel_height: int
    cams: list[tuple[int, int]] = field(default_factory=list)


def plan_layout(
    sizes: list[tuple[int, int]],
    *,
    max_width: int = MAX_WIDTH,
    min_width: int = MIN_WIDTH,
    cam_height: int = CAMERA_HEIGHT,
) -> OverlayLayout:
    """Layout for cameras of ``sizes`` = [(width, height), ...] (all scaled to one height)."""
    hc = _even(min(cam_height, *(h for _, h in sizes)))
    widths = [_even(w * hc / h) for w, h in sizes]
    if sum(widths) > max_width:
        hc = _even(hc * max_width / sum(widths))
        widths = [_even(w * hc / h) for w, h in sizes]
    total = max(sum(widths), min_width)
    total = _even(total)
    x = (total - sum(widths)) // 2  # centre the cameras when the panel is wider
    cams = []
    for w in widths:
        cams.append((x, w))
        x += w
    panel_h = _even(max(340, hc))
    return OverlayLayout(
        width=total, height=hc + panel_h, cam_height=hc, panel_height=panel_h, cams=cams
    )


def frame_timesteps(s: EpisodeSeries, n_frames: int) -> tuple[np.ndarray, list[str]]:
    """Timestep of every one of ``n_frames`` video frames, plus warnings.

    Frames with a recorded timestep use it. A frame between two such anchors gets its timestep
    only when the anchors leave no choice (as many frames between them as timesteps); when every
    anchor has the same ``timestep - frame`` offset (one frame per observation, as ``gmp eval``
    records), leading and trailing frames follow that offset up to the last observation. Any other
    frame keeps the previous frame's cursor and is counted in a warning: never a guess.

    Raises:
        AlignmentError: no frame has a recorded timestep, or the videos have fewer frames than
            the recording refers to.
    """
    known = {j: t for j, t in s.frame_timesteps.items() if j < n_frames}
    if not known:
        raise AlignmentError(
            f"{s.path}: no recorded step refers to a video frame; cannot align", path=s.path
        )
    if n_frames < s.frames_required:
        raise AlignmentError(
            f"{s.path}: steps refer to frame {s.frames_required - 1} but the camera videos have "
            f"only {n_frames} frames",
            path=s.path,
        )
    anchors = sorted(known.items())
    offsets = {t - j for j, t in anchors}
    dense = len(offsets) == 1
    offset = next(iter(offsets))
    ts = np.empty(n_frames, dtype=np.float64)
    held = 0
    nxt = 0  # index into anchors of the first anchor with frame > j
    for j in range(n_frames):
        if j in known:
            ts[j] = known[j]
            nxt += 1
            continue
        prev = anchors[nxt - 1] if nxt > 0 else None
        after = anchors[nxt] if nxt < len(anchors) else None
        if prev is not None and after is not None and after[0] - prev[0] == after[1] - prev[1]:
            ts[j] = prev[1] + (j - prev[0])
        elif dense and 0 <= j + offset <= s.last_obs_t:
            ts[j] = j + offset
        else:
            ts[j] = prev[1] if prev is not None else anchors[0][1]
            held += 1
    warnings = []
    if held:
        warnings.append(
            f"{held} of {n_frames} video frames have no recorded timestep (cursor held)"
        )
    return ts, warnings


def _scaled_reader(
    reader: Callable[..., Iterator[np.ndarray]],
    path: Path,
    size: tuple[int, int],
    within: Path,
) -> Iterator[np.ndarray]:
    """Frames already scaled by ffmpeg while decoding, of the file opened within ``within``
    (never read by name: there is no fallback to an unchecked reader)."""
    return reader(path, size=size, within=within)


def _close(it: Iterator[np.ndarray]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: S110 - best effort: the reader is being abandoned anyway
            pass


def write_overlay_video(
    s: EpisodeSeries, out_path: Path, *, fps: float = PLAYBACK_FPS, max_width: int = MAX_WIDTH
) -> tuple[int, list[str]]:
    """Write the overlay video of ``s`` to ``out_path`` (H.264, yuv420p, atomic), one frame per
    observation at ``fps`` (default :data:`PLAYBACK_FPS`, the control rate's stand-in).

    Returns:
        (frames written, warnings).

    Raises:
        EpisodeDataError: no camera video, or one cannot be read.
        AlignmentError: frame counts differ between cameras or do not cover the referenced frames.
    """
    from genmanip_results.video import VideoWriter, probe_video, read_video_frames
    from PIL import Image

    if not s.videos:
        raise EpisodeDataError(f"{s.path}: no camera videos to overlay", path=s.path)
    # Every video is opened within the root the episode was found under and ffmpeg reads the
    # opened file: a camera file swapped for a link to an outside file after discovery is refused.
    within = s.containment if s.containment is not None else s.path
    sizes: list[tuple[int, int]] = []
    counts: dict[str, int] = {}
    for cam, path in s.videos.items():
        try:
            n, w, h = probe_video(path, within=within)
        except GenmanipError as exc:
            raise EpisodeDataError(f"{path}: unreadable video ({exc})", path=s.path) from exc
        counts[cam] = int(n)
        sizes.append((int(w), int(h)))
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{c} {n}" for c, n in counts.items())
        raise AlignmentError(
            f"{s.path}: cameras have different frame counts ({detail})", path=s.path
        )
    n_frames = next(iter(counts.values()))
    ts, warnings = frame_timesteps(s, n_frames)
    layout = plan_layout(sizes, max_width=max_width)
    panel = render_cursor_panel(
        s, state_panels(s), action_panels(s), layout.width, layout.panel_height
    )
    frame = np.zeros((layout.height, layout.width, 3), dtype=np.uint8)
    panel_view = frame[layout.cam_height :]
    readers = [
        _scaled_reader(read_video_frames, p, (w, layout.cam_height), within)
        for p, (_, w) in zip(s.videos.values(), layout.cams, strict=True)
    ]
    cams = list(s.videos)
    written = 0
    try:
        with VideoWriter(out_path, layout.width, layout.height, fps=fps) as writer:
            for j in range(n_frames):
                for i, it in enumerate(readers):
                    try:
                        img = next(it)
                    except StopIteration:
                        raise AlignmentError(
                            f"{s.videos[cams[i]]}: ended after {j} frames, {n_frames} expected",
                            path=s.path,
                        ) from None
                    x, w = layout.cams[i]
                    if img.shape[0] != layout.cam_height or img.shape[1] != w:
                        img = np.asarray(
                            Image.fromarray(img).resize(
                                (w, layout.cam_height), Image.Resampling.BILINEAR, reducing_gap=2.0
                            )
                        )
                    frame[: layout.cam_height, x : x + w] = img
                panel.draw_cursor(panel_view, ts[j])
                writer.write(frame)
                written += 1
    except GenmanipError as exc:
        if isinstance(exc, EpisodeDataError):
            raise
        raise EpisodeDataError(f"{s.path}: video: {exc}", path=s.path) from exc
    finally:
        for it in readers:
            _close(it)
    return written, warnings
