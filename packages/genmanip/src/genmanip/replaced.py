"""Handlers of reference-client commands that gmp replaced: each says what to use instead."""

from __future__ import annotations

from genmanip_protocol.errors import ExitCode
from genmanip_runtime.console import Console

__all__ = ["analyse"]


def analyse(*, args: list[str], console: Console) -> int:
    """``gmp analyse``: the reference client's analysis command; exits 2 naming the replacements."""
    console.error(
        "gmp has no 'analyse': per-task success rates with confidence intervals are printed by "
        "gmp eval (and gmp eval --json); compare two runs with gmp compare RUN_A RUN_B; one "
        "shareable page with gmp report RUN -o report.html; plots with gmp plot",
        hint="gmp compare --help, gmp report --help",
    )
    return int(ExitCode.USAGE)
