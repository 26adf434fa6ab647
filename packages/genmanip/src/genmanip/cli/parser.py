"""The ``gmp`` argument parser: stdlib only, so ``gmp --help`` never imports numpy or a handler.

Each module in :mod:`genmanip.cli.specs` declares the flags of one area and registers its
subcommands with ``register(subparsers)``. Every subcommand sets the defaults

* ``handler``: ``"package.module:function"``, imported lazily by :func:`genmanip.cli.main.main`;
* ``dist``: the distribution that ships the handler, ``extra``: the ``genmanip[...]`` extra;
* ``command``: the full command for messages (``"gmp viz build"``).
"""

from __future__ import annotations

import argparse
import importlib

from ._args import GmpArgumentParser, HelpFormatter, add_global_flags

__all__ = ["EXIT_CODES", "SPEC_MODULES", "VersionAction", "build_parser", "docs_pointer"]

#: Spec modules in the order their commands appear in ``gmp --help``.
SPEC_MODULES: tuple[str, ...] = (
    "eval",
    "doctor",
    "testbed",
    "policy",
    "validate",
    "artifacts",
    "compare",
    "viz",
    "online",
    "leaderboard",
    "completion",
)

_DESCRIPTION = """\
gmp: evaluate robot-manipulation policies against a GenManip / EBench server, record and
inspect the episodes, and submit results.

  gmp testbed serve              a faithful local GenManip server (no GPU)
  gmp eval --policy zero         run a policy against a server, recording every episode
  gmp viz                        browse recorded episodes (videos, plots, steps)
"""

#: ``(code, meaning)`` of every exit code (mirrors ``genmanip_protocol.errors.ExitCode``; a test
#: keeps them equal — this module must not import anything outside the stdlib).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "the command ran but failed (a worker died, an upload was rejected, ...)"),
    (2, "usage error (bad flag or argument, bad config)"),
    (3, "the subcommand's package is not installed"),
    (4, "invalid input (an action, observation or file failed validation)"),
    (5, "the server answered with an error or an unacceptable reply"),
    (6, "the server could not be reached"),
    (7, "a call timed out"),
    (8, "missing or rejected credentials"),
    (9, "refused for safety (unsubmitted results, incomplete run, ...)"),
    (10, "nothing to do"),
    (70, "internal error (a bug in gmp; rerun with -v for the traceback)"),
    (130, "interrupted (Ctrl-C)"),
    (143, "terminated (SIGTERM), after cleaning up like Ctrl-C"),
)

_EPILOG = """\
exit codes: 0 ok, 1 failure, 2 usage, 3 package not installed, 4 invalid input,
5 server error, 6 unreachable, 7 timeout, 8 auth, 9 refused, 10 nothing to do,
70 internal error, 130 interrupted, 143 terminated.
Docs: {docs}.  Shell completion: gmp completion bash|zsh
"""

#: ``[project.urls]`` labels of the genmanip distribution, in order of preference for "Docs:".
_DOC_LABELS = ("documentation", "docs", "homepage", "home", "source", "repository")


def docs_pointer() -> str:
    """Where ``gmp --help`` sends the reader: the genmanip distribution's documentation URL (its
    ``[project.urls]``, read from the installed metadata), else the man page. Never a path
    relative to a source checkout the user does not have."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        entries = metadata("genmanip").get_all("Project-URL") or []
    except PackageNotFoundError:
        entries = []
    urls: dict[str, str] = {}
    for entry in entries:
        label, _, url = str(entry).partition(",")
        if url.strip():
            urls.setdefault(label.strip().lower(), url.strip())
    for label in _DOC_LABELS:
        if label in urls:
            return urls[label]
    if urls:
        return next(iter(urls.values()))
    return "see the gmp(1) man page (man gmp)"


class VersionAction(argparse.Action):
    """``--version``: every installed ``genmanip*`` distribution with its version, then Python."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object):
        super().__init__(
            option_strings,
            dest=dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show the versions of the installed genmanip packages and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        import sys

        from .versions import format_versions

        sys.stdout.write(format_versions())  # data: stdout, so `gmp --version | grep` works
        sys.stdout.flush()
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """Return the full ``gmp`` parser (all subcommands, whether or not their package is installed)."""
    parser = GmpArgumentParser(
        prog="gmp",
        description=_DESCRIPTION,
        epilog=_EPILOG.format(docs=docs_pointer()),
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=VersionAction)
    add_global_flags(parser, in_subcommand=False)
    parser.set_defaults(handler=None, dist="genmanip", extra=None, command="gmp", help_parser=None)
    subparsers = parser.add_subparsers(title="commands", dest="cmd", metavar="COMMAND")
    for name in SPEC_MODULES:
        module = importlib.import_module(f"{__package__}.specs.{name}")
        module.register(subparsers)
    return parser
