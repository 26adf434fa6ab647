"""Upload client of the leaderboard service (reference facts §11).

``POST https://<host>:<port>/api/upload`` as ``multipart/form-data``: the file part ``file``
(``results_<run_id>.zip``, ``application/zip``) and the fields ``submission_name``,
``leaderboard_name``, ``author_token`` and ``submission_infos`` (the JSON string of the two names).
The reply is ``{"status": "success", "submission_id": ...}`` or a body with ``"error"``.
``GET /upload_status/<submission_id>`` reports a submission's state.

Unlike the reference client, TLS verification is always on (``ca_file`` adds a private CA), a
failed upload is an error (never exit 0), and the token is never shown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from genmanip_protocol.errors import ValidationError, Violation
from genmanip_runtime.errors import ConnectError, RequestTimeout, ResponseTooLarge, TransportError
from genmanip_runtime.netpolicy import check_plain_http
from genmanip_runtime.text import safe_text
from genmanip_runtime.transport import HttpTransport, Response, reply_json

from .errors import (
    InsecureLeaderboardURL,
    LeaderboardAuthError,
    LeaderboardReplyError,
    UploadInterruptedError,
    UploadRejectedError,
)

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "LeaderboardClient", "UploadResult", "upload_timeout"]

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 8000
_SNIPPET = 300
_MESSAGE_MAX = 2000


def upload_timeout(size_bytes: int) -> float:
    """Seconds to wait for the upload's reply: ``max(600, size_MB * 0.6)`` (the reference's limit)."""
    return max(600.0, size_bytes / 1e6 * 0.6)


@dataclass(frozen=True)
class UploadResult:
    """A confirmed upload: the service's ``submission_id``, its status URL and the whole reply."""

    submission_id: str
    status_url: str
    reply: dict[str, Any]


class LeaderboardClient:
    """Client of one leaderboard server.

    Args:
        host, port: the server (``https://host:port``).
        token: the author token, sent only as the ``author_token`` form field.
        ca_file: extra PEM CA bundle to trust; verification is always on.
        insecure_http: use plain ``http://``; allowed only for a loopback host (local testing).
        timeout: limit for connecting and for ``status`` calls, in seconds.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str | None,
        *,
        ca_file: str | os.PathLike[str] | None = None,
        insecure_http: bool = False,
        timeout: float = 30.0,
    ) -> None:
        host = str(host).strip()
        if not host or any(c in host for c in "/?#@ "):
            raise ValidationError(Violation("--host", "a host name or IP address", repr(host)))
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise ValidationError(Violation("--port", "a port number", repr(port))) from None
        if not 0 < port < 65536:
            raise ValidationError(Violation("--port", "a port number in 1..65535", str(port)))
        self.scheme = "http" if insecure_http else "https"
        h = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.base_url = f"{self.scheme}://{h}:{port}"
        # The author token travels in every upload (and results are private until published), so
        # --insecure-http is only ever for a leaderboard on this machine: no override.
        check_plain_http(
            self.base_url,
            has_token=True,
            mode="refuse",
            what="--host",
            hint="plain HTTP is only for a leaderboard on this machine; use HTTPS (--ca-cert for a private CA)",
            error=InsecureLeaderboardURL,
        )
        if ca_file is not None and not Path(ca_file).is_file():
            raise ValidationError(Violation("--ca-cert", "a readable PEM file", repr(str(ca_file))))
        self._token = token or None
        self._transport = HttpTransport(self.base_url, timeout=timeout, ca_file=ca_file)

    def __repr__(self) -> str:
        return f"LeaderboardClient({self.base_url!r}, token={'***' if self._token else None})"

    def _redact(self, text: str) -> str:
        """``text`` (a reply's, or an error quoting one) safe for a message: every registered
        secret and this client's token scrubbed in all their forms, control characters escaped
        (:func:`genmanip_runtime.text.safe_text`)."""
        # Very short "tokens" would mangle every message; real tokens are long.
        own = self._token if self._token and len(self._token) >= 6 else None
        # Bounded: a reply's message may be megabytes, and a message is read by a human.
        return safe_text(text, limit=_MESSAGE_MAX, tokens=(own,))

    def _snippet(self, body: bytes) -> str:
        # Scrubbed *before* the cut (a token straddling it would leave its prefix); the margin
        # holds any token that starts inside the part shown.
        text = self._redact(body[: _SNIPPET + 4096].decode("utf-8", "replace").strip())
        if len(body) > _SNIPPET or len(text) > _SNIPPET:
            text = text[:_SNIPPET] + "..."
        return text

    def status_url(self, submission_id: str) -> str:
        """The status page of a submission."""
        return f"{self.base_url}/upload_status/{quote(str(submission_id), safe='')}"

    def _error_text(self, resp: Response) -> str:
        try:
            obj = reply_json(resp.body)
        except (ValueError, UnicodeDecodeError):
            return self._snippet(resp.body)
        if isinstance(obj, dict):
            for key in ("error", "detail", "message", "msg"):
                if obj.get(key):
                    v = obj[key]
                    return self._redact(v if isinstance(v, str) else json.dumps(v))
        return self._snippet(resp.body)

    def upload(
        self,
        bundle: str | os.PathLike[str],
        *,
        submission_name: str,
        leaderboard_name: str,
        filename: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> UploadResult:
        """Upload a bundle zip; return the confirmed submission.

        ``progress(bytes_sent)`` is called as the body streams out.

        Raises:
            LeaderboardAuthError: the token was rejected (HTTP 401/403).
            UploadRejectedError: any other refusal (an ``"error"`` body or a non-2xx status).
            UploadInterruptedError: the connection failed or dropped before a reply.
            LeaderboardReplyError: a 2xx reply without ``status == "success"`` and a ``submission_id``.
        """
        for fld, value in (("--submission-name", submission_name), ("--leaderboard-name", leaderboard_name)):
            if not isinstance(value, str) or not value.strip():
                raise ValidationError(Violation(fld, "a non-empty name", repr(value)))
        path = Path(bundle)
        size = path.stat().st_size
        fields = {
            "submission_name": submission_name,
            "leaderboard_name": leaderboard_name,
            "author_token": self._token or "",
            "submission_infos": json.dumps(
                {"submission_name": submission_name, "leaderboard_name": leaderboard_name}
            ),
        }
        try:
            resp = self._transport.request_multipart(
                "/api/upload",
                fields,
                {"file": (filename or path.name, path, "application/zip")},
                progress,
                timeout=upload_timeout(size),
                route_name="upload",
                raise_for_status=False,
            )
        except ConnectError as e:
            raise UploadInterruptedError(
                f"cannot reach the leaderboard at {self.base_url}: {self._redact(str(e))}", hint=e.hint
            ) from e
        except RequestTimeout as e:
            raise UploadInterruptedError(
                f"the leaderboard did not answer the upload in time: {self._redact(str(e))}",
                hint="nothing was marked as submitted; check `gmp leaderboard status` or retry",
            ) from e
        except ResponseTooLarge:
            raise  # the leaderboard answered (too much): not an interrupted upload
        except TransportError as e:
            raise UploadInterruptedError(
                f"the upload was interrupted: {self._redact(str(e))}",
                hint="nothing was marked as submitted; run the same command again",
            ) from e
        if resp.status < 400:
            # A 1xx without a final reply, a redirect (never followed: the upload carries the
            # token): judged where every reply is (the transport), saying what came.
            resp.raise_for_status()
        if resp.status in (401, 403):
            raise LeaderboardAuthError(
                resp.status,
                self._error_text(resp),
                hint="check the author token (--token, $USER_TOKEN or [leaderboard] token in the config file)",
            )
        if resp.status >= 300:
            raise UploadRejectedError(resp.status, self._error_text(resp))
        try:
            obj = reply_json(resp.body)
        except (ValueError, UnicodeDecodeError):
            raise LeaderboardReplyError("body", f"not JSON: {self._snippet(resp.body)!r}") from None
        if not isinstance(obj, dict):
            raise LeaderboardReplyError("body", f"expected a JSON object, got {type(obj).__name__}")
        if obj.get("error"):
            raise UploadRejectedError(resp.status, self._error_text(resp))
        if obj.get("status") != "success":
            raise LeaderboardReplyError("status", f"expected 'success', got {obj.get('status')!r}")
        sid = obj.get("submission_id")
        if isinstance(sid, bool) or not isinstance(sid, (str, int)) or not str(sid).strip():
            raise LeaderboardReplyError("submission_id", f"missing or empty ({sid!r})")
        return UploadResult(submission_id=str(sid), status_url=self.status_url(str(sid)), reply=obj)

    def status(self, submission_id: str) -> Any:
        """The service's status of a submission (its JSON, or ``{"text": ...}`` for a text page).

        Raises:
            UploadRejectedError: a non-2xx reply (404 for an unknown id), LeaderboardAuthError for 401/403.
            UploadInterruptedError: the service could not be reached.
        """
        path = f"/upload_status/{quote(str(submission_id), safe='')}"
        try:
            resp = self._transport.request("GET", path, route_name="upload_status",
                                           idempotent=True, raise_for_status=False)
        except TransportError as e:
            raise UploadInterruptedError(
                f"cannot get the status from {self.base_url}: {self._redact(str(e))}", hint=e.hint
            ) from e
        what = f"the status request for {submission_id!r}"
        if resp.status < 400:
            resp.raise_for_status()  # 1xx, 3xx: as for upload()
        if resp.status in (401, 403):
            raise LeaderboardAuthError(resp.status, self._error_text(resp), what=what)
        if resp.status >= 300:
            raise UploadRejectedError(resp.status, self._error_text(resp), what=what)
        if not resp.body:
            raise LeaderboardReplyError("body", f"empty (HTTP {resp.status}), expected a status page")
        try:
            return reply_json(resp.body)
        except (ValueError, UnicodeDecodeError):
            return {"text": self._snippet(resp.body)}

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> LeaderboardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
