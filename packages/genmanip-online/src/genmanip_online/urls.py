"""URL checks and the ``stop`` route candidates of an assigned endpoint.

The token travels in the ``Authorization`` header of every call, so a plain ``http://`` URL to a
host that is not this machine would expose it: such URLs are refused unless the user explicitly
accepts the risk (``--insecure-http``). The rule itself is
:func:`genmanip_runtime.netpolicy.check_plain_http`, in ``"refuse"`` mode.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit

from genmanip_protocol.errors import ValidationError, Violation
from genmanip_runtime.netpolicy import check_plain_http

from .errors import InsecureURLError

__all__ = ["check_url", "origin_and_path", "stop_candidates"]


def check_url(url: str, *, insecure_http: bool = False, field: str = "--base-url") -> SplitResult:
    """Parse and check a service URL; return its parts (trailing ``/`` of the path removed).

    Raises:
        ValidationError: not an ``http(s)://host`` URL, or it embeds credentials (``user:pass@``).
        InsecureURLError: ``http://`` to a non-loopback host without ``insecure_http``.
    """
    parts = urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(Violation(field, "an http:// or https:// URL with a host", repr(url)))
    if parts.username is not None or parts.password is not None:
        # Never echo the URL here: the credentials are in it.
        raise ValidationError(
            Violation(field, "a URL without user:password@", "a URL with embedded credentials"),
            hint="pass the token with --token, the environment or the config file",
        )
    # Every call to the service (and to an assigned endpoint) carries the token.
    check_plain_http(
        parts.geturl(),
        has_token=True,
        mode="refuse",
        what=field,
        allow_insecure=insecure_http,
        override="--insecure-http",
        error=InsecureURLError,
    )
    return parts._replace(path=parts.path.rstrip("/"), fragment="")


def origin_and_path(parts: SplitResult) -> tuple[str, str]:
    """Split checked URL parts into ``scheme://host[:port]`` and the path prefix (no trailing ``/``)."""
    return urlunsplit((parts.scheme, parts.netloc, "", "", "")), parts.path.rstrip("/")


def stop_candidates(endpoint: str) -> list[str]:
    """The URLs to try, in order, to stop an assigned endpoint (reference facts §10).

    ``<endpoint>/stop`` (or the endpoint itself when it already ends in ``/stop``), then, when the
    path contains ``/api/predict/``, ``<prefix>/stop`` where prefix is the part before it. The caller
    tries the next one only after an HTTP 404. Query strings of the endpoint are dropped (the caller
    adds ``run_id``).
    """
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/")
    first = path if path.endswith("/stop") else f"{path}/stop"
    out = [urlunsplit((parts.scheme, parts.netloc, first, "", ""))]
    marker = "/api/predict/"
    if marker in path + "/":
        prefix = (path + "/").split(marker, 1)[0]
        second = urlunsplit((parts.scheme, parts.netloc, f"{prefix}/stop", "", ""))
        if second not in out:
            out.append(second)
    return out
