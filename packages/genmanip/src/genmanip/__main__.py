"""``python -m genmanip``: the ``gmp`` command."""

from __future__ import annotations

from genmanip.cli import console_main

if __name__ == "__main__":
    console_main()
