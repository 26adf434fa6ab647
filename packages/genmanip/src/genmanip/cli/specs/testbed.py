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
        subparsers, "testbed", handler=None, dist=_DIST,
        help="local GenManip server with a tiny deterministic world (for development and CI)",
    )
    actions = add_group(group, dest="testbed_action")
    p = add_command(
        actions, "serve", handler="genmanip_testbed.cli:serve", dist=_DIST,
        command="gmp testbed serve", help="serve the testbed until interrupted",
    )
    add_flag(p, "--host", metavar="HOST", default="127.0.0.1",
             help="bind address (default: %(default)s; anything else exposes the server)")
    add_flag(p, "--port", metavar="PORT", type=int, default=8087,
             help="port; 0 picks a free one (default: %(default)s)")
    add_flag(p, "--token", metavar="TOKEN", default=None,
             help="require this bearer token (prefer $GENMANIP_TOKEN)")
    add_flag(p, "--wire", choices=["legacy", "msgpack", "both"], default="both",
             help="accepted wire codecs (default: %(default)s)")
    add_flag(p, "--robot", aliases=["--robot_id", "--robot-id"], metavar="ID",
             default="manip/lift2/R5a", help="simulated robot (default: %(default)s)")
    add_flag(p, "--tasks", metavar="TASK", nargs="+", default=None,
             help="task names to serve (default: all built-in tasks)")
    add_flag(p, "--results-root", aliases=["--results_root"], metavar="DIR", default=".",
             help="root of saved/eval_results (default: the current directory)")
    add_bool_flag(p, "--save-process", default=True, aliases=["--save_process"],
                  help="record videos and meta_record.pkl per episode")
    add_flag(p, "--fault", metavar="SPEC", action="append", default=[],
             help="inject a fault, e.g. 'step:500:0.1' (repeatable)")
    add_flag(p, "--no-job", aliases=["--no_job"], action="store_true", default=False,
             help="start without a job (clients must 'gmp submit' first)")
    add_flag(p, "--run-id", aliases=["--run_id"], metavar="ID", default=None,
             help="run id of the initial job (default: timestamped)")
