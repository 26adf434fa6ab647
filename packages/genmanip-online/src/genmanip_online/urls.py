"""URL checks and the ``stop`` route candidates of an assigned endpoint.

The token travels in the ``Authorization`` header of every call, so a plain ``http://`` URL to a
host that is not this machine would expose it: such URLs are refused unless the user explicitly
accepts the risk (``--insecure-http``).
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit

from genmanip_protocol.errors import ValidationError, Violation
from genmanip_runtime.transport import is_loopback_host

from .errors import InsecureURLError

__all__ = ["check_url", "is_loopback_host", "origin_and_path", "stop_candidates"]


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
    if parts.scheme == "http" and not insecure_http and not is_loopback_host(parts.hostname):
        raise InsecureURLError(
            f"refusing plain HTTP to {parts.hostname} ({field}): the token would travel unencrypted",
            hint="use an https:// URL, or pass --insecure-http to accept sending the token in clear text",
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
