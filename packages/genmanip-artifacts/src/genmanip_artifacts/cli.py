"""Handlers of ``gmp plot`` and ``gmp clean`` (the parser lives in ``genmanip.cli.specs.artifacts``).

Data (written files, the cleanup plan) goes to stdout; talk, warnings and errors to stderr.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_results.layout import VIEWER_CACHE_PREFIX
from genmanip_runtime.console import Console, format_duration

from .clean import NOT_PROVEN, CleanPlan, CleanReport, execute_clean, format_size, plan_clean
from .errors import ArtifactsUsageError, PlotFailures
from .plot import EpisodeOutcome, plot_episodes

__all__ = ["clean", "plot"]


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _episode_subdir(ep_dir: Path, index: int) -> Path:
    """Relative output dir for one episode of a batch: ``<benchmark>/<run>/<task>/<seed>``.

    Built from the directory structure (never from a server-provided id) and checked like any
    episode id, so it can never leave ``--out``.
    """
    from genmanip_protocol.schema import safe_relative_path
    from genmanip_results.discovery import load_episode

    try:
        info = load_episode(ep_dir)
        return Path(
            safe_relative_path(f"{info.benchmark}/{info.run_id}/{info.task_name}/{info.seed}")
        )
    except (GenmanipError, OSError, ValueError):
        return Path(f"episode_{index:04d}")


def _collect_jobs(
    episode_dirs: list[str] | None, runs: list[str] | None, out: str | None, console: Console
) -> list[tuple[Path, Path | None]]:
    from genmanip_results.discovery import is_run_dir, load_run

    episodes = [Path(p) for p in _as_list(episode_dirs)]
    for run in _as_list(runs):
        run_dir = Path(run)
        if not run_dir.is_dir() or not is_run_dir(run_dir):
            raise ArtifactsUsageError(
                f"--run {run}: not a run directory",
                hint="give <results>/<benchmark>/<run_id> (with run.json, result.json or progress.json)",
            )
        info = load_run(run_dir)
        done = [e for e in info.episodes if e.complete]
        skipped = len(info.episodes) - len(done)
        if skipped:
            console.warn(f"{run}: skipping {skipped} incomplete episode(s)")
        episodes.extend(e.path for e in done)
    if not episodes:
        raise ArtifactsUsageError("nothing to plot: give EPISODE_DIR... or --run RUN_DIR")
    # The same directory named twice (or through a symlink) is plotted once.
    seen: set[str] = set()
    unique: list[Path] = []
    for ep in episodes:
        key = os.path.realpath(ep)
        if key not in seen:
            seen.add(key)
            unique.append(ep)
    if out is None:
        return [(ep, None) for ep in unique]
    out_dir = Path(out)
    if len(unique) == 1:
        return [(unique[0], out_dir)]
    return [(ep, out_dir / _episode_subdir(ep, i)) for i, ep in enumerate(unique)]


def plot(
    *,
    episodes: list[str],
    run: list[str] | None,
    jobs: int | None,
    out: str | None,
    video: bool,
    console: Console,
) -> int:
    """``gmp plot EPISODE_DIR... | --run RUN_DIR [--jobs N] [--out DIR] [--no-video]``.

    Writes state/action PNGs and the overlay video per episode; prints every written file on
    stdout. A failing episode is one error line; the others continue; exit FAILURE with a count.
    """
    todo = _collect_jobs(episodes, run, out, console)
    workers = int(jobs) if jobs is not None else (os.cpu_count() or 1)
    if workers < 1:
        raise ArtifactsUsageError(f"--jobs: expected a positive number, got {jobs}")
    failed = 0
    # Written files go to stdout as they appear, unless stdout shares the terminal with the live
    # progress line (stderr): then they are printed once the line is gone.
    held: list[str] | None = [] if console.is_tty and _isatty(sys.stdout) else None

    with console.progress(len(todo), "plot", unit="episodes") as progress:

        def done(o: EpisodeOutcome) -> None:
            nonlocal failed
            if o.result is None:
                failed += 1
                console.error(o.error or f"{o.episode_dir}: failed")
            else:
                r = o.result
                for w in r.warnings:
                    console.warn(f"{o.episode_dir}: {w}")
                files = [r.state_plot, r.action_plot] + ([r.video] if r.video else [])
                lines = [f"{f}\n" for f in files]
                if held is not None:
                    held.extend(lines)
                else:
                    sys.stdout.write("".join(lines))
                    sys.stdout.flush()
            if failed:
                progress.update(1, failed=failed)
            else:
                progress.update(1)

        plot_episodes(todo, video=video, workers=min(workers, len(todo)), on_done=done)
        elapsed = progress.elapsed_s
    if held:
        sys.stdout.write("".join(held))
        sys.stdout.flush()
    ok = len(todo) - failed
    console.info(f"plotted {ok} of {len(todo)} episode(s) in {format_duration(elapsed)}")
    if failed:
        raise PlotFailures(failed, len(todo))
    return int(ExitCode.OK)


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------- clean


def _show(path: Path, plan: CleanPlan) -> str:
    for base in (plan.root, plan.cache_dir):
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        return str(rel) if base == plan.root else f"{base}/{rel}"
    return str(path)


def _print_plan(plan: CleanPlan, *, heading: str) -> None:
    lines: list[str] = []
    for category, items in plan.by_category().items():
        size = sum(i.size for i in items)
        lines.append(f"{category}: {len(items)} item(s), {format_size(size)}")
        for item in items:
            kind = {"dir": "/", "symlink": " (symlink)"}.get(item.kind, "")
            note = f"  [{item.note}]" if item.note else ""
            lines.append(f"  {format_size(item.size):>10}  {_show(item.path, plan)}{kind}{note}")
    lines.append(f"{heading}: {len(plan.items)} item(s), {format_size(plan.total_bytes)}")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


#: Unprovable files listed one by one before the rest is only counted.
_UNPROVEN_SHOWN = 10


def _warn_refusals(plan: CleanPlan, console: Console) -> None:
    """One warning per kept item; files that are only *named* like gmp's (no provenance record:
    an older gmp's outputs, or the user's own) are listed up to a limit, then counted, with one
    note on removing them by hand."""
    unproven = [r for r in plan.refused if r.reason == NOT_PROVEN]
    for r in plan.refused:
        if r.reason != NOT_PROVEN:
            console.warn(f"kept {_show(r.path, plan)}: {r.reason}")
    for r in unproven[:_UNPROVEN_SHOWN]:
        console.warn(f"kept {_show(r.path, plan)}: {r.reason}")
    if len(unproven) > _UNPROVEN_SHOWN:
        console.warn(f"kept {len(unproven) - _UNPROVEN_SHOWN} more file(s): {NOT_PROVEN}")
    if unproven:
        console.info(
            f"{len(unproven)} file(s) are only named like gmp outputs: no provenance record proves "
            "gmp wrote them (outputs of a gmp before provenance records, or your own files), so "
            "they are kept. If they are yours to remove, delete them by hand, e.g. "
            f"find {_show_root(plan)} -name '{VIEWER_CACHE_PREFIX}*' -type f -delete; "
            "plots and viewer caches written from now on are registered and cleaned."
        )


def _show_root(plan: CleanPlan) -> str:
    return shlex.quote(str(plan.root))


def _confirm(console: Console, question: str) -> bool:
    console.write(f"{question} [y/N] ")
    try:
        answer = sys.stdin.readline()
    except (OSError, ValueError):
        return False
    return answer.strip().lower() in ("y", "yes")


def _interactive() -> bool:
    return _isatty(sys.stdin) and _isatty(sys.stderr)


def clean(
    *,
    root: str,
    plots: bool,
    results: bool,
    all: bool,  # --all's dest; shadows the builtin, which this function does not use
    force: bool,
    yes: bool,
    dry_run: bool,
    cache_dir: str | None,
    videos: bool,
    console: Console,
) -> int:
    """``gmp clean [--root DIR] [--plots] [--videos] [--results] [--all] [--force] [--yes] [--dry-run]
    [--cache-dir DIR]``.

    Lists what would go by category with sizes (stdout). Deletes only with ``--yes`` or after a
    confirmation on a terminal, and only what gmp provably created (provenance records; files
    merely named like gmp's are listed as kept). Exit: 0 done (or listed in a dry run);
    NOTHING_TO_DO when nothing matched; REFUSED when a run asked for with ``--results`` was kept
    for safety, when everything that matched was kept (write-protected, symlinked, not provably
    gmp's), or when the prompt was declined; FAILURE when a deletion failed. A ``--cache-dir``
    that is not gmp's cache raises :class:`CacheDirNotGmpError` (REFUSED) before anything else.
    """
    everything = all
    plan = plan_clean(
        root or ".",
        plots=plots or everything,
        results=results,
        all_caches=everything,
        force=force,
        cache_dir=cache_dir,
        videos=videos,
    )
    _warn_refusals(plan, console)
    # A run asked for with --results but kept for safety makes the whole command "refused";
    # a write-protected cache file is only a warning.
    refused_runs = any(r.category == "results" for r in plan.refused)
    if not plan.items:
        if plan.refused:
            console.info(f"nothing deleted; {len(plan.refused)} item(s) kept for safety")
            return int(ExitCode.REFUSED)
        console.info("nothing to clean")
        return int(ExitCode.NOTHING_TO_DO)
    dry = dry_run
    if dry or not yes:
        _print_plan(plan, heading="would delete")
        if dry:
            console.info("dry run: nothing deleted")
            return int(ExitCode.REFUSED if refused_runs else ExitCode.OK)
        if not _interactive():
            console.info("dry run (not a terminal): nothing deleted; add --yes to delete")
            return int(ExitCode.REFUSED if refused_runs else ExitCode.OK)
        if not _confirm(
            console, f"delete {len(plan.items)} item(s), {format_size(plan.total_bytes)}?"
        ):
            console.info("nothing deleted")
            return int(ExitCode.REFUSED)
    report = execute_clean(plan)
    _print_report(report, plan, console)
    if report.failed:
        return int(ExitCode.FAILURE)
    if refused_runs or any(r.category == "results" for r in report.refused):
        return int(ExitCode.REFUSED)
    return int(ExitCode.OK)


def _print_report(report: CleanReport, plan: CleanPlan, console: Console) -> None:
    sys.stdout.write("".join(f"deleted {_show(i.path, plan)}\n" for i in report.removed))
    sys.stdout.flush()
    for item, why in report.failed:
        console.error(f"could not delete {_show(item.path, plan)}: {why}")
    new_refusals = report.refused[len(plan.refused) :]
    for r in new_refusals:
        console.warn(f"kept {_show(r.path, plan)}: {r.reason}")
    console.info(f"freed {format_size(report.bytes_freed)} in {len(report.removed)} item(s)")
