"""Benchmark: gmp plot on a 1000-step, 4-camera lift2 episode (client layout, synthesized).

Measures, side by side in one process:

* static plots (``state_plot.png`` + ``action_plot.png``), target < 2 s;
* the overlay video ``merged_with_plot.mp4`` as gmp draws it (the panel rendered once, a numpy
  cursor per frame) against a baseline that builds a new matplotlib figure per frame (the reference
  client's approach). The baseline runs on a subset of frames and is extrapolated linearly to the
  whole episode (said in the table). Both include decoding the four camera videos, composing the
  frame and H.264 encoding, so the ratio isolates the drawing strategy. Target: >= 5x.

Usage: python bench/plots.py [--steps 1000] [--baseline-frames 40] [--workdir DIR]
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import cpu_s


def measured(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s, result) of ``fn()``: CPU time is what a busy machine distorts least."""
    w, c = time.perf_counter(), cpu_s()
    out = fn()
    return time.perf_counter() - w, cpu_s() - c, out


def synthesize(root: Path, steps: int) -> Path:
    from genmanip_results.testing import write_client_episode

    existing = root / "bench" / "run1" / "bench" / "suite" / "task_a" / "000"
    if (existing / "result.json").exists() and len(
        (existing / "steps.jsonl").read_text().splitlines()
    ) == steps:
        return existing  # --workdir reuse: synthesizing full-size videos takes minutes

    # Full EBench camera sizes: wrist 640x480, top/overlook 1280x720 (facts §7.2).
    cams = {
        "left_camera": (640, 480),
        "right_camera": (640, 480),
        "top_camera": (1280, 720),
        "overlook_camera": (1280, 720),
    }
    return write_client_episode(
        root / "bench" / "run1", "bench/suite/task_a", "000", steps=steps, chunk=1, cameras=cams
    )


def time_static(ep: Path, repeats: int) -> tuple[float, float]:
    """Best (wall, CPU) seconds of both PNGs over ``repeats`` (matplotlib imported beforehand)."""
    import matplotlib.figure  # noqa: F401 - import cost is not plotting cost
    from genmanip_artifacts import plot_episode

    runs = [measured(lambda: plot_episode(ep, video=False))[:2] for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def time_overlay(ep: Path, out: Path) -> tuple[float, float, int]:
    from genmanip_artifacts.episode import load_series
    from genmanip_artifacts.overlay import write_overlay_video

    s = load_series(ep)
    wall, cpu, (n, _) = measured(lambda: write_overlay_video(s, out))
    return wall, cpu, n


def baseline_overlay(ep: Path, out: Path, n_frames: int) -> tuple[float, float]:
    """A new matplotlib figure per frame (plot + axvline cursor), composed with the cameras."""
    from genmanip_artifacts.episode import load_series
    from genmanip_artifacts.overlay import frame_timesteps, plan_layout
    from genmanip_artifacts.panels import action_panels, state_panels
    from genmanip_results.video import VideoWriter, probe_video, read_video_frames
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    s = load_series(ep)
    sizes = [probe_video(p)[1:] for p in s.videos.values()]
    total = probe_video(next(iter(s.videos.values())))[0]
    ts, _ = frame_timesteps(s, total)
    layout = plan_layout(sizes)
    sp, ap = state_panels(s), action_panels(s)
    lo, hi = s.t_range
    ncols = max(len(sp), len(ap))
    readers = [read_video_frames(p) for p in s.videos.values()]
    frame = np.zeros((layout.height, layout.width, 3), dtype=np.uint8)
    t0, c0 = time.perf_counter(), cpu_s()
    vw = VideoWriter(out, layout.width, layout.height)
    with vw:
        for j in range(n_frames):
            for i, it in enumerate(readers):
                img = next(it)
                x, w = layout.cams[i]
                frame[: layout.cam_height, x : x + w] = np.asarray(
                    Image.fromarray(img).resize((w, layout.cam_height), Image.BILINEAR)
                )
            fig = Figure(figsize=(layout.width / 100, layout.panel_height / 100), dpi=100)
            FigureCanvasAgg(fig)
            axes = fig.subplots(2, ncols, squeeze=False)
            for r, row in enumerate((sp, ap)):
                for c, panel in enumerate(row):
                    ax = axes[r][c]
                    for ln in panel.lines:
                        ax.plot(ln.x, ln.y, color=ln.color, linestyle=ln.style, linewidth=1.0)
                    ax.set_xlim(lo, hi)
                    ax.set_title(panel.title, fontsize=7)
                    ax.set_ylabel(panel.ylabel, fontsize=7)
                    ax.legend([lab for lab, _, _ in panel.legend], fontsize=5)
                    ax.axvline(ts[j], color="crimson", linewidth=2)
            fig.canvas.draw()
            frame[layout.cam_height :] = np.asarray(fig.canvas.buffer_rgba())[..., :3]
            vw.write(frame)
    for it in readers:
        it.close()  # type: ignore[attr-defined]
    return time.perf_counter() - t0, cpu_s() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--baseline-frames", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gmp-bench-plots-"))
    t = time.perf_counter()
    ep = synthesize(work, args.steps)
    synth_s = time.perf_counter() - t
    origin = f"synthesized in {synth_s:.0f} s" if synth_s > 5 else "reused from --workdir"
    static_wall, static_cpu = time_static(ep, args.repeats)
    ours_wall, ours_cpu, n = time_overlay(ep, work / "ours.mp4")
    k = min(args.baseline_frames, n)
    base_wall_k, base_cpu_k = baseline_overlay(ep, work / "baseline.mp4", k)
    base_wall, base_cpu = base_wall_k / k * n, base_cpu_k / k * n
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Episode: lift2, {args.steps} steps, 4 cameras (2x 640x480, 2x 1280x720), {n} frames "
        f"({origin}). {os.cpu_count()} CPUs, load average {load:.1f} at "
        "the end. CPU = this process + its ffmpeg children (user + system)."
    )
    print()
    print("| what | gmp wall | gmp CPU | baseline wall | baseline CPU | ratio (wall / CPU) |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| static plots (state + action PNG), best of {args.repeats}; target < 2 s | "
        f"{static_wall:.2f} s | {static_cpu:.2f} s | - | - | - |"
    )
    print(
        f"| overlay video, {n} frames (baseline: figure per frame, {k} frames measured, "
        f"extrapolated) | {ours_wall:.1f} s | {ours_cpu:.1f} s | {base_wall:.0f} s | "
        f"{base_cpu:.0f} s | {base_wall / ours_wall:.1f}x / {base_cpu / ours_cpu:.1f}x |"
    )
    print(
        f"| per frame | {1000 * ours_wall / n:.0f} ms | {1000 * ours_cpu / n:.0f} ms | "
        f"{1000 * base_wall_k / k:.0f} ms | {1000 * base_cpu_k / k:.0f} ms | |"
    )


if __name__ == "__main__":
    main()
