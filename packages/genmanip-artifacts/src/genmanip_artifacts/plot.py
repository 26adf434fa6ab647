"""Public plotting entry points: :func:`plot_episode` and :func:`plot_episodes`."""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from genmanip_protocol.errors import GenmanipError

# The names are the results layout's (genmanip_results.layout): this package writes the files,
# gmp viz links them and gmp clean removes them, all by the same constants.
from genmanip_results.layout import ACTION_PLOT, MERGED_VIDEO, PLOT_LOG, STATE_PLOT

from .__about__ import __version__
from .episode import load_series
from .errors import EpisodeDataError
from .panels import action_panels, state_panels
from .render import render_static_plot

__all__ = [
    "ACTION_PLOT",
    "MERGED_VIDEO",
    "PLOT_LOG",
    "PLOT_OUTPUTS",
    "STATE_PLOT",
    "EpisodeOutcome",
    "PlotResult",
    "plot_episode",
    "plot_episodes",
]

#: Every file ``gmp plot`` writes into an output directory (``gmp clean --plots`` removes them
#: when their provenance records prove them ours).
PLOT_OUTPUTS = (ACTION_PLOT, STATE_PLOT, MERGED_VIDEO, PLOT_LOG)
#: First line of every plot.log this package writes (``gmp clean`` itself goes by the provenance
#: manifest every output is registered in, :mod:`genmanip_results.provenance`).
PLOT_LOG_SIGNATURE = "# genmanip-artifacts plot log"


@dataclass(frozen=True)
class PlotResult:
    """What :func:`plot_episode` produced.

    Attributes:
        episode_dir: the episode that was plotted.
        out_dir: where the outputs went.
        action_plot, state_plot: the PNGs.
        video: the overlay mp4, or None when not requested / no camera videos.
        steps: executed actions plotted; frames: video frames written (0 without video).
        warnings: non-fatal findings, one line each (also written to plot.log).
        seconds: wall time.
    """

    episode_dir: Path
    out_dir: Path
    action_plot: Path
    state_plot: Path
    video: Path | None
    steps: int
    frames: int
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


#: Who wrote a generated file, in its provenance record.
_BY = f"genmanip-artifacts {__version__}"


def _write_atomic(path: Path, data: bytes) -> None:
    # Written and registered in the directory's provenance manifest in one call: ``gmp clean
    # --plots`` deletes only files a record proves are this writer's.
    from genmanip_results.provenance import CATEGORY_PLOTS, write_generated

    write_generated(path, data, category=CATEGORY_PLOTS, by=_BY)


def _write_log(
    out_dir: Path, episode_dir: Path, written: list[str], warnings: list[str], seconds: float
) -> None:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    lines = [
        PLOT_LOG_SIGNATURE,
        f"version: {__version__}",
        f"time: {now}",
        f"episode: {episode_dir}",
        f"seconds: {seconds:.2f}",
        *(f"output: {name}" for name in written),
        *(f"warning: {w}" for w in warnings),
    ]
    _write_atomic(out_dir / PLOT_LOG, ("\n".join(lines) + "\n").encode("utf-8"))


def plot_episode(
    ep_dir: Path | str, out: Path | str | None = None, video: bool = True
) -> PlotResult:
    """Plot one episode: ``action_plot.png``, ``state_plot.png`` and ``merged_with_plot.mp4``.

    Args:
        ep_dir: an episode directory of either layout (``steps.jsonl`` or ``meta_record.pkl``).
        out: output directory (created); default: ``ep_dir`` itself.
        video: also write the overlay video (needs the camera mp4s; skipped with a warning when the
            episode has none).

    Every file is written atomically; a failed video leaves no partial mp4 behind.

    Raises:
        EpisodeDataError: missing or corrupt inputs (one-line message naming the file and field);
            its subclass AlignmentError when video frames and steps do not line up.
    """
    t0 = time.perf_counter()
    ep_dir = Path(ep_dir)
    series = load_series(ep_dir)
    out_dir = Path(out) if out is not None else ep_dir
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EpisodeDataError(
            f"{out_dir}: cannot create output directory ({exc.strerror})", path=ep_dir
        ) from exc
    warnings = list(series.warnings)
    written: list[str] = []
    try:
        _write_atomic(
            out_dir / STATE_PLOT, render_static_plot(series, state_panels(series), "state")
        )
        written.append(STATE_PLOT)
        _write_atomic(
            out_dir / ACTION_PLOT, render_static_plot(series, action_panels(series), "action")
        )
        written.append(ACTION_PLOT)
    except OSError as exc:
        raise EpisodeDataError(
            f"{out_dir}: cannot write plots ({exc.strerror})", path=ep_dir
        ) from exc
    video_path: Path | None = None
    frames = 0
    if video:
        if series.videos:
            from genmanip_results.provenance import (
                CATEGORY_PLOTS,
                register_generated,
                register_partial,
            )

            from .overlay import write_overlay_video

            video_path = out_dir / MERGED_VIDEO
            # The partial is registered before ffmpeg creates it, so one left by a killed plot
            # is provably ours; the finished video right after it is renamed into place.
            register_partial(out_dir / f"{MERGED_VIDEO}.part", category=CATEGORY_PLOTS, by=_BY)
            frames, vw = write_overlay_video(series, video_path)
            register_generated(video_path, category=CATEGORY_PLOTS, by=_BY)
            warnings += vw
            written.append(MERGED_VIDEO)
        else:
            warnings.append(f"no camera videos in {ep_dir}: {MERGED_VIDEO} not written")
    seconds = time.perf_counter() - t0
    try:
        _write_log(out_dir, ep_dir, written, warnings, seconds)
    except (OSError, GenmanipError) as exc:
        warnings.append(f"{PLOT_LOG} not written: {exc}")
    return PlotResult(
        episode_dir=ep_dir,
        out_dir=out_dir,
        action_plot=out_dir / ACTION_PLOT,
        state_plot=out_dir / STATE_PLOT,
        video=video_path,
        steps=series.n_steps,
        frames=frames,
        warnings=warnings,
        seconds=seconds,
    )


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode of a batch: its result, or the one-line error that stopped it."""

    episode_dir: Path
    result: PlotResult | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def _plot_one(ep_dir: Path, out: Path | None, video: bool) -> EpisodeOutcome:
    try:
        return EpisodeOutcome(ep_dir, plot_episode(ep_dir, out, video), None)
    except GenmanipError as exc:
        return EpisodeOutcome(
            ep_dir, None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        )
    except OSError as exc:
        return EpisodeOutcome(ep_dir, None, f"{ep_dir}: {exc}")


def plot_episodes(
    jobs: Sequence[tuple[Path, Path | None]],
    *,
    video: bool = True,
    workers: int = 1,
    on_done: Callable[[EpisodeOutcome], None] | None = None,
) -> list[EpisodeOutcome]:
    """Plot many episodes; ``jobs`` = [(episode dir, output dir or None), ...].

    With ``workers > 1`` episodes run in a process pool (spawned processes: no state inherited from
    the caller). A failing episode never stops the others; ``on_done`` is called in the calling
    process as each one finishes (completion order). Returns the outcomes in ``jobs`` order.
    """
    outcomes: dict[int, EpisodeOutcome] = {}
    if workers <= 1 or len(jobs) <= 1:
        for i, (ep, out) in enumerate(jobs):
            outcomes[i] = _plot_one(ep, out, video)
            if on_done is not None:
                on_done(outcomes[i])
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            futures = {
                pool.submit(_plot_one, ep, out, video): i for i, (ep, out) in enumerate(jobs)
            }
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    outcome = fut.result()
                except Exception as exc:
                    outcome = EpisodeOutcome(
                        jobs[i][0], None, f"{jobs[i][0]}: worker failed: {exc!r}"
                    )
                outcomes[i] = outcome
                if on_done is not None:
                    on_done(outcome)
    return [outcomes[i] for i in range(len(jobs))]

