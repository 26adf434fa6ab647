"""safe_text and its output boundaries: control characters escaped visibly, secrets scrubbed,
gmp's own styling intact."""

from __future__ import annotations

import io
import logging
import sys
import unicodedata
from collections.abc import Iterator

import pytest
from genmanip_runtime.console import Console, Progress, StatusLine, table
from genmanip_runtime.redact import REDACTED, forget_secrets, register_secret
from genmanip_runtime.text import SafeFormatter, escape_controls, safe_text

TOKEN = "tok-" + "9e1b07c4d2a6f853" * 2


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


def _unsafe(text: str) -> list[str]:
    """Characters a terminal could act on (what safe_text must never let through)."""
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


# -- escape_controls: every class --------------------------------------------------------------

@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear screen, cursor home
        ("\x1b]52;c;aGVsbG8=\x07", "\\x1b]52;c;aGVsbG8=\\x07"),  # OSC 52: write the clipboard
        ("\x1b]0;title\x1b\\", "\\x1b]0;title\\x1b\\"),  # OSC terminated by ST
        ("\x1b[1A\x1b[2K", "\\x1b[1A\\x1b[2K"),  # cursor up, erase line
        ("50%\rok: all episodes passed", "50%\\rok: all episodes passed"),  # CR overwrite
        ("x\nok: all episodes passed", "x\\nok: all episodes passed"),  # forged line
        ("a\x08\x08b", "a\\x08\\x08b"),  # backspaces
        ("\x00\x07\x0b\x0c\x7f", "\\x00\\x07\\x0b\\x0c\\x7f"),  # NUL, BEL, VT, FF, DEL
        ("\x9b2J \x9d52;c;x\x9c \x85", "\\x9b2J \\x9d52;c;x\\x9c \\x85"),  # C1: CSI, OSC, ST, NEL
        ("file\u202egpj.exe", "file\\u202egpj.exe"),  # RIGHT-TO-LEFT OVERRIDE
        ("\u2066\u2067\u2068\u2069\u202a\u202b\u202c\u202d\u200e\u200f\u061c",
         "\\u2066\\u2067\\u2068\\u2069\\u202a\\u202b\\u202c\\u202d\\u200e\\u200f\\u061c"),  # bidi
        ("to\u200bk\u200den\ufeff", "to\\u200bk\\u200den\\ufeff"),  # zero-width
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line / paragraph separator
        ("tag\U000e0041\U000e007f", "tag\\U000e0041\\U000e007f"),  # tag characters
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
        ("tab\there", "tab\\there"),
    ],
)
def test_control_characters_are_escaped_visibly(raw: str, shown: str) -> None:
    assert escape_controls(raw) == shown
    assert safe_text(raw) == shown
    assert not _unsafe(safe_text(raw))


def test_printable_text_is_unchanged() -> None:
    for text in ("plain ascii", "Grüße, 東京, Ωmega, 🎉", "non\u00a0breaking and\u3000wide space",
                 "back\\slash \\x1b literal", "private \ue000 use", ""):
        assert escape_controls(text) == text
        assert safe_text(text) == text


def test_multiline_keeps_newlines_and_tabs_only() -> None:
    tb = "Traceback:\n\tFile x\r\n  \x1b]52;c;x\x07\nValueError: \u202eboom"
    out = escape_controls(tb, multiline=True)
    assert out == "Traceback:\n\tFile x\\r\n  \\x1b]52;c;x\\x07\nValueError: \\u202eboom"
    assert [c for c in _unsafe(out) if c not in "\n\t"] == []


def test_every_c0_c1_and_format_character_is_escaped() -> None:
    """Exhaustive over the BMP's control and format characters (and the assigned tag block)."""
    cps = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0xE0001, *range(0xE0020, 0xE0080)]
    cps += [cp for cp in range(0x100, 0x10000) if unicodedata.category(chr(cp)) in ("Cf", "Zl", "Zp")]
    text = "".join(chr(cp) for cp in cps)
    out = safe_text(text)
    assert not _unsafe(out)
    assert out.count("\\") == len(cps)


# -- safe_text: secrets, limit, inputs ---------------------------------------------------------

def test_safe_text_scrubs_before_cutting() -> None:
    register_secret(TOKEN)
    detail = "x" * 50 + TOKEN + "y" * 50
    out = safe_text(detail, limit=60)  # a cut before scrubbing would fall inside the token
    assert out == "x" * 50 + REDACTED + "y" * 6 + "…"
    assert safe_text(detail[:60]) == "x" * 50 + REDACTED  # already cut: its prefix still goes


def test_safe_text_takes_the_callers_tokens_and_bytes() -> None:
    assert safe_text(b"bad \xff byte \x1b[0m", tokens=()) == "bad \ufffd byte \\x1b[0m"
    assert safe_text("k=abcdef", tokens=("abcdef",)) == f"k={REDACTED}"
    assert safe_text(12345) == "12345"
    assert safe_text("x" * 10, limit=5) == "xxxx…"
    assert safe_text("short", limit=5) == "short"


def test_escaping_a_secret_split_by_a_control_character() -> None:
    register_secret(TOKEN)
    out = safe_text(TOKEN[:14] + "\x1b[8m" + TOKEN[14:])  # "concealed" text in the middle
    assert TOKEN[:8] not in out and TOKEN[-8:] not in out and "\\x1b[8m" in out


# -- output boundaries ---------------------------------------------------------------------------

def _console(color: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(buf, color=color, verbose=1), buf


def test_console_messages_escape_server_text_but_keep_gmp_styling() -> None:
    register_secret(TOKEN)
    con, buf = _console(color=True)
    hostile = f"\x1b]52;c;{TOKEN}\x07\r\x1b[32mok:\x1b[0m all episodes passed\n\u202egnp"
    con.error(hostile, hint=f"retry \x1b[2J with {TOKEN}")
    con.warn(hostile)
    con.info(hostile)
    con.success(hostile)
    con.debug(hostile)
    out = buf.getvalue()
    lines = out.splitlines()
    assert len(lines) == 6  # one line per message: no forged line
    assert lines[0].startswith("\x1b[31;1merror:\x1b[0m ")  # gmp's own colour survives
    assert lines[1].startswith("\x1b[33mhint:\x1b[0m retry \\x1b[2J with ***")
    assert lines[2].startswith("\x1b[33;1mwarning:\x1b[0m ")
    assert lines[4].startswith("\x1b[32;1mok:\x1b[0m ")
    # The only ESC bytes left are gmp's own SGR codes around the prefixes.
    assert out.count("\x1b") == 2 * 5
    assert TOKEN not in out and TOKEN[:8] not in out
    assert "\\x1b]52;c;***\\x07\\r\\x1b[32mok:" in lines[0]
    assert "\\u202e" in lines[0] and "\u202e" not in out and "\r" not in out


def test_console_without_colour_has_no_escape_at_all() -> None:
    con, buf = _console(color=False)
    con.error("\x1b[2J\x9b2J\u202e")
    assert _unsafe(buf.getvalue()) == ["\n"]


def test_console_write_scrubs_secrets() -> None:
    register_secret(TOKEN)
    con, buf = _console(color=False)
    con.write(f"prompt {TOKEN} [y/N] ")
    assert buf.getvalue() == "prompt *** [y/N] "


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_lines_escape_their_fields() -> None:
    register_secret(TOKEN)
    buf = _TTY()
    con = Console(buf, color=False)
    with StatusLine("waiting", con) as line:
        line.update(f"queued\r\x1b[2Kready {TOKEN}", "\u202epos 3")
    with Progress(3, "eval\x1b[5m", con) as prog:
        prog.update(1, task=f"t\x1b]52;c;{TOKEN}\x07")
    out = buf.getvalue()
    # Only the console's own redraw sequence (CR + erase line) remains.
    assert out.replace("\r\x1b[2K", "").count("\x1b") == 0 and "\u202e" not in out
    assert TOKEN[:8] not in out and "\\x1b[2Kready ***" in out


def test_table_cells_are_escaped() -> None:
    register_secret(TOKEN)
    text = table([["task\x1b[2J", 1, 0.5], [f"\u202e{TOKEN}", 2, None]], ["task", "n", "sr"])
    assert "\x1b" not in text and "\u202e" not in text and TOKEN[:8] not in text
    assert "task\\x1b[2J" in text and "\\u202e***" in text
    assert table([{"a\nb": "x\ry"}], ["a\nb"]).splitlines()[0] == "a\\nb"


def test_safe_formatter_escapes_messages_and_tracebacks() -> None:
    register_secret(TOKEN)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(SafeFormatter("gmp: %(levelname)s: %(message)s"))
    log = logging.getLogger("genmanip_runtime.tests.safe_formatter")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("server said %s", f"\x1b[2J{TOKEN}\ngmp: INFO: all episodes passed")
        try:
            raise ValueError(f"boom \x1b]52;c;{TOKEN}\x07\u202e")
        except ValueError:
            # An earlier handler's formatter may have cached the raw traceback on the record.
            record = log.makeRecord(log.name, logging.ERROR, __file__, 1, "failed", None,
                                    sys.exc_info())
            record.exc_text = logging.Formatter().formatException(record.exc_info)  # type: ignore[arg-type]
            log.handle(record)
    finally:
        log.removeHandler(handler)
    out = buf.getvalue()
    assert out.startswith("gmp: WARNING: server said \\x1b[2J***\\ngmp: INFO: all episodes passed\n")
    assert "\x1b" not in out and "\u202e" not in out and TOKEN[:8] not in out
    assert "ValueError: boom \\x1b]52;c;***\\x07\\u202e" in out
    assert "\nTraceback (most recent call last):\n" in out  # the traceback keeps its lines


def test_a_huge_input_with_a_limit_is_cut_before_the_work() -> None:
    import time

    register_secret(TOKEN)
    huge = "\x1b" * 5_000_000 + TOKEN
    t0 = time.perf_counter()
    out = safe_text(huge, limit=100)
    assert time.perf_counter() - t0 < 1.0
    assert out == "\\x1b" * 24 + "\\x1…"
    edge = "y" * 95 + TOKEN + "z" * 10_000_000
    assert safe_text(edge, limit=100) == "y" * 95 + "***z…"
    assert safe_text(edge.encode(), limit=100) == "y" * 95 + "***z…"
