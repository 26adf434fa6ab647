"""What a reply is and how it is judged: :class:`Response`, and the message of every reply that is
not a usable success.

This room owns the wording of a server's answer as gmp reports it: the status errors
(:class:`HTTPStatusError`, :class:`AuthError` with its token hint), a 2xx of the wrong media type
(:class:`UnexpectedReply`), "this does not look like <service>" for a page from some other web
server, and the scrubbing and cutting of every piece of server text quoted in them. It reads no
socket: :mod:`genmanip_runtime.transport` builds the :class:`Response` and re-exports it (import
it from there).
"""

from __future__ import annotations

import http.client
import json as _json
import re
from dataclasses import dataclass, field
from typing import Any

from genmanip_protocol.errors import DecodeError

from .errors import AuthError, HTTPStatusError, UnexpectedReply
from .text import safe_text

__all__ = ["Response", "reply_json"]

_DETAIL_MAX = 600
_REASON_MAX = 80
_SCRUB_MARGIN = 4096
#: How much of an unexpected body a message quotes.
_SNIPPET = 80


def reply_json(body: bytes | str) -> Any:
    """A reply body parsed as JSON: the one JSON reader of every client (via :meth:`Response.json`
    or directly). Raises ``ValueError`` for anything that is not JSON -- invalid UTF-8, an int of
    more than 4300 digits, and nesting deeper than the interpreter's stack (100k ``[``), which
    ``json.loads`` reports as ``RecursionError``."""
    try:
        return _json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


@dataclass
class Response:
    """One HTTP reply. ``body`` is the whole body (bytes); ``elapsed_s`` is send-to-last-byte time.

    ``headers`` is case-insensitive (``headers["content-type"]``).
    """

    status: int
    headers: http.client.HTTPMessage
    body: bytes
    elapsed_s: float
    method: str = "GET"
    route: str = ""
    reason: str = field(default="", repr=False)
    # The sending transport's token, so that detail() and raise_for_status() scrub a server that
    # echoes credentials back even when the caller does not pass it (found by tests/reliability).
    scrub_token: str | None = field(default=None, repr=False, compare=False)
    #: What the server should be ("a GenManip eval server"), named when a reply is not one's.
    service: str | None = field(default=None, repr=False, compare=False)
    #: The environment variable the token comes from (``"GMP_TOKEN"``), named by a 401's hint.
    token_env: str | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True for 2xx."""
        return 200 <= self.status < 300

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower case (``"application/json"``), or ``""``."""
        return (self.headers.get("content-type") or "").split(";", 1)[0].strip().lower()

    def json(self) -> Any:
        """The body parsed as JSON; :class:`DecodeError` naming the route when it is not JSON."""
        try:
            return reply_json(self.body)
        except ValueError as exc:
            raise DecodeError(
                f"{self.method} {self.route}: reply is not JSON ({exc.__class__.__name__}: "
                f"{safe_text(str(exc), limit=120)}); body starts "
                f"{_snippet(self.body, self.scrub_token)!r}",
                codec="json",
            ) from None

    def detail(self) -> str:
        """The server's error text: ``{"detail": ...}`` of a JSON body, else the text body."""
        return _scrub(_extract_detail(self.body, self.content_type), self.scrub_token)

    def raise_for_status(self, *, token: str | None = None, expect: str | None = None) -> Response:
        """Judge the reply; return it when it is a usable success. The one place of every status class:

        * 1xx (an interim reply with no final one after it, e.g. 101 Switching Protocols), 3xx (a
          redirect is never followed: the request carries the token) and 4xx/5xx raise
          :class:`HTTPStatusError` (:class:`AuthError` for 401/403) saying what the server answered;
        * a 2xx is returned -- unless ``expect`` names the media type the caller decodes and the
          body is empty (204 included) or of another type: :class:`UnexpectedReply`.
          ``"application/octet-stream"`` (RFC 2046: any binary data) accepts every non-textual
          type and a reply without one; ``"application/json"`` accepts ``*/*+json`` too.
        """
        tok = token or self.scrub_token
        if not 200 <= self.status < 300:
            raise _status_error(self, tok)
        if expect is not None:
            got = self.content_type
            if not self.body or not _media_matches(got, expect):
                raise _unexpected_reply(self, expect, tok)
        return self


def _extract_detail(body: bytes, content_type: str) -> str:
    text = body.decode("utf-8", "replace").strip()
    if content_type.endswith("json") or text.startswith("{"):
        try:
            obj = _json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "detail" in obj:
            d = obj["detail"]
            text = d if isinstance(d, str) else _json.dumps(d, ensure_ascii=False)
    # Made safe (registered secrets out, controls escaped) *before* the cut, so that no token's
    # prefix survives at the cut; the caller scrubs its own token in _scrub.
    return _scrub(text, None)


def _scrub(text: str, token: str | None) -> str:
    """Server text as it may appear in a message: :func:`~genmanip_runtime.text.safe_text` (every
    registered secret and ``token`` in all their forms, controls escaped, one line), then cut to
    about ``_DETAIL_MAX`` characters. Idempotent, so details may pass through it twice."""
    if len(text) > _DETAIL_MAX + 2 * _SCRUB_MARGIN:
        # Only what can be shown is made safe (a huge error body costs no time); the margins keep
        # a token that crosses a cut whole, so that it is scrubbed rather than its prefix shown.
        text = f"{text[: _DETAIL_MAX + _SCRUB_MARGIN]} ... {text[-(_DETAIL_MAX + _SCRUB_MARGIN):]}"
    text = safe_text(text, tokens=(token,))
    if len(text) > _DETAIL_MAX:
        # Remote tracebacks (RayTaskError) are long; the head names the error, the tail its cause.
        text = f"{text[: _DETAIL_MAX - 200]} ... {text[-180:]}"
    return text


def _media_matches(got: str, expect: str) -> bool:
    if got == expect:
        return True
    if expect == "application/octet-stream":
        # The generic binary type: whatever a binary wire is labelled (or not), but never a page
        # or a document (an HTML error page, a JSON error, plain text from a proxy).
        return not (got.startswith(("text/", "multipart/"))
                    or got.endswith(("json", "xml", "html", "javascript")))
    return expect.endswith("/json") and got.endswith("+json")


def _snippet(body: bytes, token: str | None) -> str:
    text = safe_text(body[: _SNIPPET * 4].decode("utf-8", "replace"), tokens=(token,))
    return text[:_SNIPPET] + ("..." if len(text) > _SNIPPET or len(body) > _SNIPPET * 4 else "")


def _reason(resp: Response, token: str | None) -> str:
    # The reason phrase is the server's text too (a hostile one puts escapes or the token there).
    reason = safe_text(resp.reason, limit=_REASON_MAX, tokens=(token,)) if resp.reason else ""
    return reason or http.client.responses.get(resp.status, "")


_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)


def _html_page(resp: Response) -> str | None:
    """``"an HTML page"`` (with its title) when the body is one, else None: never quoted whole."""
    head = resp.body[:512].lstrip().lower()
    if not (resp.content_type in ("text/html", "application/xhtml+xml")
            or head.startswith((b"<!doctype html", b"<html"))):
        return None
    m = _TITLE.search(resp.body[:4096])
    title = safe_text(m.group(1).decode("utf-8", "replace").strip(), limit=60) if m else ""
    return f"an HTML page titled {title!r}" if title else "an HTML page"


#: Statuses that say something about the request or a gateway rather than about which server this
#: is: an HTML page with one of them is a proxy's or a login's, not proof of a wrong server.
_NOT_IDENTIFYING = frozenset({401, 403, 407, 429, 502, 503, 504})


def _not_service_text(service: str) -> str:
    return (f"this does not look like {service} (GET /docs on the server shows what it is; "
            "a GenManip eval server answers JSON, not HTML pages)")


def _unexpected_reply(resp: Response, expect: str, token: str | None) -> UnexpectedReply:
    got = resp.content_type
    page = _html_page(resp) if resp.body else None
    if not resp.body:
        sent = "an empty body"
    elif page is not None:
        sent = f"{page} ({len(resp.body):,} bytes)"
    else:
        shown = safe_text(got, limit=_REASON_MAX) if got else "no Content-Type"
        sent = f"{shown} ({len(resp.body):,} bytes, starting {_snippet(resp.body, token)!r})"
    msg = (f"{resp.method} {resp.route}: the server answered HTTP {resp.status} "
           f"{_reason(resp, token)} with {sent}, expected {expect}")
    if resp.service:
        msg += ": " + (_not_service_text(resp.service) if page is not None
                       else f"this does not look like {resp.service}")
    err = UnexpectedReply(
        msg, status=resp.status, content_type=got, expected=expect, route=resp.route,
        hint="check the URL: is it the server itself (not a proxy's login or error page)?",
    )
    err.not_service = resp.service is not None and page is not None
    return err


def _status_error(resp: Response, token: str | None) -> HTTPStatusError:
    page = _html_page(resp)
    # An HTML page is never dumped into a message (it is a page, not an error text).
    detail = page or _scrub(resp.detail(), token)
    status = resp.status
    msg = f"{resp.method} {resp.route} failed: HTTP {status} {_reason(resp, token)}".rstrip()
    hint: str | None = None
    not_service = False
    if page is not None and resp.service and 400 <= status and status not in _NOT_IDENTIFYING:
        # A wrong port (gmp viz, a web server): say so instead of blaming the server.
        not_service = True
        msg += f" with {page}: {_not_service_text(resp.service)}"
        hint = "check --url / --host / --port: they name some other web server"
        detail = ""
    if 300 <= status < 400:
        location = resp.headers.get("location")
        if location:
            # Never followed: the request carries the token, and a GenManip server never
            # redirects; the target is named so that the user can decide.
            detail = safe_text(location, limit=200, tokens=(token,))
            msg += f", a redirect to {detail!r} (not followed: the request carries credentials)"
            hint = "if that address is the right server, pass it instead (--url / --base-url / --host)"
        else:
            msg += ", expected a 2xx reply"
            if detail:
                msg += f": {detail}"
    elif status < 200:
        msg += ", an interim reply with no final reply after it"
    elif detail:
        msg += f": {detail}"
    if resp.service and status < 400:
        msg += f"; this does not look like {resp.service}"
    kwargs: dict[str, Any] = {
        "status": status,
        "detail": detail,
        "route": resp.route,
        "sent": True,
        # A 4xx means the server refused the request; a 5xx (504 included) may have acted on it;
        # so may one that answered "still processing" (1xx); a redirect came before any work.
        "maybe_executed": status >= 500 or status < 200,
    }
    if hint is not None:
        kwargs["hint"] = hint
    if resp.status in (401, 403):
        env = f"${resp.token_env}" if resp.token_env else "the token environment variable"
        if token:
            hint = (f"the token was rejected: check the one in {env}, the config file "
                    "(token / token_file) or --token")
        else:
            hint = (f"the server wants a token and none was sent: set {env}, add token or "
                    "token_file to the config file, or pass --token")
        return AuthError(msg, hint=hint, **kwargs)
    err = HTTPStatusError(msg, **kwargs)
    err.not_service = not_service
    return err
