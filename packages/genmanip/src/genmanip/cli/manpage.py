"""Render the ``gmp(1)`` man page from the real parser (used by the wheel build hook).

Stdlib + argparse-manpage only: the build hook imports this module from the source tree inside
an isolated build environment where no other genmanip package is installed.
"""

from __future__ import annotations

import argparse
import os

from .parser import EXIT_CODES, build_parser

__all__ = ["ENVIRONMENT", "render_manpage"]

#: Environment variables read by gmp commands: (name, meaning).
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("GMP_TOKEN", "bearer token of the evaluation server (eval, submit, status)"),
    ("GMP_TESTBED_TOKEN", "token the testbed server requires (testbed serve)"),
    ("GENMANIP_RESULT_DIR", "results root (default ./client_results)"),
    ("GMP_ONLINE_URL, GMP_ONLINE_TOKEN", "online service base URL and token"),
    ("LEADERBOARD_HOST, LEADERBOARD_PORT", "leaderboard server (default localhost:8000)"),
    ("USER_TOKEN", "leaderboard author token"),
    ("GMP_LEADERBOARD_CA", "extra CA certificate to trust for the leaderboard"),
    ("GMP_CONFIG", "config file (default ~/.config/genmanip/config.toml)"),
    ("GMP_CACHE_DIR", "cache directory (default ~/.cache/genmanip)"),
    ("GMP_FFMPEG", "ffmpeg binary (default: the imageio-ffmpeg wheel's)"),
    ("NO_COLOR", "disable colour on the terminal (https://no-color.org)"),
    ("FORCE_COLOR", "colour even when stderr is not a terminal"),
)


def _strip_hidden(parser: argparse.ArgumentParser) -> None:
    """Remove compatibility spellings (``visualize``) so the page lists each command once."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in list(action.choices.items()):
                if getattr(sub, "_gmp_hidden", False):
                    del action.choices[name]
                else:
                    _strip_hidden(sub)


def render_manpage(version: str | None = None) -> str:
    """The roff source of ``gmp.1`` for genmanip ``version`` (default: the source tree's)."""
    if version is None:
        from genmanip.__about__ import __version__

        version = __version__
    # argparse wraps at the terminal width: pin it so every build ships the same page.
    saved_columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        return _render(version)
    finally:
        if saved_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved_columns


def _render(version: str) -> str:
    from argparse_manpage.manpage import Manpage

    parser = build_parser()
    _strip_hidden(parser)
    parser.epilog = None  # the exit codes get their own EXIT STATUS section below
    page = Manpage(
        parser,
        _data={
            "project_name": "genmanip",
            "version": version,
            "description": "evaluate, record, inspect and submit robot-manipulation policies "
            "on GenManip / EBench servers",
            "manual_title": "gmp manual",
            "manual_section": 1,
        },
        format="pretty",
    )
    exit_lines = "\n".join(f".TP\n\\fB{code}\\fR\n{meaning}" for code, meaning in EXIT_CODES)
    env_lines = "\n".join(f".TP\n\\fB{name}\\fR\n{meaning}" for name, meaning in ENVIRONMENT)
    page.add_section("exit status", ">", exit_lines)
    page.add_section("environment", ">", env_lines)
    page.add_section(
        "files", ">",
        ".TP\n\\fB~/.config/genmanip/config.toml\\fR\nserver URLs and tokens per section "
        "(override with GMP_CONFIG)",
    )
    return str(page)
