"""HttpTransport.abort() and retry_call(interrupt=...): a blocked request or wait ends at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from genmanip_runtime.errors import RequestAborted, RequestTimeout, TransportError
from genmanip_runtime.retry import Backoff, retry_call
from genmanip_runtime.testing import silent_server as _silent_server
from genmanip_runtime.transport import HttpTransport


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    with _silent_server() as url:
        yield url


def _aborted(tr: HttpTransport) -> bool:
    return tr.aborted


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc
        out["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_abort_releases_a_request_blocked_on_a_silent_server(silent_server: str) -> None:
    tr = HttpTransport(silent_server, timeout=30)
    t, out = _in_thread(lambda: tr.request("POST", "/step", body=b"x", timeout=30))
    time.sleep(0.3)
    t_abort = time.monotonic()
    tr.abort()
    t.join(1.0)
    assert not t.is_alive(), "abort() did not release the blocked request within 1 s"
    assert time.monotonic() - t_abort < 1.0
    err = out["error"]
    assert isinstance(err, RequestAborted) and isinstance(err, KeyboardInterrupt)
    assert err.sent and err.maybe_executed and err.route == "/step"
    assert _aborted(tr)
    # Later calls are refused at once, nothing sent; abort() is idempotent.
    tr.abort()
    t0 = time.monotonic()
    with pytest.raises(RequestAborted) as info:
        tr.request("GET", "/status", timeout=30)
    assert time.monotonic() - t0 < 0.2 and not info.value.sent
    # Re-armed, the transport works again (here: the silent server times out).
    tr.rearm()
    assert not _aborted(tr)
    with pytest.raises(RequestTimeout):
        tr.request("GET", "/status", timeout=0.3)
    tr.close()


def test_abort_from_another_thread_is_not_a_transport_error(silent_server: str) -> None:
    tr = HttpTransport(silent_server, timeout=30)
    t, out = _in_thread(lambda: tr.get("/docs", timeout=30))
    time.sleep(0.2)
    tr.abort()
    t.join(1.0)
    assert not isinstance(out["error"], TransportError)  # no retry loop may replay it
    tr.close()


def test_retry_call_interrupt_wakes_the_backoff_sleep() -> None:
    ev = threading.Event()
    calls = 0

    def failing() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("down")

    threading.Timer(0.2, ev.set).start()
    t0 = time.monotonic()
    with pytest.raises(RequestAborted) as info:
        retry_call(failing, retry_on=ConnectionError,
                   backoff=Backoff(initial=10.0, max_delay=10.0, jitter=0), interrupt=ev)
    assert time.monotonic() - t0 < 1.0
    assert calls == 1 and isinstance(info.value.__cause__, ConnectionError)
    # Set before the call: no attempt at all.
    with pytest.raises(RequestAborted):
        retry_call(failing, retry_on=ConnectionError, interrupt=ev)
    assert calls == 1


def test_retry_call_never_retries_an_abort() -> None:
    calls = 0

    def aborted() -> None:
        nonlocal calls
        calls += 1
        raise RequestAborted("aborted")

    with pytest.raises(RequestAborted):
        retry_call(aborted, retry_on=BaseException, backoff=Backoff(initial=0, jitter=0))
    assert calls == 1
