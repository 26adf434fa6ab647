"""One module per area declaring its ``gmp`` subcommands and flags (stdlib only).

Each module defines ``register(subparsers) -> None``; :data:`genmanip.cli.parser.SPEC_MODULES`
lists them in help order. Handlers are named as strings and imported only when the command runs.
"""

from __future__ import annotations

__all__: list[str] = []
