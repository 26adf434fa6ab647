"""Matplotlib drawing (Agg canvas, no pyplot, no global backend state).

Static plots are drawn once per file. The video panel is drawn ONCE to an RGB array; the per-frame
cursor is then a few numpy column writes (see :class:`CursorPanel`), never a new figure per frame.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .episode import EpisodeSeries
from .panels import Panel

if TYPE_CHECKING:  # matplotlib is imported only when something is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["CursorPanel", "render_cursor_panel", "render_static_plot"]

_CURSOR_RGB = np.array([220, 20, 60], dtype=np.uint8)  # crimson: visible on white and on the curves


def _figure(width_in: float, height_in: float, dpi: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _draw_panel(
    ax: Axes, panel: Panel, xlim: tuple[float, float], *, fontsize: float, legend_cols: int
) -> None:
    from matplotlib.lines import Line2D

    for line in panel.lines:
        x, y = line.x, line.y
        drawstyle = "default"
        if line.steps and x.size:
            # An action holds for its whole step: draw the last one up to step + 1 too.
            drawstyle = "steps-post"
            x = np.append(x, x[-1] + 1)
            y = np.append(y, y[-1])
        # A single sample would be an invisible zero-length line: give it a marker.
        marker = "o" if x.shape[0] == 1 else None
        ax.plot(
            x,
            y,
            color=line.color,
            linestyle=line.style,
            linewidth=1.0,
            marker=marker,
            markersize=3,
            label=line.label,
            drawstyle=drawstyle,
        )
    ax.set_xlim(*xlim)
    ax.set_title(panel.title, loc="left", fontsize=fontsize + 1)
    ax.set_ylabel(panel.ylabel, fontsize=fontsize)
    ax.tick_params(labelsize=fontsize - 1)
    ax.grid(True, linewidth=0.4, alpha=0.5)
    if panel.legend:
        handles = [
            Line2D([0], [0], color=c, linestyle=s, linewidth=1.2)  # type: ignore[arg-type]
            for _, c, s in panel.legend
        ]
        ax.legend(
            handles,
            [lab for lab, _, _ in panel.legend],
            fontsize=fontsize - 1,
            ncol=legend_cols,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            borderaxespad=0.0,
            frameon=False,
            handlelength=1.8,
        )


def _title(s: EpisodeSeries) -> str:
    robot = s.robot.robot_id if s.robot else (s.robot_id or "unknown robot")
    head = f"{s.episode_id}  |  {robot}  |  {s.n_steps} steps"
    if s.instruction:
        head += "\n" + textwrap.shorten(s.instruction, width=150, placeholder=" ...")
    return head


def render_static_plot(s: EpisodeSeries, panels: Sequence[Panel], what: str) -> bytes:
    """PNG bytes of one figure with ``panels`` stacked on a shared step axis.

    Size: 12 in wide, 2.3 in per panel, 110 dpi. ``what`` ("state" / "action") goes in the title.
    The layout is computed in inches (no tight_layout: it would draw the figure twice).
    """
    n = max(len(panels), 1)
    width_in, panel_in, gap_in = 12.0, 1.85, 0.45
    top_in = 0.55 + (0.2 if s.instruction else 0.0)
    bottom_in, left_in, right_in = 0.55, 0.85, 1.25
    height_in = top_in + bottom_in + n * panel_in + (n - 1) * gap_in
    fig = _figure(width_in, height_in, 110)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    lo, hi = s.t_range
    for i, (ax, panel) in enumerate(zip(axes, panels, strict=False)):
        y0 = bottom_in + (n - 1 - i) * (panel_in + gap_in)
        ax.set_position(
            (
                left_in / width_in,
                y0 / height_in,
                (width_in - left_in - right_in) / width_in,
                panel_in / height_in,
            )
        )
        _draw_panel(ax, panel, (lo, hi), fontsize=9, legend_cols=1)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    axes[-1].set_xlabel("step (simulator timestep)", fontsize=9)
    fig.suptitle(
        f"{what}: {_title(s)}", fontsize=10, x=0.01, y=1.0 - 0.08 / height_in, ha="left", va="top"
    )
    buf = io.BytesIO()
    # zlib level 3: most of level 6's size at a fraction of its time.
    fig.savefig(buf, format="png", pil_kwargs={"compress_level": 3})
    return buf.getvalue()


@dataclass(frozen=True)
class CursorPanel:
    """A pre-rendered plot panel plus what is needed to draw a time cursor into it.

    Attributes:
        image: (H, W, 3) uint8, the panel as drawn once.
        t0, t1: the time range on every axes' x axis.
        cols0, cols1: (K,) float pixel column of t0 and t1 on each of the K axes.
        rows: (K, 2) int pixel rows [top, bottom) of each axes' plotting area.
    """

    image: np.ndarray
    t0: float
    t1: float
    cols0: np.ndarray
    cols1: np.ndarray
    rows: np.ndarray

    def columns(self, t: float) -> np.ndarray:
        """(K,) int pixel column of timestep ``t`` on every axes (clipped into the axes)."""
        frac = (float(t) - self.t0) / (self.t1 - self.t0)
        frac = min(max(frac, 0.0), 1.0)
        cols: np.ndarray = np.rint(self.cols0 + frac * (self.cols1 - self.cols0)).astype(np.intp)
        return cols

    def draw_cursor(self, out: np.ndarray, t: float, *, width: int = 2) -> None:
        """Write the panel with a cursor at timestep ``t`` into ``out`` (same shape as image).

        ``out`` is overwritten in place: one block copy plus K narrow column writes.
        """
        np.copyto(out, self.image)
        w = out.shape[1]
        for col, (r0, r1) in zip(self.columns(t), self.rows, strict=True):
            c0 = max(int(col) - width // 2, 0)
            c1 = min(c0 + width, w)
            out[r0:r1, c0:c1] = _CURSOR_RGB


def render_cursor_panel(
    s: EpisodeSeries, state: Sequence[Panel], action: Sequence[Panel], width: int, height: int
) -> CursorPanel:
    """Draw the state row and the action row side by side panels, ``width`` x ``height`` pixels."""
    dpi = 100.0
    fig = _figure(width / dpi, height / dpi, dpi)
    ncols = max(len(state), len(action), 1)
    axes = fig.subplots(2, ncols, squeeze=False)
    lo, hi = s.t_range
    used = []
    for r, row in enumerate((state, action)):
        for c in range(ncols):
            ax = axes[r][c]
            if c < len(row):
                _draw_panel(ax, row[c], (lo, hi), fontsize=7, legend_cols=1)
                if r == 1:
                    ax.set_xlabel("step", fontsize=6)
                used.append(ax)
            else:
                ax.set_visible(False)
    fig.suptitle(
        _title(s).replace("\n", "  |  "),
        fontsize=8,
        x=0.005,
        y=1.0 - 4.0 / height,
        ha="left",
        va="top",
    )
    # Axes placed in pixels: room above each for its title, left for tick labels, right for
    # the legend, below the action row for the step label.
    top, bottom, gap = 42.0, 34.0, 44.0
    left_pad, legend_w = 58.0, 78.0
    col_w = width / ncols
    row_h = (height - top - bottom - gap) / 2.0
    for (r, c), ax in np.ndenumerate(axes):
        x0 = c * col_w + left_pad
        y0 = bottom + (1 - r) * (row_h + gap)
        ax.set_position(
            (x0 / width, y0 / height, (col_w - left_pad - legend_w) / width, row_h / height)
        )
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())  # type: ignore[attr-defined]
    image = np.ascontiguousarray(rgba[..., :3])
    h = image.shape[0]
    cols0, cols1, rows = [], [], []
    for ax in used:
        x0 = ax.transData.transform((lo, 0.0))[0]
        x1 = ax.transData.transform((hi, 0.0))[0]
        bb = ax.bbox
        cols0.append(x0)
        cols1.append(x1)
        # Display coordinates have their origin at the bottom; array rows at the top.
        rows.append((max(int(np.ceil(h - bb.y1)), 0), min(int(np.floor(h - bb.y0)), h)))
    return CursorPanel(
        image=image,
        t0=float(lo),
        t1=float(hi),
        cols0=np.asarray(cols0, dtype=np.float64),
        cols1=np.asarray(cols1, dtype=np.float64),
        rows=np.asarray(rows, dtype=np.intp).reshape(-1, 2),
    )
