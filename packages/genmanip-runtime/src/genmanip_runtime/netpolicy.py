"""gmp's network policy: which hosts are this machine, and when plain HTTP may carry a token.

Two rules every client and server of gmp applies, owned here so that they cannot drift apart:

* :func:`is_loopback_host` tells a host only this machine can reach: ``localhost`` (any case,
  with or without the trailing root dot), ``*.localhost`` (RFC 6761), the whole ``127.0.0.0/8``,
  ``::1`` and IPv4-mapped ``::ffff:127.x.y.z``. It looks at the name only and never resolves it:
  a DNS answer is not evidence that traffic stays on the machine. ``0.0.0.0`` (every interface) is
  *not* loopback.
* :func:`check_plain_http` is the plain-HTTP rule: a token must not travel over ``http://`` to a
  host that is not this machine. The caller picks the mode: ``"refuse"`` raises
  :class:`~genmanip_runtime.errors.InsecureTransportError` (the online service and the
  leaderboard, whose tokens are accounts on a public service), ``"warn"`` logs one warning per
  URL (the evaluation transport: evaluation servers often sit on a private network without TLS,
  as the reference client expects).

Messages name the host, never the token nor credentials embedded in a URL.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from typing import Literal
from urllib.parse import urlsplit

from .errors import InsecureTransportError

__all__ = ["check_plain_http", "is_loopback_host"]

_log = logging.getLogger(__name__)

# URLs (normalised, without credentials) already warned about in this process: a client that
# opens one transport per worker must not repeat the same warning eight times.
_warned: set[str] = set()
_warned_lock = threading.Lock()


def is_loopback_host(host: str | None) -> bool:
    """True for a host name or IP literal only this machine can reach.

    ``localhost``, ``localhost.``, ``*.localhost``, ``127.0.0.0/8``, ``::1`` (bracketed or not)
    and ``::ffff:127.0.0.0/104``; case does not matter. ``None``, ``""``, ``0.0.0.0``, ``::``
    and every other name are not loopback.
    """
    if not host:
        return False
    h = host.strip().lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    # The root dot only for names: "127.0.0.1." is not an IP literal and would go to a resolver.
    name = h[:-1] if h.endswith(".") else h
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    # ipaddress before Python 3.13 does not look inside IPv4-mapped IPv6 addresses.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _warn_key(scheme: str, host: str, url: str) -> str:
    """``http://host:port/path`` without credentials, so spellings of one URL warn once."""
    try:
        parts = urlsplit(url)
        port, path = parts.port or 80, parts.path.rstrip("/")
    except ValueError:
        return url
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{path}"


def check_plain_http(
    url: str,
    *,
    has_token: bool,
    mode: Literal["refuse", "warn"],
    what: str,
    allow_insecure: bool = False,
    override: str | None = None,
    hint: str | None = None,
    error: type[InsecureTransportError] = InsecureTransportError,
) -> None:
    """Apply the plain-HTTP rule to ``url``: a token over ``http://`` only to this machine.

    Nothing happens for ``https://`` (or any other scheme: checking it is the caller's job), for
    a loopback host, or when no token travels (``has_token`` false). Otherwise:

    * ``mode="refuse"`` raises ``error`` unless ``allow_insecure`` (the user accepted the risk
      with the flag named by ``override``, e.g. ``"--insecure-http"``);
    * ``mode="warn"`` logs one warning per URL and process (``allow_insecure`` changes nothing:
      there is nothing to refuse).

    Args:
        url: the URL, ``scheme://host[:port][/path]``; credentials in it are never shown.
        has_token: whether a token (or another secret) is sent to it.
        mode: ``"refuse"`` or ``"warn"``.
        what: where the URL came from, named in the message (``"--base-url"``,
            ``"data.endpoint"``, ``"server URL"``).
        allow_insecure: the user explicitly accepted plain HTTP (refuse mode only).
        override: the flag that sets ``allow_insecure``, for the hint (``None``: there is none).
        hint: the error's hint instead of the default one.
        error: the class raised, :class:`InsecureTransportError` or a caller's subclass of it
            (which keeps the caller's exception tree and exit code).

    Raises:
        InsecureTransportError: ``mode="refuse"``, plain HTTP to another host with a token and no
            ``allow_insecure``.
    """
    if mode not in ("refuse", "warn"):
        raise ValueError(f"mode must be 'refuse' or 'warn', got {mode!r}")
    text = str(url).strip()
    try:
        parts = urlsplit(text)
        scheme, host = parts.scheme.lower(), parts.hostname or ""
    except ValueError:  # e.g. "http://[not-ipv6]:80": no host anyone can vouch for
        scheme, host = text.partition("://")[0].lower(), ""
    if scheme != "http" or not has_token:
        return
    if is_loopback_host(host):
        return
    # A URL without a host cannot be shown to be this machine: fail closed.
    shown = host or "(no host)"
    if mode == "refuse":
        if allow_insecure:
            return
        if hint is None:
            hint = (
                f"use an https:// URL, or pass {override} to accept sending the token in clear text"
                if override
                else "use an https:// URL; plain HTTP is only for a server on this machine (loopback)"
            )
        raise error(
            f"refusing plain HTTP to {shown} ({what}): the token would travel unencrypted",
            host=host,
            hint=hint,
        )
    key = _warn_key(scheme, host, text)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    _log.warning(
        "the token will be sent over plain http:// to %s (%s); anyone on the path can read it "
        "(use https://)",
        shown,
        what,
    )
