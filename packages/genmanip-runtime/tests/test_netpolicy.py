"""The network policy: the loopback table and the plain-HTTP/token rule in both modes."""

from __future__ import annotations

import logging
import uuid

import pytest
from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.errors import GenmanipRuntimeError, InsecureTransportError, TransportError
from genmanip_runtime.netpolicy import check_plain_http, is_loopback_host

TOKEN = "np-secret-token-4f2a9c"


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST",
        "localhost.",
        "Localhost.",
        "app.localhost",
        "127.0.0.1",
        "127.0.0.2",
        "127.255.255.254",
        "::1",
        "[::1]",
        "0:0:0:0:0:0:0:1",
        "::ffff:127.0.0.1",
        "[::ffff:127.0.0.2]",
        " 127.0.0.1 ",
    ],
)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",  # every interface: reachable from the network
        "::",
        "example.com",
        "localhost.example.com",
        "mylocalhost",
        "128.0.0.1",
        "10.0.0.1",
        "::ffff:10.0.0.1",
        "::2",
        "127.0.0.1.",  # not an IP literal: it would go to a resolver
        "",
        None,
    ],
)
def test_not_loopback_hosts(host: str | None) -> None:
    assert not is_loopback_host(host)


def _url(scheme: str = "http") -> str:
    # A fresh host per test: the warn-once memory lives for the whole process.
    return f"{scheme}://h-{uuid.uuid4().hex[:10]}.example.invalid:8087"


def test_refuse_raises_a_typed_error_without_the_token() -> None:
    url = _url()
    with pytest.raises(InsecureTransportError) as ei:
        check_plain_http(url, has_token=True, mode="refuse", what="--base-url",
                         override="--insecure-http")
    e = ei.value
    assert e.exit_code == ExitCode.REFUSED
    assert isinstance(e, GenmanipRuntimeError) and isinstance(e, GenmanipError)
    assert not isinstance(e, TransportError)  # never retried as a network failure
    assert str(e.message).startswith("refusing plain HTTP to h-")
    assert "(--base-url)" in e.message and e.host.endswith(".example.invalid")
    assert "--insecure-http" in (e.hint or "")


def test_refuse_passes_for_https_loopback_no_token_and_the_override() -> None:
    for url in (_url("https"), "http://127.0.0.2:1", "http://[::1]:1/x", "http://localhost."):
        check_plain_http(url, has_token=True, mode="refuse", what="x")
    check_plain_http(_url(), has_token=False, mode="refuse", what="x")
    check_plain_http(_url(), has_token=True, mode="refuse", what="x", allow_insecure=True)


def test_refuse_without_override_and_custom_hint_and_class() -> None:
    class Mine(InsecureTransportError):
        pass

    with pytest.raises(InsecureTransportError) as ei:
        check_plain_http(_url(), has_token=True, mode="refuse", what="--host")
    assert "loopback" in (ei.value.hint or "") and "--insecure" not in (ei.value.hint or "")
    with pytest.raises(Mine) as em:
        check_plain_http(_url(), has_token=True, mode="refuse", what="--host", hint="h", error=Mine)
    assert em.value.hint == "h" and em.value.exit_code == ExitCode.REFUSED


def test_refuse_fails_closed_without_a_host() -> None:
    for url in ("http://", "http://[not-ipv6]:80"):
        with pytest.raises(InsecureTransportError, match=r"\(no host\)"):
            check_plain_http(url, has_token=True, mode="refuse", what="x")


def test_credentials_in_the_url_are_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="genmanip_runtime.netpolicy")
    url = f"http://user:{TOKEN}@h-{uuid.uuid4().hex[:8]}.example.invalid/"
    with pytest.raises(InsecureTransportError) as ei:
        check_plain_http(url, has_token=True, mode="refuse", what="x")
    check_plain_http(url, has_token=True, mode="warn", what="x")
    for text in (str(ei.value), ei.value.hint or "", repr(ei.value), caplog.text):
        assert TOKEN not in text
    assert "plain http://" in caplog.text


def test_warn_logs_once_per_url(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="genmanip_runtime.netpolicy")
    url = _url()
    check_plain_http(url, has_token=True, mode="warn", what="server URL")  # never raises
    # Spellings of one URL (default port, trailing slash, case) count as one.
    check_plain_http(url + "/", has_token=True, mode="warn", what="server URL")
    check_plain_http(url.upper().replace("HTTP://", "http://"), has_token=True, mode="warn",
                     what="server URL")
    records = [r for r in caplog.records if r.name == "genmanip_runtime.netpolicy"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "(server URL)" in records[0].getMessage()
    other = _url()
    check_plain_http(other, has_token=True, mode="warn", what="server URL")
    assert len([r for r in caplog.records if r.name == "genmanip_runtime.netpolicy"]) == 2


def test_warn_is_silent_for_safe_urls(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="genmanip_runtime.netpolicy")
    check_plain_http(_url("https"), has_token=True, mode="warn", what="x")
    check_plain_http("http://127.0.0.1:9", has_token=True, mode="warn", what="x")
    check_plain_http(_url(), has_token=False, mode="warn", what="x")
    assert caplog.records == []


def test_unknown_mode_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="mode"):
        check_plain_http(_url(), has_token=True, mode="ignore", what="x")  # type: ignore[arg-type]
