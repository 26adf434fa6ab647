"""The process-wide registry of secrets, and the one function that takes them out of any text.

Every token gmp holds registers itself here: a :class:`~genmanip_runtime.config.Secret` when it is
created, a token when :func:`~genmanip_runtime.config.resolve_token` finds it (the eval, online and
leaderboard clients and the testbed all resolve theirs that way). :func:`scrub_secrets` then
replaces what a server may have echoed back, wherever the text ends up: the transport's error
details, the clients' messages, the console, the log formatter and ``gmp``'s error printer all call
it (through :func:`genmanip_runtime.text.safe_text`), so no output path can show a token.

What counts as the token (a blocklist cannot be complete -- a server that wants to can always
encode the token some other way; these are the forms an *accidental* echo takes):

* the token itself, and **any run of at least** :data:`PARTIAL_MIN` **characters of it** -- a
  detail cut at N characters keeps the token's prefix, a split one its suffix, an escape sequence
  pushed into the middle leaves two halves;
* its **percent-encoding** (a URL or query string echoed back; upper- and lower-case escapes) and
  its **JSON string escape** (when they differ from the token);
* its **hex** encoding (lower and upper case);
* its **base64** encoding, standard and URL-safe alphabet, **at every byte alignment**: the
  characters that depend on the token's bytes alone are matched, so ``base64("Bearer <token>")``,
  ``base64("user:<token>")`` (HTTP Basic) and base64 of any JSON holding the token are caught too.

Runs of any of these forms of at least :data:`PARTIAL_MIN` characters are replaced by
:data:`REDACTED`. Not covered, by design: other transformations (reversed, rot13, XOR, ...), a
token split across two messages, pieces shorter than :data:`PARTIAL_MIN` characters (a shorter
piece cannot be told apart from ordinary text), and tokens shorter than :data:`MIN_SECRET_LEN`
characters (they are not registered: replacing such a short word everywhere would mangle
messages; a transport still replaces its own token exactly, whatever its length).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import urllib.parse
from typing import Protocol

__all__ = [
    "MIN_SECRET_LEN",
    "PARTIAL_MIN",
    "REDACTED",
    "SupportsReveal",
    "forget_secrets",
    "register_secret",
    "registered_secrets",
    "scrub_secrets",
    "secret_forms",
]

#: What a secret (or a piece of one) is replaced by; ``str(Secret(...))`` shows the same.
REDACTED = "***"
#: The shortest token the registry accepts: shorter ones are words, not secrets.
MIN_SECRET_LEN = 8
#: The shortest run of a secret's form that is replaced (the prefix left at a cut, a suffix, ...).
PARTIAL_MIN = 8


class SupportsReveal(Protocol):
    """A wrapped secret (:class:`~genmanip_runtime.config.Secret`): ``reveal()`` gives the value."""

    def reveal(self) -> str: ...


SecretLike = str | SupportsReveal | None


def _value(secret: SecretLike) -> str | None:
    if secret is None:
        return None
    value = secret if isinstance(secret, str) else secret.reveal()
    return value or None


def _b64_aligned(raw: bytes) -> list[str]:
    """The base64 characters that depend on ``raw``'s bytes alone, at each of the 3 alignments."""
    out = []
    for lead in range(3):
        enc = base64.b64encode(b"\0" * lead + raw + b"\0\0").decode("ascii")
        # Character c encodes bits [6c, 6c + 6); keep those inside the token's bits.
        first = -(-8 * lead // 6)
        last = (8 * (lead + len(raw))) // 6  # exclusive
        inner = enc[first:last]
        out.append(inner)
        out.append(inner.replace("+", "-").replace("/", "_"))
    return out


def secret_forms(secret: str) -> tuple[str, ...]:
    """Every form of ``secret`` that :func:`scrub_secrets` looks for (see the module docstring),
    the token first; forms shorter than :data:`PARTIAL_MIN` are left out (except the token)."""
    raw = secret.encode("utf-8", "surrogatepass")
    forms = [secret]
    pct = urllib.parse.quote(secret, safe="")
    forms += [pct, re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), pct)]
    forms.append(urllib.parse.quote_plus(secret, safe=""))
    forms.append(json.dumps(secret)[1:-1])
    hexed = binascii.hexlify(raw).decode("ascii")
    forms += [hexed, hexed.upper()]
    forms += _b64_aligned(raw)
    seen: dict[str, None] = {secret: None}
    for f in forms[1:]:
        if len(f) >= PARTIAL_MIN:
            seen.setdefault(f, None)
    return tuple(seen)


class _Matcher:
    """The forms of a set of secrets, indexed by every :data:`PARTIAL_MIN`-character run."""

    def __init__(self) -> None:
        self.exact: list[str] = []  # secrets too short for the partial rule: replaced whole
        self.grams: dict[str, list[str]] = {}
        self.secrets: set[str] = set()

    def clear(self) -> None:
        # New objects, not cleared ones: a scrub in another thread keeps a consistent old view.
        self.exact, self.grams, self.secrets = [], {}, set()

    def add(self, secret: str) -> None:
        if secret in self.secrets:
            return
        self.secrets.add(secret)
        if len(secret) < PARTIAL_MIN:
            # Copied, not sorted in place: a scrub in another thread may be iterating it. Longest
            # first, so that a secret containing another is replaced whole.
            self.exact = sorted([*self.exact, secret], key=len, reverse=True)
            return
        for form in secret_forms(secret):
            for i in range(len(form) - PARTIAL_MIN + 1):
                bucket = self.grams.setdefault(form[i : i + PARTIAL_MIN], [])
                if form not in bucket:
                    bucket.append(form)

    def scrub(self, text: str) -> str:
        for secret in self.exact:
            if secret in text:
                text = text.replace(secret, REDACTED)
        grams = self.grams
        if not grams or len(text) < PARTIAL_MIN:
            return text
        out: list[str] = []
        start = 0  # text[start:i] is kept as it is
        i = 0
        n = len(text)
        while i <= n - PARTIAL_MIN:
            forms = grams.get(text[i : i + PARTIAL_MIN])
            if forms is None:
                i += 1
                continue
            # The longest run starting here that is still a piece of one of the forms.
            end = i + PARTIAL_MIN
            for form in forms:
                j = i + PARTIAL_MIN
                while j < n and text[i : j + 1] in form:
                    j += 1
                end = max(end, j)
            out.append(text[start:i])
            out.append(REDACTED)
            start = i = end
        if not out:
            return text
        out.append(text[start:])
        return "".join(out)


_lock = threading.Lock()
_registry = _Matcher()
# Matchers of callers' own (unregistered) tokens, by token tuple: a transport scrubs every error
# with its token, and building the index each time would cost more than the scrub.
_extra_cache: dict[tuple[str, ...], _Matcher] = {}
_EXTRA_CACHE_MAX = 16


def register_secret(secret: SecretLike) -> None:
    """Remember ``secret`` for the rest of the process: every later :func:`scrub_secrets` takes it
    (and its encoded forms) out. ``None``, empty values and values shorter than
    :data:`MIN_SECRET_LEN` are ignored. Cheap to repeat."""
    value = _value(secret)
    if value is None:
        return
    value = value.strip()
    if len(value) < MIN_SECRET_LEN:
        return
    with _lock:
        _registry.add(value)


def registered_secrets() -> int:
    """How many secrets the registry holds (for diagnostics and tests; never the values)."""
    with _lock:
        return len(_registry.secrets)


def forget_secrets() -> None:
    """Empty the registry (for tests that need a process without registered secrets)."""
    with _lock:
        _registry.clear()


def _matcher_for(values: tuple[str, ...]) -> _Matcher:
    with _lock:
        m = _extra_cache.get(values)
        if m is None:
            if len(_extra_cache) >= _EXTRA_CACHE_MAX:
                _extra_cache.pop(next(iter(_extra_cache)))
            m = _extra_cache[values] = _Matcher()
            for v in values:
                m.add(v)
        return m


def scrub_secrets(text: str, *also: SecretLike) -> str:
    """``text`` with every registered secret, and each of ``also``, replaced by :data:`REDACTED`.

    ``also`` are the caller's own credentials (a transport's token): they are replaced whatever
    their length (exactly when shorter than :data:`PARTIAL_MIN`, in every form otherwise), without
    being registered.
    """
    registry = _registry
    if registry.secrets:
        text = registry.scrub(text)
    extra = tuple(v for v in (_value(s) for s in also) if v and v not in registry.secrets)
    if extra:
        text = _matcher_for(extra).scrub(text)
    return text
