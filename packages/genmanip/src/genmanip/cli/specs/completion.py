"""``gmp completion`` (meta package): shell completion scripts generated from this parser."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``completion``."""
    p = add_command(
        subparsers, "completion", handler="genmanip.completion:run_completion", dist="genmanip",
        help="print a shell completion script for bash or zsh",
        epilog='install:\n  eval "$(gmp completion bash)"    # in ~/.bashrc\n'
               "  source <(gmp completion zsh)     # in ~/.zshrc, after compinit",
    )
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
