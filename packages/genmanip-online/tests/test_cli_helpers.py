"""The interactive parts of ``gmp online``: the Ctrl-C offer and the live poll line."""

from __future__ import annotations

import io
import json

import pytest
from genmanip_online import CREATE_PATH, READY_PATH, OnlineClient, PollEvent, ReadyStatus
from genmanip_online.cli import (
    _PollDisplay,
    offer_stop,
    stop_command,
    submit_and_wait,
    task_fields,
)
from genmanip_runtime.console import Console

TOKEN = "helper-token-123456"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _console(tty: bool) -> tuple[Console, io.StringIO]:
    stream = FakeTTY() if tty else io.StringIO()
    return Console(stream, color=False), stream


def test_offer_stop_asks_on_a_tty_and_stops(scripted, env):
    endpoint = scripted.url + "/online/t1"
    scripted.routes["/online/t1/stop"] = env({"stopped": True})
    console, stream = _console(True)
    asked = []
    with OnlineClient(scripted.url, TOKEN) as c:
        stopped = offer_stop(c, "t1", endpoint, console, interactive=True,
                             ask=lambda q: asked.append(q) or True)
    assert stopped and asked == ["Stop task t1 on the service? [y/N] "]
    assert "stopped task t1" in stream.getvalue()
    assert scripted.requests[-1]["query"] == "run_id=t1"


def test_offer_stop_declined_prints_the_command(scripted):
    console, stream = _console(True)
    with OnlineClient(scripted.url, TOKEN) as c:
        assert not offer_stop(c, "t2", None, console, interactive=True, ask=lambda q: False)
    assert f"gmp online stop --base-url {scripted.url} --task-id t2" in stream.getvalue()
    assert scripted.requests == []


def test_offer_stop_without_endpoint_looks_it_up_and_reports_queued_tasks(scripted, env):
    scripted.routes[READY_PATH] = env({"ready": False})
    console, stream = _console(True)
    with OnlineClient(scripted.url, TOKEN) as c:
        assert not offer_stop(c, "t3", None, console, interactive=True, ask=lambda q: True)
    out = stream.getvalue()
    assert "could not stop task t3: task t3 has no endpoint yet" in out
    assert "gmp online stop" in out


def test_stop_command_never_contains_the_token():
    c = OnlineClient("http://10.0.0.1:1", TOKEN, insecure_http=True)
    cmd = stop_command(c, "t", "http://10.0.0.1:1/online/t")
    assert TOKEN not in cmd and cmd.endswith("--insecure-http")
    assert "--endpoint http://10.0.0.1:1/online/t" in cmd


def test_poll_line_is_live_on_a_tty_and_silent_when_piped(monkeypatch):
    st = ReadyStatus("t", False, None, queue_position=4, eta_s=125.0, status="queued")
    console, stream = _console(True)
    monkeypatch.setattr(console, "width", lambda: 200)  # a StringIO has no terminal size
    d = _PollDisplay(console, "t")
    d(PollEvent(3, 12.0, st, None, 7.2))
    # The console's status line (genmanip_runtime.console.StatusLine): redrawn in place, durations
    # in format_duration's m:ss, the elapsed time last.
    line = stream.getvalue().rsplit("\r\x1b[2K", 1)[-1]
    assert line.startswith("waiting for task t  poll 3  queued  queue position 4  ETA 2:05  "
                           "next poll in 7.2 s  0:")
    console.warn("slow")  # a message clears the line first, then draws it again below
    assert "\r\x1b[2Kwarning: slow\n\r\x1b[2Kwaiting for task t  poll 3" in stream.getvalue()
    d.clear()
    assert stream.getvalue().endswith("\r\x1b[2K")

    console, stream = _console(False)
    d = _PollDisplay(console, "t")
    d(PollEvent(1, 1.0, st, None, 5.0))
    assert stream.getvalue() == ""


def test_submit_and_wait_creates_with_the_given_fields(scripted, env):
    scripted.routes[CREATE_PATH] = env({"task_id": "new-1"})
    scripted.routes[READY_PATH] = env({"ready": True, "endpoint": scripted.url + "/online/new-1"})
    fields = task_fields(task_id=None, model_name="m", model_type=None, benchmark_set="b",
                         submitter_name=None, submitter_homepage=None, is_public=True)
    console, stream = _console(False)
    with OnlineClient(scripted.url, TOKEN) as c:
        tid, st = submit_and_wait(c, console, task_id=None, fields=fields, deadline=10.0,
                                  interval=0.01)
    assert tid == "new-1" and st.endpoint == scripted.url + "/online/new-1"
    assert json.loads(scripted.requests[0]["body"]) == {"model_name": "m", "benchmark_set": "b",
                                                        "is_public": True}
    assert "created task new-1" in stream.getvalue()


def test_offer_stop_not_a_tty_never_prompts(scripted):
    console, stream = _console(False)
    with OnlineClient(scripted.url, TOKEN) as c:
        assert not offer_stop(c, "t9", None, console, interactive=False,
                              ask=lambda q: pytest.fail("must not ask"))
    assert "To stop it: gmp online stop" in stream.getvalue()
