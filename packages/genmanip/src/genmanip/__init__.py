"""genmanip: the ``gmp`` command of the GenManip / EBench client toolkit.

The meta distribution pulls in every ``genmanip-*`` package; the command-line parser lives in
:mod:`genmanip.cli.parser` (stdlib only) and each subcommand's handler in the package that
implements it.
"""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
