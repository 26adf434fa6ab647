"""``gmp`` entry point: parse, import the handler lazily, run it, map exceptions to exit codes.

This module is the single place that turns the parsed command line into a handler call: a handler
takes keyword-only arguments named after its command's dests (:func:`handler_kwargs`) plus
``console``, a :class:`genmanip_runtime.console.Console` built here from the global ``-v``/``-q``
flags; no argparse ``Namespace`` reaches a handler. It is also the single place where exceptions
become exit codes:

* :class:`genmanip_protocol.errors.GenmanipError` -> ``gmp: error: <message>`` (+ ``hint: ...``)
  on stderr and the exception's ``exit_code``;
* :class:`KeyboardInterrupt` -> 130 (``gmp: interrupted``), SIGTERM (:class:`Terminated`) -> 143;
* a missing handler package -> an install hint and ``ExitCode.NOT_INSTALLED`` (3);
* anything else is a bug -> a one-line message and ``ExitCode.INTERNAL`` (70); the traceback is
  printed with ``-v``.

Everything this module prints (error lines, hints, tracebacks, log records) goes through
:func:`genmanip_runtime.text.safe_text` first: a message quoting a server cannot move the cursor,
write the clipboard or show a registered token (see ``_console_bridge`` and :class:`_SafeFormatter`).

Only the stdlib is imported before a handler runs, so ``gmp --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from . import interrupted_code, stopped_by_signal
from ._args import CONSOLE_ARG, handler_dests
from .parser import build_parser

if TYPE_CHECKING:
    from genmanip_runtime.console import Console

__all__ = ["configure_logging", "console_main", "handler_kwargs", "main", "resolve_handler"]

#: A handler: keyword-only arguments (its command's dests and ``console``), an exit code back.
Handler = Callable[..., int | None]

# Mirrors genmanip_protocol.errors.ExitCode; kept as literals so that a broken or missing
# genmanip-protocol still produces the right codes and messages here.
_USAGE = 2
_NOT_INSTALLED = 3
_INTERNAL = 70

_log = logging.getLogger("genmanip.cli")


class HandlerNotInstalled(Exception):
    """The package that ships a subcommand's handler (or one of its dependencies) is missing."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _lowercase_level(record: logging.LogRecord) -> bool:
    # "gmp: warning: ...", like "gmp: error: ..." (and unlike logging's "WARNING").
    record.level = record.levelname.lower()
    return True


class _SafeFormatter(logging.Formatter):
    """Delegates to :class:`genmanip_runtime.text.SafeFormatter` (log records are made safe:
    secrets scrubbed, control characters escaped), imported at the first record so that ``gmp``
    stays stdlib-only until a handler runs; plain formatting when genmanip-runtime is missing (then
    nothing from a server can be in a record)."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._delegate: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._delegate is None:
            try:
                from genmanip_runtime.text import SafeFormatter
            except ImportError:
                self._delegate = logging.Formatter(self._fmt)
            else:
                self._delegate = SafeFormatter(self._fmt)
        return self._delegate.format(record)


class _LiveAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stderr handler that never writes onto the live progress line: the line is cleared
    first and drawn again after (genmanip_runtime.console.write_above_live); plain writes when
    genmanip-runtime is missing (then no progress line exists).

    Without an explicit ``stream`` it writes to ``sys.stderr`` as it is at each record (as
    :data:`logging.lastResort` does): ``main()`` called in-process (tests, embedding code) leaves
    the handler installed, and the ``sys.stderr`` of that call may since have been closed.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._follow = stream is None
        super().__init__(stream if stream is not None else sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self._follow else self._stream

    @stream.setter
    def stream(self, value: TextIO) -> None:
        self._stream = value

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        try:
            from genmanip_runtime.console import write_above_live
        except ImportError:
            self.stream.write(text)
            self.flush()
            return
        try:
            write_above_live(self.stream, text)
        except Exception:
            self.handleError(record)


def configure_logging(verbose: int, quiet: bool, stream: TextIO | None = None) -> None:
    """Configure the root logger once: stderr, WARNING by default, -v INFO, -vv DEBUG, -q ERROR.

    Records are formatted by :class:`_SafeFormatter`: a record quoting a server's reply cannot
    drive the terminal, forge a line or show a registered token."""
    if quiet:
        level = logging.ERROR
    elif verbose >= 2:
        level = logging.DEBUG
    elif verbose == 1:
        level = logging.INFO
    else:
        level = logging.WARNING
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_gmp_handler", False):
            root.removeHandler(h)
    handler = _LiveAwareHandler(stream)
    handler._gmp_handler = True  # type: ignore[attr-defined]
    fmt = "%(levelname)s %(name)s: %(message)s" if verbose >= 2 else "gmp: %(level)s: %(message)s"
    handler.addFilter(_lowercase_level)
    handler.setFormatter(_SafeFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)


def _install_hint(command: str, dist: str, extra: str | None, module: str, missing: str) -> str:
    target = f"'genmanip[{extra}]'" if extra else dist
    top = module.split(".", 1)[0]
    if missing and missing.split(".", 1)[0] != top:
        return (
            f"'{command}' needs the Python module {missing!r}, which is not installed "
            f"(it is a dependency of {dist}): pip install {target}"
        )
    return f"'{command}' needs the {dist} package: pip install {target}"


def resolve_handler(
    spec: str, *, command: str = "gmp", dist: str = "genmanip", extra: str | None = None
) -> Handler:
    """Import ``"package.module:function"`` and return the function.

    Raises :class:`HandlerNotInstalled` when the module (or a module it imports) is missing.
    """
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"bad handler spec {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        raise HandlerNotInstalled(_install_hint(command, dist, extra, module_name, missing)) from exc
    try:
        func: Handler = getattr(module, func_name)
    except AttributeError:
        # The package is installed but too old (or too new) for this gmp.
        raise HandlerNotInstalled(
            f"'{command}' is not provided by the installed {dist} ({module_name} has no "
            f"{func_name!r}): pip install -U {dist}"
        ) from None
    return func


def handler_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of the handler ``args`` routes to, without ``console``.

    One per dest its command's parser declares (:func:`genmanip.cli._args.handler_dests`): not
    the parser's routing keys, not the global flags, not a parent command's flags. A dest the
    handler does not accept is a TypeError, i.e. a loud failure (and a test checks every command).
    """
    values = vars(args)
    return {dest: values[dest] for dest in handler_dests(values["command_parser"])}


def _console(command: str, verbose: int, quiet: bool) -> Console:
    # Imported only now (after the handler): `gmp --help` stays stdlib-only. Every handler package
    # depends on genmanip-runtime, so it is missing only from a broken install.
    try:
        from genmanip_runtime.console import Console
    except ModuleNotFoundError as exc:
        missing = exc.name or "genmanip_runtime"
        raise HandlerNotInstalled(
            _install_hint(command, "genmanip-runtime", None, "genmanip_runtime", missing)
        ) from exc
    return Console.from_flags(verbose=verbose, quiet=quiet)


def _print_error(message: str, hint: str | None = None) -> None:
    from .._console_bridge import error_line

    sys.stderr.write(error_line(message, hint))
    sys.stderr.flush()


def _print_traceback() -> None:
    # A traceback quotes the exception's message, i.e. possibly a server's text: made safe too.
    from .._console_bridge import safe_block

    sys.stderr.write(safe_block(traceback.format_exc()))
    sys.stderr.flush()


def _is_genmanip_error(exc: BaseException) -> bool:
    errors = sys.modules.get("genmanip_protocol.errors")
    return errors is not None and isinstance(exc, errors.GenmanipError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gmp`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    try:
        parser = build_parser()
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help, --version, usage errors
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else _USAGE)
    except KeyboardInterrupt as exc:
        return interrupted_code(exc)

    # The top-level parser always sets both (default 0 / False); a subcommand's copies only
    # override them when given (their default is SUPPRESS).
    verbose = int(args.verbose or 0)
    quiet = bool(args.quiet)
    configure_logging(verbose, quiet)

    if args.handler is None:
        # `gmp` or a command group without its action (`gmp online`): show the help.
        (args.help_parser or parser).print_help(sys.stdout)
        return 0

    try:
        handler = resolve_handler(args.handler, command=args.command, dist=args.dist, extra=args.extra)
        kwargs = handler_kwargs(args)
        kwargs[CONSOLE_ARG] = _console(args.command, verbose, quiet)
        result = handler(**kwargs)
    except HandlerNotInstalled as exc:
        _print_error(exc.message)
        return _NOT_INSTALLED
    except KeyboardInterrupt as exc:
        return interrupted_code(exc)
    except BrokenPipeError:
        # `gmp leaderboard list | head`: the reader went away; not an error worth a traceback.
        _silence_stdout()
        return 0
    except SystemExit:
        raise
    except BaseException as exc:
        if _is_genmanip_error(exc):
            if verbose >= 1:
                _print_traceback()
            _print_error(str(exc), getattr(exc, "hint", None))
            return int(exc.exit_code)  # type: ignore[attr-defined]
        if not isinstance(exc, Exception):
            raise
        if verbose >= 1:
            _print_traceback()
        signalled = stopped_by_signal()
        if signalled is not None:
            return interrupted_code(signalled)
        _print_error(
            f"internal error in '{args.command}': {type(exc).__name__}: {exc}",
            None if verbose else "this is a bug in gmp; rerun with -v for the traceback and report it",
        )
        return _INTERNAL
    if result is None:
        return 0
    return int(result)


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def console_main() -> None:
    """Script entry point: see :func:`genmanip.cli.console_main` (the one ``gmp`` uses)."""
    from . import console_main as entry

    entry()
