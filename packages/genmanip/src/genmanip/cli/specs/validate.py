"""``gmp validate`` (meta package): check actions, observations and steps.jsonl files."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_flag

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``validate``."""
    p = add_command(
        subparsers, "validate", handler="genmanip.validate:run_validate", dist="genmanip",
        help="check action / observation / steps.jsonl files against a robot's schema",
        epilog="Reads JSON, JSON lines, msgpack and pickle (through the allow-list only).\n"
               "Violations go to stdout as FILE:LINE or FILE[i].field; exit 4 when any.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="files to check")
    add_flag(p, "--robot", aliases=["--robot_id", "--robot-id"], metavar="ID", default=None,
             help="robot id (default: the rows' robot_id)")
    add_flag(p, "--kind", choices=["action", "observation", "steps", "auto"], default="auto",
             help="what the files hold (default: %(default)s: from name and content)")
