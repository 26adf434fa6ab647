"""The CLI contract: every subcommand's handler takes exactly its command's dests, plus ``console``.

:func:`genmanip.cli.main.main` calls ``handler(**{dest: value for each dest}, console=...)``; a
dest the handler does not accept would only fail when that command runs, so this checks every
command of the real parser against its handler's signature. Every handler package is installed
with this package's ``test`` extra (genmanip-viz only on Python >= 3.11, where it exists).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator

import pytest
from genmanip.cli._args import CONSOLE_ARG, GLOBAL_DESTS, ROUTING_KEYS, handler_dests
from genmanip.cli.parser import build_parser


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command, parser)`` of every parser with a handler, sub-actions included."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) in seen:  # an alias of a command already listed
                continue
            seen.add(id(sub))
            if sub.get_default("handler"):
                yield " ".join((*path, name)), sub
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(build_parser()))


def test_every_command_is_checked() -> None:
    names = {name for name, _ in COMMANDS}
    assert {"eval", "demo", "validate", "testbed serve", "viz", "viz build", "online run",
            "leaderboard submit"} <= names
    assert len(names) >= 19


@pytest.mark.parametrize(("command", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_handler_accepts_exactly_the_commands_dests(
    command: str, parser: argparse.ArgumentParser
) -> None:
    module_name, _, func_name = str(parser.get_default("handler")).partition(":")
    if parser.get_default("dist") == "genmanip-viz" and sys.version_info < (3, 11):
        pytest.skip("genmanip-viz needs Python >= 3.11")
    handler = getattr(importlib.import_module(module_name), func_name)

    dests = handler_dests(parser)
    # The parser's own keys would overwrite a flag's value; console is main's.
    clashes = set(dests) & {*ROUTING_KEYS, *GLOBAL_DESTS, CONSOLE_ARG}
    assert not clashes, f"gmp {command}: dests {sorted(clashes)} are reserved"

    params = inspect.signature(handler).parameters
    expected = {*dests, CONSOLE_ARG}
    missing = sorted(expected - set(params))
    extra = sorted(set(params) - expected)
    assert not missing and not extra, (
        f"gmp {command} -> {module_name}:{func_name}: the handler does not accept {missing}, "
        f"and takes {extra} that the spec does not define"
    )
    for param in params.values():
        where = f"gmp {command}: {func_name}({param.name})"
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, f"{where} is not keyword-only"
        # The spec is the one owner of a flag's default.
        assert param.default is inspect.Parameter.empty, f"{where} has a default"
        assert param.annotation is not inspect.Parameter.empty, f"{where} has no type"
