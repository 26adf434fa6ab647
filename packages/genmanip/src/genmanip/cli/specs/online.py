"""``gmp online create|ready|submit|stop|run`` (genmanip-online; ``run`` in the meta package)."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from .._args import add_command, add_flag, add_group
from .eval import add_eval_flags

__all__ = ["duration", "register"]

_DIST = "genmanip-online"
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """A positive, finite duration in seconds: ``90``, ``90s``, ``30m``, ``1.5h``.

    Waiting is never unbounded: ``none``, ``0``, negative, ``inf`` and ``nan`` are refused.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|m|min|h)?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use seconds (90) or a unit (90s, 30m, 1.5h)"
        )
    value = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be positive and finite")
    return value


def _service_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("online service")
    add_flag(g, "--base-url", aliases=["--base_url"], metavar="URL", default=None,
             help="online service base URL (default: $GMP_ONLINE_URL, else [online] base_url "
                  "in the config file)")
    add_flag(g, "--token", metavar="TOKEN", default=None,
             help="service token (prefer $GMP_ONLINE_TOKEN or [online] token in the config "
                  "file: flags leak into shell history)")
    add_flag(g, "--timeout", metavar="SECONDS", type=duration, default=30.0,
             help="per-request HTTP timeout, never unlimited (default: %(default)s)")
    add_flag(g, "--ca-cert", aliases=["--ca_cert"], metavar="FILE", default=None,
             help="extra CA certificate to trust (verification is always on)")
    add_flag(g, "--insecure-http", aliases=["--insecure_http"], action="store_true",
             default=False,
             help="allow plain http:// to a host that is not this machine (the token travels "
                  "unencrypted)")


def _task_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("task")
    add_flag(g, "--task-id", aliases=["--task_id"], metavar="ID", default=None,
             help="reuse this task id instead of creating a task")
    add_flag(g, "--model-name", aliases=["--model_name"], metavar="NAME", default=None,
             help="model name shown by the service")
    add_flag(g, "--model-type", aliases=["--model_type"], metavar="TYPE", default=None,
             help="model type")
    add_flag(g, "--benchmark-set", aliases=["--benchmark_set"], metavar="SET", default=None,
             help="benchmark set to evaluate on")
    add_flag(g, "--submitter-name", aliases=["--submitter_name"], metavar="NAME", default=None,
             help="submitter name")
    add_flag(g, "--submitter-homepage", aliases=["--submitter_homepage"], metavar="URL",
             default=None, help="submitter homepage")
    add_flag(g, "--public", aliases=["--is-public", "--is_public"], dest="is_public",
             action="store_true", default=False, help="make the result public")


def _wait_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("waiting")
    add_flag(g, "--interval", metavar="SECONDS", type=duration, default=5.0,
             help="first delay between readiness polls; grows 1.5x per poll up to 30 s, "
                  "with jitter (default: %(default)s)")
    add_flag(g, "--deadline", metavar="SECONDS", type=duration, default=3600.0,
             help="give up waiting for an endpoint after this long, e.g. 90, 30m, 2h "
                  "(default: %(default)s)")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``online`` and its actions."""
    group = add_command(
        subparsers, "online", handler=None, dist=_DIST,
        help="use the hosted online evaluation service",
    )
    actions = add_group(group, dest="online_action")

    p = add_command(actions, "create", handler="genmanip_online.cli:create", dist=_DIST,
                    command="gmp online create",
                    help="create an evaluation task; prints its id on stdout")
    _service_flags(p)
    _task_flags(p)

    p = add_command(actions, "ready", handler="genmanip_online.cli:ready", dist=_DIST,
                    command="gmp online ready",
                    help="ask once whether a task has an endpoint; prints JSON on stdout")
    _service_flags(p)
    add_flag(p, "--task-id", aliases=["--task_id"], metavar="ID", required=True, help="task id")

    p = add_command(actions, "submit", handler="genmanip_online.cli:submit", dist=_DIST,
                    command="gmp online submit",
                    help="create a task (or reuse --task-id) and wait until its endpoint is ready",
                    epilog="stdout: {\"task_id\", \"endpoint\"} as JSON. Ctrl-C stops waiting and "
                           "offers to stop the task.")
    _service_flags(p)
    _task_flags(p)
    _wait_flags(p)
    add_flag(p, "--print-endpoint", aliases=["--print_endpoint"], action="store_true",
             default=False,
             help='print only {"task_id", "endpoint"} as JSON on stdout (for scripts)')

    p = add_command(actions, "stop", handler="genmanip_online.cli:stop", dist=_DIST,
                    command="gmp online stop", help="stop a task's evaluation on its endpoint")
    _service_flags(p)
    add_flag(p, "--task-id", aliases=["--task_id"], metavar="ID", required=True, help="task id")
    add_flag(p, "--endpoint", metavar="URL", default=None,
             help="the task's endpoint (default: asked from the service with `ready`)")
    add_flag(p, "--user-id", aliases=["--user_id"], metavar="ID", default=None,
             help="user id passed to the stop route")

    p = add_command(actions, "run", handler="genmanip.online_run:run", dist="genmanip",
                    command="gmp online run",
                    help="create a task, wait for its endpoint, evaluate a policy on it "
                         "(like gmp eval) and stop the task",
                    epilog="example:\n  GMP_ONLINE_TOKEN=... gmp online run --base-url "
                           "https://service --model-name mymodel --policy mypkg.policy:make")
    _service_flags(p)
    _task_flags(p)
    _wait_flags(p)
    add_flag(p, "--keep-task", aliases=["--keep_task"], action="store_true", default=False,
             help="do not stop the task when the evaluation ends")
    add_eval_flags(p, connection=False)
