"""``gmp policy serve --help`` states the defaults the handler really uses.

The parser is stdlib-only, so its help strings spell the defaults of genmanip-eval's batcher and of
genmanip-serve as numbers; this test keeps them from drifting apart.
"""

from __future__ import annotations

import argparse
import re

import pytest
from genmanip.cli.parser import build_parser
from genmanip_eval.batcher import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S
from genmanip_serve import DEFAULT_MAX_MESSAGE_BYTES


def _sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise AssertionError(f"no subcommand {name}")


def _default_in_help(flag: str) -> float:
    serve = _sub(_sub(build_parser(), "policy"), "serve")
    (action,) = [a for a in serve._actions if flag in a.option_strings]
    m = re.search(r"default: ([0-9]+(?:\.[0-9]+)?)", action.help or "")
    assert m, f"{flag}: its help names no default: {action.help!r}"
    return float(m.group(1))


@pytest.mark.parametrize(
    ("flag", "real"),
    [
        ("--max-wait-ms", DEFAULT_MAX_WAIT_S * 1000.0),
        ("--max-batch", float(DEFAULT_MAX_BATCH)),
        ("--max-message-mb", DEFAULT_MAX_MESSAGE_BYTES / (1024 * 1024)),
    ],
)
def test_serve_help_states_the_real_defaults(flag: str, real: float) -> None:
    assert _default_in_help(flag) == pytest.approx(real)
