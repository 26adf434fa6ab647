"""``gmp doctor`` (genmanip-eval): measure the link and check a policy's contract before a run."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_connection_flags, add_flag

__all__ = ["register"]

_DIST = "genmanip-eval"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``doctor``."""
    p = add_command(
        subparsers, "doctor", handler="genmanip_eval.doctor.cli:doctor", dist=_DIST,
        help="measure the link and the server, check a policy's contract, advise settings",
        description=(
            "Pre-flight check before a long run. Part 1 measures the round trip, the bytes and\n"
            "codec cost of every wire mode, the server's time per step and per reset on one\n"
            "worker and the policy's latency, then advises workers, chunk size, codec and frames\n"
            "with the expected steps/s. Part 2 runs the policy on a short probe episode and checks\n"
            "its actions against the robot spec. The probe spends a few real steps of one episode\n"
            "(--no-steps: link only); the worker is released with /kill afterwards.\n"
            "Exit 0 when healthy, 1 when a check fails or warns."
        ),
        epilog="examples:\n  gmp doctor --url http://127.0.0.1:8087 --policy mypkg.policy:make --worker-ids 0,1,2,3\n"
               "  gmp doctor --url http://host:8087 --no-steps --json",
    )
    add_connection_flags(p, token_env="GMP_TOKEN")  # noqa: S106 - an env var name
    run = p.add_argument_group("run")
    add_flag(run, "--run-id", aliases=["--run_id"], metavar="ID", default=None,
             help="run id on the server (default: the server's current job)")
    add_flag(run, "--worker-ids", aliases=["--worker_ids"], metavar="IDS", default="0",
             help="the worker ids a run would use; the probe uses the first (default: %(default)s)")
    add_flag(run, "--no-steps", aliases=["--no_steps"], action="store_true", default=False,
             help="link-only check: no /reset and no /step (the contract is not checked)")
    add_flag(run, "--probe-steps", metavar="N", type=int, default=12,
             help="real steps of the probe episode (default: %(default)s)")
    add_flag(run, "--episode-steps", metavar="N", type=int, default=300,
             help="steps per episode assumed for episodes per hour (default: %(default)s)")
    policy = p.add_argument_group("policy")
    add_flag(policy, "--policy", metavar="SPEC", default=None,
             help="pkg.module:factory, a genmanip.policies name or a policy-server URL "
                  "(default: none: link and server only)")
    add_flag(policy, "--policy-arg", aliases=["--policy_arg"], metavar="KEY=VALUE",
             action="append", default=[], help="argument for the policy factory (repeatable)")
    add_flag(policy, "--chunk-size", aliases=["--chunk_size"], metavar="N", type=int, default=1,
             help="chunk size the run would use (default: %(default)s)")
    add_flag(policy, "--robot", aliases=["--robot_id", "--robot-id"], metavar="ID", default=None,
             help="robot id when the server does not say (default: from the server)")
    out = p.add_argument_group("output")
    # dest as_json: a handler keyword named json would shadow the json module.
    add_flag(out, "--json", dest="as_json", action="store_true", default=False,
             help="print the report as JSON on stdout (schema gmp-doctor/1, docs/doctor.md)")
