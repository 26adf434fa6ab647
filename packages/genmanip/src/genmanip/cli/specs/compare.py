"""``gmp compare`` (genmanip-results) and ``gmp report`` (genmanip-artifacts)."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_flag

__all__ = ["register"]


def _add_root(p: argparse.ArgumentParser) -> None:
    add_flag(p, "--root", aliases=["--project-root", "--project_root"], metavar="DIR",
             default=None, help="where run ids are looked up (default: the current directory's "
                                "results trees and $GENMANIP_RESULT_DIR)")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``compare`` and ``report``."""
    p = add_command(
        subparsers, "compare", handler="genmanip_results.cli:compare", dist="genmanip-results",
        help="paired comparison of two runs on shared (task, seed)",
        epilog="B is compared against A (differences are B - A). Per task and overall: success "
               "rates with Wilson 95%% intervals, the paired difference with Newcombe's interval, "
               "the exact McNemar p-value, flipped seeds, unpaired episodes, the mean score "
               "difference (paired t), Holm-adjusted per-task claims and the anytime-valid "
               "sequential verdict. Exit codes: 0 done, 10 nothing paired.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="baseline run: a run directory or a run id")
    p.add_argument("run_b", metavar="RUN_B", help="candidate run: a run directory or a run id")
    add_flag(p, "--json", dest="as_json", action="store_true", default=False,
             help="JSON on stdout (for scripts)")
    add_flag(p, "--alpha", metavar="A", type=float, default=0.05,
             help="level of the tests and claims (default: %(default)s)")
    add_flag(p, "--delta", metavar="D", type=float, default=0.10,
             help="margin of the sequential 'no difference larger than D' verdict, as a "
                  "fraction (default: %(default)s = 10 points)")
    _add_root(p)

    p = add_command(
        subparsers, "report", handler="genmanip_artifacts.report:report",
        dist="genmanip-artifacts",
        help="write one self-contained HTML report of one or more runs",
        epilog="The file needs no network: plots are inline SVG, thumbnails small inline JPEGs. "
               "With two runs it includes their paired comparison (the second against the first).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories or run ids")
    add_flag(p, "--out", "-o", metavar="FILE", default="report.html",
             help="output file (default: %(default)s)")
    add_flag(p, "--alpha", metavar="A", type=float, default=0.05,
             help="level of the comparison's tests (default: %(default)s)")
    add_flag(p, "--no-thumbnails", dest="thumbnails", action="store_false", default=True,
             help="no video thumbnails of failed episodes")
    add_flag(p, "--viz-url", metavar="URL", default="http://127.0.0.1:55077",
             help="base URL of `gmp viz` for the episode links (default: %(default)s)")
    add_flag(p, "--viz-root", metavar="DIR", default=".",
             help="the --root that `gmp viz` serves, for those links (default: the current "
                  "directory)")
    _add_root(p)
