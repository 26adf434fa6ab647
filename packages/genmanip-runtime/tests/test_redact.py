"""The secret registry: every form of a registered token is scrubbed, ordinary text is not."""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator

import pytest
from genmanip_runtime import config as config_mod
from genmanip_runtime.config import Secret, resolve_secret, resolve_token
from genmanip_runtime.redact import (
    MIN_SECRET_LEN,
    PARTIAL_MIN,
    REDACTED,
    forget_secrets,
    register_secret,
    registered_secrets,
    scrub_secrets,
    secret_forms,
)

TOKEN = "srv-" + "3f9c2a7be41d0865" * 2  # 36 characters, like a real token


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


def _leaks(text: str, token: str = TOKEN) -> list[str]:
    """Every run of >= PARTIAL_MIN characters of the token's forms still in ``text``."""
    out = []
    for form in secret_forms(token):
        for i in range(len(form) - PARTIAL_MIN + 1):
            piece = form[i : i + PARTIAL_MIN]
            if piece in text:
                out.append(piece)
    return out


def test_unregistered_text_is_unchanged() -> None:
    text = f"GET /status failed: HTTP 500 Internal Server Error: {TOKEN}"
    assert scrub_secrets(text) == text
    assert registered_secrets() == 0


@pytest.mark.parametrize(
    "shown",
    [
        pytest.param(lambda t: t, id="raw"),
        pytest.param(lambda t: f"denied for Bearer {t} at /step", id="bearer"),
        pytest.param(lambda t: t[:PARTIAL_MIN], id="prefix-at-cut-min"),
        pytest.param(lambda t: f"detail ... {t[:13]}", id="prefix-at-cut"),
        pytest.param(lambda t: f"{t[-9:]} ... tail", id="suffix"),
        pytest.param(lambda t: f"x{t[7:21]}y", id="middle-substring"),
        pytest.param(lambda t: f"{t[:15]}\x1b[2J{t[15:]}", id="split-by-escape"),
        pytest.param(lambda t: base64.b64encode(t.encode()).decode(), id="base64"),
        pytest.param(lambda t: base64.b64encode(f"Bearer {t}".encode()).decode(), id="base64-bearer"),
        pytest.param(lambda t: base64.b64encode(f"user:{t}".encode()).decode(), id="base64-basic"),
        pytest.param(
            lambda t: base64.urlsafe_b64encode(json.dumps({"auth": t}).encode()).decode(),
            id="base64url-json",
        ),
        pytest.param(lambda t: base64.b64encode(t.encode()).decode()[:20], id="base64-cut"),
        pytest.param(lambda t: urllib.parse.quote(f"Bearer {t}", safe=""), id="urlencoded"),
        pytest.param(lambda t: binascii.hexlify(t.encode()).decode(), id="hex"),
        pytest.param(lambda t: binascii.hexlify(t.encode()).decode().upper(), id="HEX"),
        pytest.param(lambda t: f"{t} and again {t}", id="twice"),
    ],
)
def test_every_form_of_a_registered_token_is_scrubbed(shown: object) -> None:
    register_secret(TOKEN)
    text = f"server said: {shown(TOKEN)} (end)"  # type: ignore[operator]
    out = scrub_secrets(text)
    assert REDACTED in out
    assert not _leaks(out), out
    assert out.startswith("server said: ") and out.endswith(" (end)")


def test_percent_and_json_escaped_forms_of_a_token_with_specials() -> None:
    tok = 'p@ss/w"rd+' + secrets.token_urlsafe(12)
    register_secret(tok)
    for shown in (urllib.parse.quote(tok, safe=""), urllib.parse.quote(tok, safe="").lower(),
                  urllib.parse.quote_plus(tok), json.dumps(tok)[1:-1]):
        out = scrub_secrets(f"echo {shown}!")
        assert not _leaks(out, tok), (shown, out)


def test_pieces_shorter_than_the_partial_minimum_are_kept() -> None:
    """Seven characters of a token are not told apart from ordinary text (documented limit)."""
    register_secret(TOKEN)
    piece = TOKEN[3 : 3 + PARTIAL_MIN - 1]
    assert scrub_secrets(f"a {piece} b") == f"a {piece} b"


def test_a_token_split_across_two_messages_is_out_of_scope() -> None:
    """Each message on its own holds a piece; each piece >= PARTIAL_MIN is still scrubbed."""
    register_secret(TOKEN)
    first, second = TOKEN[:18], TOKEN[18:]
    assert scrub_secrets(first) == REDACTED and scrub_secrets(second) == REDACTED


def test_ordinary_text_is_left_alone() -> None:
    register_secret(TOKEN)
    for text in ("GET /status failed: HTTP 401 Unauthorized", "srv-", "3f9c2a7", "token ***",
                 "episode testbed/run/task/000 done", "QmVhcmVy", "\x1b[31mred\x1b[0m"):
        assert scrub_secrets(text) == text


def test_short_values_are_not_registered_but_explicit_tokens_are_always_scrubbed() -> None:
    register_secret("abc")
    register_secret("x" * (MIN_SECRET_LEN - 1))
    register_secret("")
    register_secret(None)
    assert registered_secrets() == 0
    # A caller's own token is replaced whatever its length (the transport's old behaviour).
    assert scrub_secrets("tok=abc;", "abc") == "tok=***;"
    assert scrub_secrets(f"{TOKEN[:12]}...", TOKEN) == "***..."
    assert registered_secrets() == 0  # and it is not registered by that


def test_secret_and_resolved_tokens_register_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    Secret(TOKEN)
    assert scrub_secrets(TOKEN) == REDACTED
    env_tok = "env-" + secrets.token_hex(12)
    monkeypatch.setenv("GMP_TEST_SECRET", env_tok)
    assert resolve_token(None, "GMP_TEST_SECRET", None, config={}) == env_tok
    cfg_tok = "cfg-" + secrets.token_hex(12)
    sec = resolve_secret(None, None, "eval", config={"eval": {"token": cfg_tok}})
    assert sec is not None and str(sec) == REDACTED
    for tok in (env_tok, cfg_tok):
        assert scrub_secrets(f"echo {tok}") == f"echo {REDACTED}"
    assert registered_secrets() == 3
    assert config_mod.Secret is Secret


def test_registering_twice_and_from_threads_is_safe() -> None:
    tokens = ["thr-" + secrets.token_hex(10) for _ in range(8)]

    def work(tok: str) -> None:
        for _ in range(20):
            register_secret(tok)
            scrub_secrets(f"x {tok} y")

    threads = [threading.Thread(target=work, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registered_secrets() == len(tokens)
    out = scrub_secrets(" ".join(tokens))
    assert all(t not in out for t in tokens)


def test_scrubbing_a_long_text_is_fast() -> None:
    import time

    for _ in range(5):
        register_secret("tok-" + secrets.token_hex(16))
    text = ("GET /step failed: HTTP 500: ValueError in worker 3; " * 200)[:10_000]
    t0 = time.perf_counter()
    for _ in range(10):
        scrub_secrets(text)
    assert (time.perf_counter() - t0) / 10 < 0.05


def test_a_transport_built_with_a_token_registers_it() -> None:
    # Not only tokens read through the config: a transport given one directly (a library user's
    # HttpTransport(url, token=...)) makes every output scrub it too.
    from genmanip_runtime.transport import HttpTransport

    token = "tk-" + "f00dfeed" * 4
    assert token in scrub_secrets(f"echo {token}")
    HttpTransport("http://127.0.0.1:9", token=token).close()
    assert token not in scrub_secrets(f"echo {token}")
