"""Terminal output of every gmp command: styled messages, a live progress line, plain tables.

Rules this module enforces so commands do not have to:

* talk goes to **stderr** (data belongs on stdout, where it can be piped);
* colour only on a TTY, never when ``NO_COLOR`` is set (https://no-color.org), forced with
  ``FORCE_COLOR``; ``TERM=dumb`` disables it too;
* the live line -- a :class:`Progress` count or a :class:`StatusLine` of free text (a poll
  loop's state) -- is redrawn in place (``\\r``) **only on a TTY**, and cleared before any other
  message is written (then drawn again under it); piped or redirected output gets no live-line
  noise at all (the caller may print one summary). One live line per console at a time;
* ``quiet`` silences everything but errors, ``verbose`` enables :meth:`Console.debug`;
* nothing it prints can drive the terminal or show a secret: message text, table cells and live
  lines go through :func:`genmanip_runtime.text.safe_text` (registered secrets scrubbed, control
  characters escaped, one line per message) *before* gmp's own styling is added, so a server's
  text cannot carry ``ESC`` sequences, carriage returns or bidi overrides to the screen while gmp's
  colours still work. :meth:`Console.write` scrubs secrets but writes control characters as
  given: it is for gmp's own text (a prompt).

Safe to use from several threads (the eval workers update one :class:`Progress`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TextIO

from .redact import scrub_secrets
from .text import safe_text

__all__ = ["STYLES", "Console", "Progress", "StatusLine", "format_duration", "table", "write_above_live"]

#: ANSI SGR codes understood by :meth:`Console.style`.
STYLES: dict[str, str] = {
    "bold": "1",
    "dim": "2",
    "italic": "3",
    "underline": "4",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
    "gray": "90",
}

_REDRAW_S = 0.1


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _color_default(stream: Any) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)


class Console:
    """Messages for humans on ``stream`` (default: ``sys.stderr`` at call time).

    Args:
        stream: where to write; ``None`` means the current ``sys.stderr``.
        color: force colour on/off; ``None`` = auto (TTY, no ``NO_COLOR``).
        quiet: only :meth:`error` prints; progress lines are off.
        verbose: 0 normal, >= 1 enables :meth:`debug`.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        color: bool | None = None,
        quiet: bool = False,
        verbose: int = 0,
    ) -> None:
        self._stream = stream
        self.quiet = quiet
        self.verbose = verbose
        self.color = _color_default(self.stream) if color is None else color
        self.lock = threading.RLock()
        self._live: _LiveLine | None = None

    @classmethod
    def from_flags(
        cls, *, verbose: int = 0, quiet: bool = False, stream: TextIO | None = None
    ) -> Console:
        """A console honouring ``gmp``'s global ``-v``/``-q`` flags; colour follows the auto rule
        (TTY, ``NO_COLOR``, ``FORCE_COLOR``, ``TERM=dumb``). ``gmp``'s main builds one per command."""
        return cls(stream, quiet=quiet, verbose=verbose)

    @property
    def stream(self) -> TextIO:
        """The output stream."""
        return self._stream if self._stream is not None else sys.stderr

    @property
    def is_tty(self) -> bool:
        """Whether the stream is an interactive terminal."""
        return _isatty(self.stream)

    def width(self) -> int:
        """Terminal width in columns (80 when unknown)."""
        try:
            return max(20, os.get_terminal_size(self.stream.fileno()).columns)
        except (AttributeError, ValueError, OSError):
            return int(os.environ.get("COLUMNS", "80") or 80)

    def style(self, text: str, *styles: str) -> str:
        """``text`` wrapped in ANSI styles (``"bold"``, ``"red"``, ...) when colour is on."""
        if not self.color or not styles:
            return text
        try:
            codes = ";".join(STYLES[s] for s in styles)
        except KeyError as exc:
            raise ValueError(f"unknown style {exc.args[0]!r}; known: {', '.join(STYLES)}") from None
        return f"\x1b[{codes}m{text}\x1b[0m"

    def write(self, text: str) -> None:
        """Write ``text`` (above a live progress line, which is redrawn afterwards).

        Secrets are scrubbed; control characters are kept (gmp's own styled text comes this way).
        """
        self._emit(scrub_secrets(text))

    def _emit(self, text: str) -> None:
        with self.lock:
            live = self._live
            if live is not None:
                live._clear()
            self.stream.write(text)
            if live is not None:
                live._draw(force=True)
            self.stream.flush()

    def _message(self, prefix: str, styles: tuple[str, ...], msg: str) -> None:
        # The one output boundary of messages: made safe first, styled after (see the module doc).
        text = safe_text(msg)
        self._emit(f"{self.style(prefix, *styles)} {text}\n" if prefix else f"{text}\n")

    def info(self, msg: str) -> None:
        """A normal message (silent with ``quiet``)."""
        if not self.quiet:
            self._message("", (), msg)

    def success(self, msg: str) -> None:
        """A completed-successfully message (silent with ``quiet``)."""
        if not self.quiet:
            self._message("ok:", ("green", "bold"), msg)

    def warn(self, msg: str) -> None:
        """A warning (silent with ``quiet``)."""
        if not self.quiet:
            self._message("warning:", ("yellow", "bold"), msg)

    def error(self, msg: str, hint: str | None = None) -> None:
        """An error, always shown, with an optional hint line."""
        self._message("error:", ("red", "bold"), msg)
        if hint:
            self._message("hint:", ("yellow",), hint)

    def debug(self, msg: str) -> None:
        """Shown only with ``verbose >= 1``."""
        if self.verbose >= 1 and not self.quiet:
            self._message("debug:", ("dim",), msg)

    def progress(self, total: int | None, label: str, *, unit: str = "episodes") -> Progress:
        """Shorthand for ``Progress(total, label, self, unit=unit)``."""
        return Progress(total, label, self, unit=unit)

    def status_line(self, label: str) -> StatusLine:
        """Shorthand for ``StatusLine(label, self)``: a live line of free text (a poll loop)."""
        return StatusLine(label, self)


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``"1:15"``, ``3725`` -> ``"1:02:05"``."""
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _fmt_field(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


class _LiveLine:
    """The drawing shared by :class:`Progress` and :class:`StatusLine`.

    One line redrawn in place under the console's lock, only on a TTY and never with ``quiet``;
    while entered (``with``) it is the console's live line, which :meth:`Console.write` clears
    before a message and draws again after it.
    """

    def __init__(self, console: Console | None) -> None:
        self.console = console if console is not None else Console()
        self.live = self.console.is_tty and not self.console.quiet
        self._t0 = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False
        self._closed = False

    def line(self) -> str:
        """The text of the line (without ``\\r``)."""
        raise NotImplementedError

    def _attach(self) -> None:
        if self.live:
            with self.console.lock:
                self.console._live = self
                _Active.line = self
                self._draw(force=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def elapsed_s(self) -> float:
        """Seconds since the line was created."""
        return time.monotonic() - self._t0

    def clear(self) -> None:
        """Erase the line from the terminal now; the next update (or message) draws it again."""
        with self.console.lock:
            if self._drawn:
                self._clear()
                self.console.stream.flush()

    def close(self) -> None:
        """Clear the line (on a TTY); idempotent."""
        with self.console.lock:
            if self._closed:
                return
            self._closed = True
            if self.live:
                self._clear()
                self.console.stream.flush()
            if self.console._live is self:
                self.console._live = None
        _forget(self)

    # -- drawing (caller holds console.lock) ---------------------------------------------------

    def _draw(self, *, force: bool = False) -> None:
        if not self.live or self._closed:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < _REDRAW_S:
            return
        self._last_draw = now
        width = self.console.width() - 1
        # Fields of a live line may be a server's text (a task's queue status).
        text = safe_text(self.line())
        if len(text) > width:
            text = text[: max(0, width - 1)] + "…"
        self.console.stream.write("\r\x1b[2K" + text)
        self.console.stream.flush()
        self._drawn = True

    def _clear(self) -> None:
        if self.live and self._drawn:
            self.console.stream.write("\r\x1b[2K")
            self._drawn = False


class Progress(_LiveLine):
    """A one-line progress display, live on a TTY and silent otherwise.

    ``update(n=1, **fields)`` adds ``n`` done units and sets extra fields shown after the count
    (``steps_per_s=41.2``, ``sr=0.5``); ``set(**fields)`` changes fields only. The line shows
    done/total, percent, rate and ETA. Use as a context manager: leaving clears the line.
    """

    def __init__(
        self,
        total: int | None,
        label: str,
        console: Console | None = None,
        unit: str = "episodes",
    ) -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.done = 0
        self.fields: dict[str, Any] = {}
        super().__init__(console)

    def __enter__(self) -> Progress:
        self._attach()
        return self

    @property
    def rate(self) -> float:
        """Done units per second so far."""
        el = self.elapsed_s
        return self.done / el if el > 0 else 0.0

    def update(self, n: int = 1, **fields: Any) -> None:
        """Add ``n`` done units and update the extra fields; redraws at most ~10 times a second."""
        with self.console.lock:
            self.done += n
            self.fields.update(fields)
            self._draw(force=self.total is not None and self.done >= self.total)

    def set(self, **fields: Any) -> None:
        """Update the extra fields only."""
        with self.console.lock:
            self.fields.update(fields)
            self._draw()

    def set_total(self, total: int | None) -> None:
        """Change the total (e.g. once the server says how many episodes there are)."""
        with self.console.lock:
            self.total = total
            self._draw()

    def line(self) -> str:
        """The progress text (without ``\\r``), also usable as a summary when piped."""
        parts = [self.label]
        if self.total:
            pct = 100.0 * self.done / self.total
            parts.append(f"{self.done}/{self.total} {self.unit} ({pct:.0f}%)")
        else:
            parts.append(f"{self.done} {self.unit}")
        parts.extend(f"{k}={_fmt_field(v)}" for k, v in self.fields.items())
        el = self.elapsed_s
        if self.done and el > 0:
            parts.append(f"{self.rate:.2f} {self.unit}/s")
            if self.total and self.done < self.total:
                parts.append(f"ETA {format_duration((self.total - self.done) / self.rate)}")
        parts.append(format_duration(el))
        return "  ".join(parts)

    def summary(self) -> str:
        """A one-line final summary (``label: 40 episodes in 1:15 (0.53 episodes/s)``)."""
        return (
            f"{self.label}: {self.done} {self.unit} in {format_duration(self.elapsed_s)} "
            f"({self.rate:.2f} {self.unit}/s)"
        )


class StatusLine(_LiveLine):
    """A live line of free text for a wait loop (``waiting for task t  poll 3  queued  0:12``).

    ``update(*fields)`` replaces the fields shown after ``label``; the line ends with the time
    since the line was created (:func:`format_duration`). Every update redraws at once (a poll
    loop updates every few seconds; the last state must never be skipped). Live only on a TTY and
    without ``quiet``: piped, it writes nothing at all. Any console message clears the line first
    and draws it again below. Use as a context manager: leaving clears the line.
    """

    def __init__(self, label: str, console: Console | None = None) -> None:
        self.label = label
        self.fields: tuple[str, ...] = ()
        super().__init__(console)

    def start(self) -> StatusLine:
        """Make this the console's live line and draw it (what ``with`` does); returns ``self``.

        For a caller that cannot hold a ``with`` block open; it must :meth:`close` the line.
        """
        self._attach()
        return self

    def __enter__(self) -> StatusLine:
        return self.start()

    def update(self, *fields: str) -> None:
        """Show ``fields`` (empty ones are left out) after the label and redraw now."""
        with self.console.lock:
            self.fields = tuple(f for f in fields if f)
            self._draw(force=True)

    def line(self) -> str:
        """The status text (without ``\\r``), also usable as a summary when piped."""
        return "  ".join([self.label, *self.fields, format_duration(self.elapsed_s)])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(
    rows: Iterable[Sequence[Any] | Mapping[str, Any]],
    headers: Sequence[str],
    *,
    float_format: str = "{:.3f}",
) -> str:
    """Plain-text table: columns aligned, numbers right-aligned, a dashed rule under the header.

    ``rows`` are sequences in ``headers`` order or mappings keyed by header. ``None`` renders as
    ``-``. Returns the text with a trailing newline (no ANSI codes, safe to pipe): every cell and
    header goes through :func:`genmanip_runtime.text.safe_text` (cells are task names and ids a
    server chose).
    """
    shown = [safe_text(h) for h in headers]
    cells: list[list[str]] = []
    numeric = [True] * len(headers)
    for row in rows:
        values = [row.get(h) for h in headers] if isinstance(row, Mapping) else list(row)
        if len(values) != len(headers):
            raise ValueError(f"row has {len(values)} values for {len(headers)} headers: {values!r}")
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append("-")
                continue
            if not _is_number(v):
                numeric[i] = False
            out.append(float_format.format(v) if isinstance(v, float) else safe_text(v))
        cells.append(out)
    widths = [len(h) for h in shown]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def fmt(values: Sequence[str], header: bool = False) -> str:
        parts = []
        for i, c in enumerate(values):
            right = numeric[i] and not header and bool(cells)
            parts.append(c.rjust(widths[i]) if right or (header and numeric[i] and cells) else c.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    lines = [fmt(shown, header=True), "  ".join("-" * w for w in widths)]
    lines.extend(fmt(r) for r in cells)
    return "\n".join(lines) + "\n"


class _Active:
    """The live line on the terminal, if any (at most one is drawn at a time): what
    :func:`write_above_live` clears and redraws around text written outside a Console."""

    line: _LiveLine | None = None


def _forget(line: _LiveLine) -> None:
    if _Active.line is line:
        _Active.line = None


def write_above_live(stream: TextIO, text: str) -> None:
    """Write ``text`` to ``stream`` without writing onto a live progress line drawn there: the
    line is cleared first and drawn again after (log records of gmp's logging handler come this
    way). ``text`` is written as given: format and make it safe before."""
    live = _Active.line
    if live is None or live.console.stream is not stream:
        stream.write(text)
        stream.flush()
        return
    with live.console.lock:
        live._clear()
        stream.write(text)
        live._draw(force=True)
        stream.flush()
