"""``gmp plot`` and ``gmp clean`` (genmanip-artifacts), ``gmp transcode`` (genmanip-results)."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_flag

__all__ = ["register"]

_DIST = "genmanip-artifacts"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``plot`` and ``clean``."""
    p = add_command(
        subparsers, "plot", handler="genmanip_artifacts.cli:plot", dist=_DIST,
        help="plot actions/states of recorded episodes and overlay them on the videos",
        epilog="Writes state_plot.png, action_plot.png, merged_with_plot.mp4 and plot.log into each "
               "episode directory (or --out) and prints the written files on stdout.",
    )
    p.add_argument("episodes", nargs="*", metavar="EPISODE_DIR", help="episode directories")
    add_flag(p, "--run", metavar="RUN_DIR", action="append", default=None,
             help="plot every complete episode of a run (repeatable)")
    add_flag(p, "--jobs", "-j", metavar="N", type=int, default=None,
             help="parallel processes (default: CPU count)")
    add_flag(p, "--out", metavar="DIR", default=None,
             help="output directory (default: each episode's own directory; with several "
                  "episodes, one <benchmark>/<run>/<task>/<seed> subdirectory each)")
    add_flag(p, "--no-video", dest="video", action="store_false", default=True,
             help="only the PNG plots, no merged_with_plot.mp4")

    p = add_command(
        subparsers, "transcode", handler="genmanip_results.transcode:transcode",
        dist="genmanip-results",
        help="make the H.264 mp4s of recorded episodes that only have their JPEG frames",
        epilog="gmp eval --transcode deferred (the default) keeps each camera's JPEG frames as "
               "received (<camera>.jpegs); viewers make an mp4 when they need one. This makes "
               "them all now, atomically, and prints each video made on stdout. Unfinished "
               "episodes are skipped. Exit codes: 0 done, 1 a video failed, 10 nothing to do.",
    )
    p.add_argument("runs", nargs="*", metavar="RUN",
                   help="run directories or run ids (default: every run under --root)")
    add_flag(p, "--root", metavar="DIR", default=None,
             help="where runs are looked up (default: the current directory's results trees "
                  "and $GENMANIP_RESULT_DIR)")
    add_flag(p, "--jobs", "-j", metavar="N", type=int, default=2,
             help="episodes transcoded at once (default: %(default)s)")
    add_flag(p, "--drop-frames", action="store_true", default=False,
             help="then delete each JPEG frame store whose mp4 has all its frames (the disk "
                  "use of --transcode inline; the page's frame-by-frame player then plays the mp4)")
    add_flag(p, "--json", dest="as_json", action="store_true", default=False,
             help="a JSON summary on stdout")

    p = add_command(
        subparsers, "clean", handler="genmanip_artifacts.cli:clean", dist=_DIST,
        help="remove generated files (viewer caches, plots, caches), safely",
        epilog="Lists what would go, by category with sizes; deletes only with --yes (or after a "
               "prompt on a terminal). Results only with --results, never a live run, never an "
               "unsubmitted one without --force. Exit codes: 0 done, 9 refused, 10 nothing to do.",
    )
    add_flag(p, "--root", aliases=["--project-root", "--project_root"], metavar="DIR",
             default=".", help="project root (default: the current directory)")
    add_flag(p, "--plots", action="store_true", default=False,
             help="also remove gmp plot outputs (PNGs, merged_with_plot.mp4, plot.log)")
    add_flag(p, "--videos", action="store_true", default=False,
             help="also remove the mp4s gmp made from a JPEG frame store that is still there "
                  "(remade on demand)")
    add_flag(p, "--results", action="store_true", default=False,
             help="also remove submitted, finished runs of saved/eval_results")
    add_flag(p, "--all", action="store_true", default=False,
             help="also plots and the download cache (results still need --results)")
    add_flag(p, "--force", action="store_true", default=False,
             help="with --results: also unsubmitted runs (never live ones)")
    add_flag(p, "--yes", "-y", action="store_true", default=False, help="delete without asking")
    add_flag(p, "--dry-run", aliases=["--dry_run"], action="store_true", default=False,
             help="only list what would be removed, with sizes (the default when not a terminal)")
    add_flag(p, "--cache-dir", metavar="DIR", default=None,
             help="gmp's cache directory (default: $GMP_CACHE_DIR or ~/.cache/genmanip)")
