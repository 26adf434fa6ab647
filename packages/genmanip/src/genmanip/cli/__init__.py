"""The ``gmp`` command line: a stdlib-only parser (:mod:`.parser`) and the dispatcher (:mod:`.main`)."""

from __future__ import annotations

from typing import Any

__all__ = ["Terminated", "console_main", "interrupted_code", "stopped_by_signal"]

_INTERRUPTED = 130
_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where a Ctrl-C would be: every ``except
    KeyboardInterrupt`` / ``finally`` that tidies up after a Ctrl-C runs for it too."""


#: signals received by this process (set by the handlers :func:`console_main` installs)
_received: list[int] = []


def _on_sigint(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Terminated


def stopped_by_signal() -> KeyboardInterrupt | None:
    """The interrupt a received SIGINT/SIGTERM stands for, or None: an unexpected error that
    follows one is its doing (numpy, for one, turns a Ctrl-C during its import into an
    ``ImportError``), not a bug to report."""
    import signal

    if not _received:
        return None
    return Terminated() if _received[-1] == signal.SIGTERM else KeyboardInterrupt()


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """Say ``gmp: interrupted`` / ``gmp: terminated`` on stderr; return 130 / 143."""
    import sys

    term = isinstance(exc, Terminated)
    sys.stderr.write(f"\ngmp: {'terminated' if term else 'interrupted'}\n")
    sys.stderr.flush()
    return _TERMINATED if term else _INTERRUPTED


def console_main() -> None:
    """Script entry point (``gmp``, ``python -m genmanip``): ``sys.exit(main())``.

    Defined here, in a module that imports nothing, and importing the dispatcher inside the
    ``try``: a Ctrl-C while ``gmp`` is still starting ends with ``gmp: interrupted`` (130), not a
    ``KeyboardInterrupt`` traceback from the import machinery. SIGTERM is turned into
    :class:`Terminated` (143), so that a batch scheduler stopping a run gets the same clean stop.
    """
    import signal
    import sys

    handled = [signal.SIGTERM]
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (not when ignored)
            signal.signal(signal.SIGINT, _on_sigint)
            handled.append(signal.SIGINT)
        from .main import main

        code = main()
    except KeyboardInterrupt as exc:
        code = interrupted_code(exc)
    # gmp has said how it ended: a signal from here on (interpreter teardown) just ends the
    # process, without a KeyboardInterrupt traceback after the final message.
    for sig in handled:
        signal.signal(sig, signal.SIG_DFL)
    sys.exit(code)
