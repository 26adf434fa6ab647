"""The ``gmp`` command line: a stdlib-only parser (:mod:`.parser`) and the dispatcher (:mod:`.main`)."""

from __future__ import annotations

__all__ = ["console_main"]

_INTERRUPTED = 130


def console_main() -> None:
    """Script entry point (``gmp``, ``python -m genmanip``): ``sys.exit(main())``.

    Defined here, in a module that imports nothing, and importing the dispatcher inside the
    ``try``: a Ctrl-C while ``gmp`` is still starting ends with ``gmp: interrupted`` (130), not a
    ``KeyboardInterrupt`` traceback from the import machinery.
    """
    import sys

    try:
        from .main import main

        code = main()
    except KeyboardInterrupt:
        sys.stderr.write("\ngmp: interrupted\n")
        code = _INTERRUPTED
    sys.exit(code)
