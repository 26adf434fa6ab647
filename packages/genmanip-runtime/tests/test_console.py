"""Console styling, quiet/verbose, NO_COLOR, and the TTY-only progress line (fake TTY streams)."""

from __future__ import annotations

import io
import threading

import pytest
from genmanip_runtime import console as console_mod
from genmanip_runtime.console import Console, Progress, StatusLine, format_duration, table


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(var, raising=False)


def test_color_auto_on_tty_off_when_piped_or_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Console(FakeTTY()).color is True
    assert Console(io.StringIO()).color is False
    monkeypatch.setenv("NO_COLOR", "1")
    c = Console(FakeTTY())
    assert c.color is False
    assert c.style("x", "red", "bold") == "x"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert Console(io.StringIO()).color is True


def test_style_and_messages() -> None:
    out = FakeTTY()
    c = Console(out)
    assert c.style("hi", "red", "bold") == "\x1b[31;1mhi\x1b[0m"
    with pytest.raises(ValueError, match="unknown style"):
        c.style("x", "sparkly")
    c.warn("careful")
    c.error("broken", hint="try again")
    text = out.getvalue()
    assert "\x1b[33;1mwarning:\x1b[0m careful\n" in text
    assert "broken\n" in text and "try again\n" in text


def test_quiet_and_verbose() -> None:
    out = io.StringIO()
    c = Console(out, quiet=True)
    c.info("i")
    c.warn("w")
    c.success("s")
    c.debug("d")
    c.error("e")
    assert out.getvalue() == "error: e\n"
    out = io.StringIO()
    c = Console(out)
    c.debug("hidden")
    Console(out, verbose=1).debug("shown")
    assert out.getvalue() == "debug: shown\n"


def test_from_flags() -> None:
    out = io.StringIO()
    c = Console.from_flags(quiet=True, verbose=2, stream=out)
    assert c.quiet and c.verbose == 2 and c.stream is out
    c = Console.from_flags()
    assert not c.quiet and c.verbose == 0


def test_progress_silent_when_piped() -> None:
    out = io.StringIO()
    c = Console(out)
    with Progress(10, "eval", c) as p:
        for _ in range(10):
            p.update(1, sr=0.5)
    assert out.getvalue() == ""
    assert p.summary().startswith("eval: 10 episodes in ")


def test_progress_silent_when_quiet_on_tty() -> None:
    out = FakeTTY()
    with Progress(3, "eval", Console(out, quiet=True)) as p:
        p.update(3)
    assert out.getvalue() == ""


def test_progress_redraws_in_place_rate_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(console_mod.time, "monotonic", lambda: now[0])
    out = FakeTTY()
    c = Console(out, color=False)
    with c.progress(4, "eval", unit="episodes") as p:
        first = out.getvalue()
        assert first == "\r\x1b[2Keval  0/4 episodes (0%)  0:00"
        p.update(1, steps_per_s=41.234)
        assert out.getvalue() == first  # < 0.1 s since the last draw: no redraw
        now[0] += 2.0
        p.update(1)
        line = out.getvalue()[len(first):]
        assert line.startswith("\r\x1b[2Keval  2/4 episodes (50%)  steps_per_s=41.2  1.00 episodes/s")
        assert "ETA 0:02" in line
        c.info("episode 7 done")  # printed above the live line, which is then redrawn
        assert out.getvalue().endswith("\r\x1b[2Kepisode 7 done\n\r\x1b[2K" + p.line())
        p.update(2)  # reaching the total always draws
        assert "4/4 episodes (100%)" in out.getvalue().rsplit("\r", 1)[-1]
    assert out.getvalue().endswith("\r\x1b[2K")  # cleared on exit
    assert "\n" not in out.getvalue().replace("episode 7 done\n", "")


def test_progress_line_is_truncated_to_width(monkeypatch: pytest.MonkeyPatch) -> None:
    out = FakeTTY()
    c = Console(out)
    monkeypatch.setattr(c, "width", lambda: 30)
    with Progress(None, "a-very-long-label-" * 5, c) as p:
        p.update(1)
    for chunk in out.getvalue().split("\r\x1b[2K"):
        assert len(chunk) <= 29


def test_progress_thread_safe_counts() -> None:
    out = FakeTTY()
    with Progress(400, "x", Console(out)) as p:
        ts = [threading.Thread(target=lambda: [p.update() for _ in range(100)]) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert p.done == 400


def test_table_alignment() -> None:
    text = table(
        [("pick/cube", 10, 0.5), {"task": "open_drawer", "n": 2, "sr": None}],
        ["task", "n", "sr"],
    )
    assert text == (
        "task          n     sr\n"
        "-----------  --  -----\n"
        "pick/cube    10  0.500\n"
        "open_drawer   2      -\n"
    )
    with pytest.raises(ValueError, match="2 values for 3 headers"):
        table([(1, 2)], ["a", "b", "c"])
    assert table([], ["a"]) == "a\n-\n"


def test_format_duration() -> None:
    assert format_duration(0) == "0:00"
    assert format_duration(75.2) == "1:15"
    assert format_duration(3725) == "1:02:05"


# -- the status line (a poll loop's live line) -------------------------------------------------


def test_status_line_live_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [50.0]
    monkeypatch.setattr(console_mod.time, "monotonic", lambda: now[0])
    out = FakeTTY()
    c = Console(out)
    with c.status_line("waiting for task t") as s:
        assert isinstance(s, StatusLine)
        assert out.getvalue() == "\r\x1b[2Kwaiting for task t  0:00"
        now[0] += 75.0
        s.update("poll 3", "", "ETA 2:05")  # empty fields are left out; every update draws
        assert out.getvalue().endswith("\r\x1b[2Kwaiting for task t  poll 3  ETA 2:05  1:15")
        s.update("poll 4")
        assert out.getvalue().endswith("\r\x1b[2Kwaiting for task t  poll 4  1:15")
        assert s.line() == "waiting for task t  poll 4  1:15"
    assert out.getvalue().endswith("\r\x1b[2K")  # cleared on exit
    assert c._live is None
    assert "\n" not in out.getvalue()


def test_status_line_silent_when_piped_or_quiet() -> None:
    out = io.StringIO()
    c = Console(out)
    with c.status_line("waiting") as s:
        s.update("poll 1")
        c.info("a message")
    assert out.getvalue() == "a message\n"
    assert s.line().startswith("waiting  poll 1  ")  # still usable as a summary
    tty = FakeTTY()
    with Console(tty, quiet=True).status_line("waiting") as s:
        s.update("poll 1")
    assert tty.getvalue() == ""


def test_status_line_no_color_still_live_and_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = FakeTTY()
    c = Console(out)
    with c.status_line("waiting") as s:
        s.update("poll 1")
        c.warn("slow")
    text = out.getvalue()
    assert "\r\x1b[2Kwaiting  poll 1  0:00" in text
    assert "\x1b[" not in text.replace("\x1b[2K", "")  # no SGR colour codes at all
    assert "warning: slow\n" in text


def test_status_line_is_cleared_before_a_message_and_redrawn_after() -> None:
    out = FakeTTY()
    c = Console(out, color=False)
    s = c.status_line("waiting").start()  # without a with block
    s.update("poll 2")
    before = out.getvalue()
    c.warn("poll 2 failed (will retry)")
    after = out.getvalue()[len(before):]
    assert after == "\r\x1b[2Kwarning: poll 2 failed (will retry)\n\r\x1b[2K" + s.line()
    s.clear()
    assert out.getvalue().endswith("\r\x1b[2K")
    n = len(out.getvalue())
    s.clear()  # nothing drawn: nothing written
    assert len(out.getvalue()) == n
    s.close()
    s.close()  # idempotent
    s.update("poll 3")  # closed: never drawn again
    c.info("done")
    assert out.getvalue()[n:] == "done\n"


def test_status_line_truncated_to_width(monkeypatch: pytest.MonkeyPatch) -> None:
    out = FakeTTY()
    c = Console(out)
    monkeypatch.setattr(c, "width", lambda: 30)
    with c.status_line("waiting for task " + "x" * 40) as s:
        s.update("poll 1")
    for chunk in out.getvalue().split("\r\x1b[2K"):
        assert len(chunk) <= 29


def test_text_written_outside_the_console_goes_above_the_live_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # gmp's logging handler writes records this way: a warning never lands on the end of the
    # progress line (issue 19, "warnings are printed onto the end of the live progress line").
    from genmanip_runtime.console import write_above_live

    out = FakeTTY()
    c = Console(out)
    with c.progress(4, "eval") as p:
        write_above_live(out, "gmp: warning: the server lost the episode lock\n")
        assert out.getvalue().endswith(
            "\r\x1b[2Kgmp: warning: the server lost the episode lock\n\r\x1b[2K" + p.line()
        )
    other = io.StringIO()
    write_above_live(other, "plain\n")  # another stream, or no live line: written as given
    write_above_live(out, "after\n")
    assert other.getvalue() == "plain\n" and out.getvalue().endswith("\r\x1b[2Kafter\n")
