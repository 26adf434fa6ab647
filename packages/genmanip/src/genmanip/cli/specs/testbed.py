"""``gmp testbed serve`` (genmanip-testbed): a faithful local GenManip server."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_bool_flag, add_command, add_flag, add_group

__all__ = ["register"]

_DIST = "genmanip-testbed"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``testbed`` and its ``serve`` action."""
    group = add_command(
        subparsers,
        "testbed",
        handler=None,
        dist=_DIST,
        help="local GenManip server with a tiny deterministic world (for development and CI)",
    )
    actions = add_group(group, dest="testbed_action")
    p = add_command(
        actions,
        "serve",
        handler="genmanip_testbed.cli:serve",
        dist=_DIST,
        command="gmp testbed serve",
        help="serve the testbed until interrupted (Ctrl-C stops it cleanly)",
    )
    add_flag(
        p,
        "--host",
        metavar="HOST",
        default="127.0.0.1",
        help="bind address (default: %(default)s; anything else exposes the server)",
    )
    add_flag(
        p,
        "--port",
        metavar="PORT",
        type=int,
        default=8087,
        help="port; 0 picks a free one (default: %(default)s)",
    )
    add_flag(
        p,
        "--token",
        metavar="TOKEN",
        default=None,
        help="require 'Authorization: Bearer TOKEN' on every route but /docs "
        "(default: $GMP_TESTBED_TOKEN, else the config file's [testbed] token, else no auth)",
    )
    add_flag(
        p,
        "--wire",
        choices=["legacy", "msgpack", "both"],
        default="both",
        help="wire codecs served; 'both' picks by Content-Type (default: %(default)s)",
    )
    add_flag(
        p,
        "--robot",
        aliases=["--robot_id", "--robot-id"],
        metavar="ID",
        default="manip/lift2/R5a",
        help="simulated robot (default: %(default)s)",
    )
    add_flag(
        p,
        "--tasks",
        metavar="CONFIG",
        nargs="+",
        default=None,
        help="task sets of the initial job: testbed/all (default), testbed/smoke, "
        "testbed/<reach|lift>[/<easy|hard>] or one task name",
    )
    add_flag(
        p,
        "--results-root",
        aliases=["--results_root"],
        metavar="DIR",
        default=".",
        help="project root: results go to DIR/saved/eval_results (default: the current directory)",
    )
    add_bool_flag(
        p,
        "--save-process",
        default=True,
        aliases=["--save_process"],
        help="write per-camera mp4s and meta_record.pkl for every episode",
    )
    add_flag(
        p,
        "--fault",
        metavar="SPEC",
        action="append",
        default=[],
        help="inject faults, e.g. 'latency=20ms,error_rate=0.1,errors=500|503,reset_after=0.05,"
        "die_worker=1@30,seed=7' (repeatable; see docs/testbed.md)",
    )
    add_flag(
        p,
        "--no-job",
        aliases=["--no_job"],
        action="store_true",
        default=False,
        help="start idle, waiting for /start_new_job (e.g. from 'gmp submit')",
    )
    add_flag(
        p,
        "--run-id",
        aliases=["--run_id"],
        metavar="ID",
        default=None,
        help="run id of the initial job (default: a timestamp, the real server's rule)",
    )
    add_flag(
        p,
        "--num-steps",
        aliases=["--num_steps", "-n"],
        metavar="N",
        type=int,
        default=None,
        help="episode step limit for every task (default: each task's own)",
    )
    add_flag(
        p,
        "--capacity",
        metavar="N",
        type=int,
        default=8,
        help="worker slots; more workers get InsufficientResourcesError (default: %(default)s)",
    )
    add_flag(
        p,
        "--reset-delay",
        aliases=["--reset_delay"],
        metavar="SECONDS",
        type=float,
        default=0.03,
        help="duration of a background reset (default: %(default)s)",
    )
    add_flag(
        p,
        "--is-relative-action",
        aliases=["--is_relative_action", "-ira"],
        action="store_true",
        default=False,
        help="default of a missing 'is_rel' in actions (the real server's -ira)",
    )
    add_flag(
        p,
        "--seed",
        metavar="N",
        type=int,
        default=0,
        help="world seed: 0 gives the default scenes, other values vary every episode (default: 0)",
    )
    add_flag(
        p,
        "--without-render",
        aliases=["--without_render", "-wor"],
        action="store_true",
        default=False,
        help="observations without camera frames (the real server's -wor)",
    )
    add_flag(
        p,
        "--online-token",
        aliases=["--online_token"],
        metavar="TOKEN",
        default=None,
        help="bearer token of the online-service emulation (default: the server token)",
    )
    add_flag(
        p,
        "--leaderboard-token",
        aliases=["--leaderboard_token"],
        metavar="TOKEN",
        default=None,
        help="author_token the leaderboard emulation accepts (default: the server token; "
        "none: any non-empty token)",
    )
    add_flag(
        p,
        "--ssl-certfile",
        aliases=["--ssl_certfile"],
        metavar="PEM",
        default=None,
        help="serve HTTPS with this certificate (with --ssl-keyfile)",
    )
    add_flag(
        p,
        "--ssl-keyfile",
        aliases=["--ssl_keyfile"],
        metavar="PEM",
        default=None,
        help="private key for --ssl-certfile",
    )
