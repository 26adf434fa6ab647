"""``gmp leaderboard list|bundle|submit|status`` (genmanip-leaderboard)."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_flag, add_group

__all__ = ["register"]

_DIST = "genmanip-leaderboard"


def _root(p: argparse.ArgumentParser) -> None:
    add_flag(p, "--root", aliases=["--project-root", "--project_root"], metavar="DIR",
             default=None,
             help="project or results root to search (default: the current directory and "
                  "$GENMANIP_RESULT_DIR)")


def _benchmark(p: argparse.ArgumentParser) -> None:
    add_flag(p, "--benchmark-id", aliases=["--benchmark_id"], metavar="ID", default=None,
             help="benchmark of the run (needed when the run id exists under several)")


def _server(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("leaderboard server")
    add_flag(g, "--host", metavar="HOST", default=None,
             help="leaderboard host (default: $LEADERBOARD_HOST, [leaderboard] host in the "
                  "config file, else localhost)")
    add_flag(g, "--port", metavar="PORT", type=int, default=None,
             help="leaderboard port (default: $LEADERBOARD_PORT, [leaderboard] port, else 8000)")
    add_flag(g, "--token", aliases=["--user-token", "--user_token"], metavar="TOKEN",
             default=None,
             help="author token (prefer $USER_TOKEN or [leaderboard] token in the config file: "
                  "flags leak into shell history)")
    add_flag(g, "--ca-cert", aliases=["--ca_cert"], metavar="FILE", default=None,
             help="extra CA certificate to trust (verification is always on)")
    add_flag(g, "--insecure-http", aliases=["--insecure_http"], action="store_true",
             default=False, help="plain HTTP, only for a leaderboard on this machine (loopback)")


def _videos(p: argparse.ArgumentParser) -> None:
    add_flag(p, "--include-videos", aliases=["--include_videos"], action="store_true",
             default=False, help="include videos (.mp4, ...) and .rrd recordings")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``leaderboard`` and its actions."""
    group = add_command(
        subparsers, "leaderboard", handler=None, dist=_DIST,
        help="list, bundle and submit finished runs to the leaderboard",
    )
    actions = add_group(group, dest="leaderboard_action")

    p = add_command(actions, "list", handler="genmanip_leaderboard.cli:list_runs", dist=_DIST,
                    command="gmp leaderboard list",
                    help="list local runs (both layouts), newest first, with episodes, success "
                         "rate and submission state")
    _root(p)
    # dest as_json: a handler keyword named json would shadow the json module.
    add_flag(p, "--json", dest="as_json", action="store_true", default=False, help="JSON on stdout")

    p = add_command(actions, "bundle", handler="genmanip_leaderboard.cli:bundle", dist=_DIST,
                    command="gmp leaderboard bundle",
                    help="write a verified submission bundle (zip + SHA-256 manifest) of a run; "
                         "prints its path")
    p.add_argument("run", metavar="RUN", help="run directory or run id")
    _root(p)
    _benchmark(p)
    add_flag(p, "--out", "-o", metavar="PATH", default=None,
             help="bundle file or directory, outside the results tree (default: "
                  "~/.cache/genmanip/bundles/<benchmark>/results_<run_id>.zip)")
    _videos(p)
    add_flag(p, "--allow-incomplete", aliases=["--allow_incomplete"], action="store_true",
             default=False, help="bundle a run with unfinished or missing episodes")

    p = add_command(actions, "submit", handler="genmanip_leaderboard.cli:submit", dist=_DIST,
                    command="gmp leaderboard submit",
                    help="bundle, verify and upload a complete run over HTTPS",
                    epilog="exit codes: 0 submitted, 10 already submitted and unchanged, "
                           "9 incomplete run, non-zero on any upload failure")
    add_flag(p, "--run-id", aliases=["--run_id"], metavar="ID", required=True, help="run id")
    add_flag(p, "-n", "--submission-name", aliases=["--submission_name"], metavar="NAME",
             required=True, help="submission name")
    add_flag(p, "-l", "--leaderboard-name", aliases=["--leaderboard_name"], metavar="NAME",
             required=True, help="leaderboard name")
    _benchmark(p)
    _root(p)
    _server(p)
    _videos(p)
    add_flag(p, "--force", action="store_true", default=False,
             help="upload again although this unchanged run was already submitted")

    p = add_command(actions, "status", handler="genmanip_leaderboard.cli:status", dist=_DIST,
                    command="gmp leaderboard status",
                    help="show a submission's upload status (JSON on stdout)")
    p.add_argument("submission_id", metavar="SUBMISSION_ID", help="submission id")
    _server(p)
