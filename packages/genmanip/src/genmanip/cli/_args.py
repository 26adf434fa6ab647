"""Small argparse helpers shared by the spec modules (stdlib only: imported by ``gmp --help``).

The reference client mixes ``--worker_ids`` and ``--dry-run`` spellings. gmp's flags are
hyphenated; the reference's underscore spellings are still accepted as *aliases* that parse to the
same destination but are hidden from ``--help`` and from the man page, so old scripts keep working
without advertising two spellings for everything.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = [
    "CONSOLE_ARG",
    "GLOBAL_DESTS",
    "ROUTING_KEYS",
    "GmpArgumentParser",
    "HelpFormatter",
    "add_bool_flag",
    "add_command",
    "add_connection_flags",
    "add_flag",
    "add_global_flags",
    "add_group",
    "did_you_mean",
    "handler_dests",
]

#: Parser-like things that accept ``add_argument`` (parsers, argument groups, exclusive groups).
_Container = Any

#: Namespace keys the parser sets for :func:`genmanip.cli.main.main` (routing, messages, help);
#: they are never handler arguments.
ROUTING_KEYS: tuple[str, ...] = ("handler", "dist", "extra", "command", "help_parser", "command_parser")

#: Dests of the global flags (:func:`add_global_flags`). Handlers do not receive them: main turns
#: them into one typed value, the ``console`` keyword (:data:`CONSOLE_ARG`).
GLOBAL_DESTS: tuple[str, ...] = ("verbose", "quiet")

#: The keyword argument main adds to every handler call: a ``genmanip_runtime.console.Console``
#: honouring ``-v``/``-q`` (and ``NO_COLOR``, through the console's own colour rule).
CONSOLE_ARG = "console"


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


def did_you_mean(given: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``given`` most likely misspells: one it is a prefix of, else difflib's."""
    if not given:
        return None
    prefixed = [c for c in candidates if c.startswith(given) and c != given]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(given, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


class GmpArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors point the right way.

    * an unknown command or action (``gmp evl``) says ``did you mean 'eval'?``;
    * an unknown flag (``gmp eval --work 3``) is reported by the *subcommand's* parser (its usage,
      not the top level's), with a did-you-mean among that subcommand's flags.

    Sub-parsers are made of the same class (argparse uses the parent's type).
    """

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            target = getattr(ns, "command_parser", None)
            if not isinstance(target, argparse.ArgumentParser):
                target = self
            target.error(_unrecognized(target, extras))
        return ns

    def error(self, message: str) -> NoReturn:
        m = _INVALID_CHOICE.search(message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group("choices"))
            guess = did_you_mean(m.group("given"), choices)
            if guess:
                message += f"; did you mean {guess!r}?"
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n  (see '{self.prog} --help')\n")


def _unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    message = f"unrecognized arguments: {' '.join(extras)}"
    visible = [s for a in parser._actions for s in a.option_strings if a.help is not argparse.SUPPRESS]
    for arg in extras:
        if arg.startswith("-") and len(arg) > 1:
            guess = did_you_mean(arg.split("=", 1)[0], visible)
            if guess:
                return f"{message}; did you mean {guess}?"
    return message


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps description/epilog line breaks (examples) and widens the option column a bit."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("max_help_position", 32)
        super().__init__(prog, **kwargs)


def add_flag(
    container: _Container,
    *flags: str,
    aliases: Sequence[str] = (),
    **kwargs: Any,
) -> argparse.Action:
    """Add an option with visible ``flags`` and hidden ``aliases`` (same ``dest``, same action).

    ``dest`` is derived from the first long visible flag when not given.
    """
    if "dest" not in kwargs:
        long_flags = [f for f in flags if f.startswith("--")]
        if not long_flags:
            raise ValueError(f"add_flag{flags}: give dest= or a long flag")
        kwargs["dest"] = long_flags[0][2:].replace("-", "_")
    action: argparse.Action = container.add_argument(*flags, *aliases, **kwargs)
    if aliases:
        # argparse finds options through the parser's option-string table, not through
        # ``action.option_strings``; trimming the latter keeps the aliases working while help,
        # usage, error messages and the man page show the hyphenated spelling only.
        action.option_strings = [s for s in action.option_strings if s not in aliases]
    return action


class _Replaced(argparse.Action):
    """A reference-client flag gmp does not have: using it is a usage error naming what to use."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, replacement: str,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is the reference client's; gmp has none: {self.replacement}")


def add_replaced(container: _Container, *flags: str, replacement: str, takes_value: bool = False) -> None:
    """Hidden ``flags`` of the reference client that gmp replaced: each exits 2 saying what to use
    instead (``replacement``), never silently accepted nor a bare "unrecognized arguments"."""
    container.add_argument(*flags, action=_Replaced, replacement=replacement, dest=argparse.SUPPRESS,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                           nargs="?" if takes_value else 0)


def add_bool_flag(
    container: _Container,
    name: str,
    *,
    default: bool,
    help: str,
    aliases: Sequence[str] = (),
    dest: str | None = None,
) -> None:
    """Add ``--name`` / ``--no-name`` (and hidden ``--a_b``/``--no_a_b`` style ``aliases``).

    ``aliases`` lists positive spellings (``"--save_process"``); their ``--no_`` forms are added
    too. Help shows ``--name`` with the default state; ``--no-name`` is listed in the usage line.
    """
    positive = name if name.startswith("--") else f"--{name}"
    dest = dest or positive[2:].replace("-", "_")
    negative = "--no-" + positive[2:]
    state = "on" if default else "off"
    add_flag(container, positive, aliases=list(aliases), dest=dest, action="store_true",
             default=default, help=f"{help} (default: {state})")
    add_flag(container, negative, aliases=["--no_" + a[2:] for a in aliases], dest=dest,
             action="store_false", help=f"turn {positive} off" if default else argparse.SUPPRESS)


def add_global_flags(parser: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    """``-v/--verbose`` (repeatable) and ``-q/--quiet``.

    They are accepted before and after the subcommand (``gmp -v eval`` and ``gmp eval -v``); on
    subcommands their default is SUPPRESS so a value given before the subcommand is not reset.
    """
    group = parser.add_argument_group("output") if not in_subcommand else parser
    default_v: Any = argparse.SUPPRESS if in_subcommand else 0
    default_q: Any = argparse.SUPPRESS if in_subcommand else False
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default_v,
        help="more output on stderr (repeat for debug logs and tracebacks)"
        if not in_subcommand
        else argparse.SUPPRESS,
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default_q,
        help="only errors on stderr; no progress line" if not in_subcommand else argparse.SUPPRESS,
    )


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    handler: str | None,
    dist: str,
    help: str,
    description: str | None = None,
    epilog: str | None = None,
    extra: str | None = None,
    command: str | None = None,
    aliases: Sequence[str] = (),
    hidden: bool = False,
) -> argparse.ArgumentParser:
    """Create subcommand ``name`` whose lazy handler is ``handler`` (``"pkg.module:function"``).

    ``dist`` is the distribution that ships the handler and ``extra`` the ``genmanip[...]`` extra
    that installs it (None when a plain ``pip install <dist>`` is the advice). ``command`` is the
    full command for messages (``"gmp viz build"``); default ``"gmp <name>"``. ``handler=None``
    marks a command group: running it without an action prints its help. ``hidden`` keeps a
    compatibility spelling (``visualize``) out of the command list.
    """
    listing: dict[str, Any] = {} if hidden else {"help": help}
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        **listing,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=epilog,
        formatter_class=HelpFormatter,
        allow_abbrev=False,
        aliases=list(aliases),
    )
    parser._gmp_hidden = hidden  # type: ignore[attr-defined]  # read by the man page renderer
    add_global_flags(parser, in_subcommand=True)
    parser.set_defaults(
        handler=handler,
        dist=dist,
        extra=extra,
        command=command or f"gmp {name}",
        help_parser=parser if handler is None else None,
        # The parser of the command that ran (a sub-action's replaces its group's): main reads the
        # handler's keyword arguments off it (handler_dests).
        command_parser=parser,
    )
    return parser


def handler_dests(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """The dests of the options and positionals ``parser`` itself declares: its handler's keywords.

    Left out: ``--help``, the global flags (:data:`GLOBAL_DESTS`), a command group's choice of
    action (the action has its own parser) and anything whose dest is SUPPRESS. The flags of a
    parent command (``gmp viz --root`` for ``gmp viz build``) are not the sub-action's: they are
    not in its parser. Two flags sharing a dest (``--record``/``--no-record``) give one keyword.
    """
    dests: dict[str, None] = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.dest == argparse.SUPPRESS or action.dest in GLOBAL_DESTS:
            continue
        dests[action.dest] = None
    return tuple(dests)


def add_group(
    parser: argparse.ArgumentParser, *, dest: str, title: str = "actions", required: bool = False
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Sub-actions of a command group (``gmp online create``); ``dest`` names the chosen action."""
    return parser.add_subparsers(title=title, dest=dest, metavar="ACTION", required=required)


def add_connection_flags(
    container: _Container,
    *,
    default_host: str | None = "127.0.0.1",
    default_port: int | None = 8087,
    url: bool = True,
    token_env: str = "GMP_TOKEN",  # noqa: S107 - an env var name, not a secret
    config_section: str | None = None,
) -> None:
    """``--url URL`` or ``--host H --port P``, and ``--token`` (for a GenManip server).

    The token is better given through the environment or the config file: a flag value shows up
    in process lists and shell history. With ``config_section`` the server comes from ``[section]
    url`` in the config file when no flag names it: ``--host``/``--port`` then default to None (so
    the handler can tell "not given") and ``default_host``/``default_port`` are only named in help.
    """
    group = container.add_argument_group("server") if hasattr(container, "add_argument_group") else container
    host_default: str | None = default_host
    port_default: int | None = default_port
    url_help = "server base URL, e.g. https://host:8087 (overrides --host/--port)"
    if config_section:
        host_default = port_default = None
        fallback = f"http://{default_host}:{default_port}" if default_host else "none"
        url_help = (f"server base URL, e.g. https://host:8087 (overrides --host/--port; default: "
                    f"[{config_section}] url in the config file, else {fallback})")
    if url:
        add_flag(group, "--url", metavar="URL", default=None, help=url_help)
    add_flag(
        group,
        "--host",
        metavar="HOST",
        default=host_default,
        help="server host" + (f" (default: {default_host})" if default_host else ""),
    )
    add_flag(
        group,
        "--port",
        metavar="PORT",
        type=int,
        default=port_default,
        help="server port" + (f" (default: {default_port})" if default_port else ""),
    )
    add_flag(
        group,
        "--token",
        metavar="TOKEN",
        default=None,
        help=f"bearer token (prefer ${token_env} or the config file: flags leak into shell history)",
    )
    add_flag(
        group,
        "--ca-cert",
        aliases=["--ca_cert"],
        metavar="FILE",
        default=None,
        help="CA bundle that signed an https:// server's certificate (verification is always on)",
    )
