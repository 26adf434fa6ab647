"""Text from elsewhere, made safe to print: the one function every output path of gmp goes through.

A server's error detail, reason phrase, status field or task name is arbitrary text. Printed as
sent it can drive the terminal: ``ESC ]52;`` writes the clipboard, ``ESC [2J`` clears the screen,
a carriage return or newline draws a fake ``ok: all episodes passed`` line, U+202E reverses what
follows, C1 controls (U+0080-U+009F) are escape sequences on some terminals, and a token the
server echoes back would end up in a CI log. :func:`safe_text` is the answer to all of these, at
one place:

1. secrets are taken out (:func:`genmanip_runtime.redact.scrub_secrets`: every registered token
   in every form it knows, and the caller's own);
2. control characters are escaped *visibly* (:func:`escape_controls`): C0 (``\\x1b``, ``\\r``,
   ``\\n`` in a one-line field), DEL, C1, the Unicode format characters (bidi embeddings,
   overrides and isolates such as ``\\u202e``, zero-width characters, tag characters), the line
   and paragraph separators and lone surrogates;
3. the result is cut to ``limit`` characters (after 1, so a cut never leaves a token's prefix).

It is applied where server text enters gmp's messages (the transport's detail extraction, the
clients' message construction) and again at the output: the console's message methods, its
tables and live lines, the log formatter :class:`SafeFormatter` and ``gmp``'s error printer. gmp
styles its own text *after* escaping, so its colours still work.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable
from types import TracebackType

from .redact import SupportsReveal, scrub_secrets

__all__ = ["SafeFormatter", "escape_controls", "safe_text"]

#: Unicode categories escaped: controls, format characters (bidi, zero-width, tags), surrogates,
#: line and paragraph separators. Private-use and unassigned code points have no effect on a
#: terminal and are kept, like spaces (Zs).
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ELLIPSIS = "…"
#: Characters kept past ``limit`` while scrubbing: longer than any form of any real token.
_MARGIN = 4096


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    cp = ord(ch)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def escape_controls(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control character written out as an escape (``\\x1b``, ``\\u202e``).

    With ``multiline`` a newline and a tab are kept (a traceback); otherwise they are escaped too,
    so the text is one line. Printable text, including non-ASCII letters and emoji, is unchanged.
    """
    if text.isprintable():  # the common case, at C speed
        return text
    out: list[str] = []
    for ch in text:
        if ch.isprintable() or (multiline and ch in "\n\t"):
            out.append(ch)
        elif unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            out.append(_escape_char(ch))
        else:
            out.append(ch)  # a space other than " ", a private-use or unassigned code point
    return "".join(out)


def safe_text(
    value: object,
    *,
    limit: int | None = None,
    multiline: bool = False,
    tokens: Iterable[str | SupportsReveal | None] = (),
) -> str:
    """``str(value)`` made safe to print: secrets scrubbed, controls escaped, cut to ``limit``.

    Args:
        value: any object; a ``bytes`` value is decoded as UTF-8 (invalid bytes replaced).
        limit: the longest result in characters (a longer one ends with ``…``); ``None``: no limit.
        multiline: keep newlines and tabs (a traceback); by default the result is one line.
        tokens: the caller's own credentials, scrubbed in addition to the registered secrets
            (:func:`genmanip_runtime.redact.scrub_secrets`).
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if limit is not None:
            raw = raw[: 4 * (limit + _MARGIN)]  # UTF-8: at most 4 bytes a character
        text = raw.decode("utf-8", "replace")
    else:
        text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit + _MARGIN:
        # Only what can be shown is worked on (a 100 MB reply costs no time); the margin keeps a
        # token that crosses the cut whole, so that it is scrubbed rather than its prefix shown.
        text = text[: limit + _MARGIN]
    text = escape_controls(scrub_secrets(text, *tokens), multiline=multiline)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + _ELLIPSIS
    return text


class SafeFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose output is :func:`safe_text`: the message is one line
    (a newline in it is escaped, so a record cannot forge the next one), tracebacks and stack
    dumps keep their lines; secrets are scrubbed from all of it. ``gmp`` installs it on its
    stderr handler; the format string's own fields (level, logger name) are left as they are."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one safe line (plus its traceback, also made safe)."""
        # Formatter.format() reuses a traceback text cached on the record by an earlier handler's
        # formatter, which would skip formatException() here: format it afresh, then put back.
        cached = record.exc_text
        record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:
        # Formatter.format() has just set record.message from getMessage(); every formatter sets
        # it again, so escaping it here does not change what other handlers see.
        record.message = safe_text(record.message)
        return super().formatMessage(record)

    def formatException(
        self,
        ei: tuple[type[BaseException], BaseException, TracebackType | None]
        | tuple[None, None, None],
    ) -> str:
        return safe_text(super().formatException(ei), multiline=True)

    def formatStack(self, stack_info: str) -> str:
        return safe_text(super().formatStack(stack_info), multiline=True)
