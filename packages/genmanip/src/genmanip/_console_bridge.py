"""Error-line formatting for ``gmp`` that styles through genmanip_runtime.console when present.

The CLI must still report errors when genmanip-protocol itself is broken or missing, so the
import is guarded and a plain ``gmp: error: ...`` line is the fallback.
"""

from __future__ import annotations

import sys

__all__ = ["error_line"]


def error_line(message: str, hint: str | None = None) -> str:
    """``gmp: error: <message>`` (+ ``hint: <hint>``) with a trailing newline, styled on a TTY."""
    try:
        from genmanip_runtime.console import Console
    except ImportError:
        text = f"gmp: error: {message}\n"
        return text + (f"hint: {hint}\n" if hint else "")
    con = Console(sys.stderr)
    text = f"{con.style('gmp: error:', 'red', 'bold')} {message}\n"
    if hint:
        text += f"{con.style('hint:', 'yellow')} {hint}\n"
    return text
