"""Error-line formatting for ``gmp`` that styles through genmanip_runtime.console when present.

The CLI must still report errors when genmanip-protocol itself is broken or missing, so the
import is guarded and a plain ``gmp: error: ...`` line is the fallback.

This is the last line of defence of ``gmp``'s error output: the message and the hint go through
:func:`genmanip_runtime.text.safe_text` (registered secrets scrubbed, control characters escaped,
one line each) *before* the prefix is styled, whatever the exception that carried them. Without
genmanip-runtime no client can have run, so no server text can be in the message.
"""

from __future__ import annotations

import sys

__all__ = ["error_line", "safe_block"]


def error_line(message: str, hint: str | None = None) -> str:
    """``gmp: error: <message>`` (+ ``hint: <hint>``) with a trailing newline, styled on a TTY."""
    try:
        from genmanip_runtime.console import Console
    except ImportError:
        text = f"gmp: error: {message}\n"
        return text + (f"hint: {hint}\n" if hint else "")
    from genmanip_runtime.text import safe_text

    con = Console(sys.stderr)
    text = f"{con.style('gmp: error:', 'red', 'bold')} {safe_text(message)}\n"
    if hint:
        text += f"{con.style('hint:', 'yellow')} {safe_text(hint)}\n"
    return text


def safe_block(text: str) -> str:
    """Several lines (a traceback) made safe to print: secrets scrubbed, control characters other
    than newlines and tabs escaped; ``text`` unchanged without genmanip-runtime."""
    try:
        from genmanip_runtime.text import safe_text
    except ImportError:
        return text
    return safe_text(text, multiline=True)
