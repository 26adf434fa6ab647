"""Client of the hosted online evaluation service (reference facts §10).

Three calls, all JSON POSTs with ``Authorization: Bearer <token>``:

* ``createTask`` -> ``data.task_id``;
* ``ready`` ``{"task_id"}`` -> ``data.ready`` and, once ready, ``data.endpoint`` (an evaluation
  server base URL that is driven with the task id as ``run_id`` and the same token);
* ``<endpoint>/stop?run_id=<task_id>`` (then ``<prefix>/stop`` when the endpoint path contains
  ``/api/predict/``, tried only after an HTTP 404).

Replies are the envelope ``{"code": 0, "msg": str, "data": {...}}``. Unlike the reference client,
a non-JSON body is an error (never silently turned into ``{"text": ...}``), and a non-zero ``code``,
an HTTP error, a timeout and an unreachable service each raise their own typed error.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from genmanip_protocol.errors import ValidationError, Violation
from genmanip_runtime.errors import ConnectError, RequestTimeout, ResponseTooLarge, TransportError
from genmanip_runtime.retry import Backoff
from genmanip_runtime.text import escape_controls, safe_text
from genmanip_runtime.transport import HttpTransport, reply_json

from .errors import (
    GenmanipOnlineError,
    OnlineAuthError,
    OnlineDeadlineError,
    OnlineHTTPError,
    OnlineReplyError,
    OnlineServiceError,
    OnlineTimeout,
    OnlineUnreachable,
)
from .urls import check_url, origin_and_path, stop_candidates

__all__ = [
    "CREATE_FIELDS",
    "CREATE_PATH",
    "READY_PATH",
    "OnlineClient",
    "PollEvent",
    "ReadyStatus",
    "StopResult",
]

log = logging.getLogger(__name__)

CREATE_PATH = "/api/v1/benchmark/onlineEvaluation/createTask"
READY_PATH = "/api/v1/benchmark/onlineEvaluation/ready"

#: Body fields of ``createTask``; only the ones that are set are sent (as the reference client does).
CREATE_FIELDS = (
    "task_id",
    "model_name",
    "model_type",
    "benchmark_set",
    "submitter_name",
    "submitter_homepage",
    "is_public",
)

_SNIPPET = 300
_MESSAGE_MAX = 2000


@dataclass(frozen=True)
class ReadyStatus:
    """One answer of ``ready``.

    Attributes:
        task_id: the polled task.
        ready: ``data.ready is True``.
        endpoint: the evaluation base URL (only when ready).
        queue_position: position in the service's queue when it says so (0 = next), else None.
        eta_s: the service's estimate of the wait in seconds, else None.
        status: the service's status word (e.g. ``"queued"``), else None.
        data: the whole ``data`` object, read-only.
    """

    task_id: str
    ready: bool
    endpoint: str | None
    queue_position: int | None = None
    eta_s: float | None = None
    status: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PollEvent:
    """Reported to ``wait_ready``'s ``on_poll`` after every poll.

    ``elapsed_s`` is seconds since waiting started, ``polls`` the number of polls so far,
    ``status`` the answer (None when the poll failed with a transient ``error``), ``next_delay_s``
    the wait before the next poll (None when done).
    """

    polls: int
    elapsed_s: float
    status: ReadyStatus | None
    error: GenmanipOnlineError | None = None
    next_delay_s: float | None = None


@dataclass(frozen=True)
class StopResult:
    """Outcome of a stop: the URL that accepted it and its reply (JSON, or ``{"text": ...}``)."""

    url: str
    reply: Any


def _opt_number(data: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = data.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                f = float(v)  # an int beyond the float range (10**400 in JSON) raises here
            except OverflowError:
                continue
            if math.isfinite(f) and f >= 0:
                return f
    return None


def _check_task_id(value: Any, call: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise OnlineReplyError(call, "data.task_id", f"expected a string, got {type(value).__name__}")
    tid = str(value)
    # The task id becomes the evaluation run id (a directory name under the results root), so it is
    # checked before anything uses it.
    bad = (
        not tid
        or len(tid) > 255
        or tid.startswith("/")
        or any(seg in ("", ".", "..") for seg in tid.split("/"))
        or "\\" in tid
        # No control characters of any kind (C0, DEL, C1, bidi, zero-width): the id is printed.
        or escape_controls(tid) != tid
    )
    if bad:
        raise OnlineReplyError(call, "data.task_id", f"not a safe task id: {safe_text(repr(tid), limit=80)}")
    return tid


class OnlineClient:
    """Client of the online evaluation service.

    Args:
        base_url: the service's base URL (``https://...``; a path prefix is kept).
        token: the Bearer token (required by the service; never logged or shown).
        timeout: per-request time limit in seconds (never unlimited).
        ca_file: a PEM bundle of extra CAs to trust (TLS verification is always on).
        insecure_http: allow ``http://`` to a non-loopback host (the token travels in clear text).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        ca_file: str | None = None,
        insecure_http: bool = False,
    ) -> None:
        if not (timeout > 0):
            raise ValidationError(Violation("--timeout", "a positive number of seconds", repr(timeout)))
        parts = check_url(base_url, insecure_http=insecure_http, field="--base-url")
        self._origin, self._prefix = origin_and_path(parts)
        self.base_url = self._origin + self._prefix
        self.timeout = float(timeout)
        self.insecure_http = insecure_http
        self._token = token or None
        self._ca_file = ca_file
        self._transports: dict[str, HttpTransport] = {}

    def __repr__(self) -> str:
        return f"OnlineClient({self.base_url!r}, token={'***' if self._token else None})"

    # -- plumbing ---------------------------------------------------------------------------

    def _transport(self, origin: str) -> HttpTransport:
        t = self._transports.get(origin)
        if t is None:
            t = HttpTransport(origin, token=self._token, timeout=self.timeout, ca_file=self._ca_file)
            self._transports[origin] = t
        return t

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

    def _post(
        self,
        call: str,
        origin: str,
        path: str,
        body: Mapping[str, Any] | None,
        *,
        query: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes, str]:
        """POST JSON; return (status, body, content type). Transport failures become online errors."""
        limit = self.timeout if timeout is None else max(0.001, min(self.timeout, timeout))
        data = json.dumps(dict(body or {})).encode()
        try:
            resp = self._transport(origin).request(
                "POST",
                path,
                body=data,
                content_type="application/json",
                query=dict(query) if query else None,
                timeout=limit,
                route_name=call,
                raise_for_status=False,
            )
        except RequestTimeout as e:
            raise OnlineTimeout(call, limit) from e
        except ResponseTooLarge:
            raise  # the service answered (too much): not a connection failure
        except ConnectError as e:
            raise OnlineUnreachable(
                f"online service {call}: cannot reach {origin}: {self._redact(str(e))}",
                hint=e.hint,
            ) from e
        except TransportError as e:
            raise OnlineUnreachable(
                f"online service {call}: the connection to {origin} failed: {self._redact(str(e))}"
            ) from e
        if resp.status < 400:
            # Every status but the errors this client words itself is judged where every reply
            # is (the transport): a 1xx without a final reply, a redirect (never followed: the
            # request carries the token) raise HTTPStatusError saying what came.
            resp.raise_for_status()
        ctype = str(resp.headers.get("content-type", "") or "")
        return resp.status, resp.body, ctype

    def _envelope(self, call: str, status: int, body: bytes, ctype: str) -> dict[str, Any]:
        """Check an envelope reply; return ``data`` (``{}`` when absent)."""
        try:
            obj = reply_json(body) if body else None
        except (ValueError, UnicodeDecodeError):
            obj = None
            parsed = False
        else:
            parsed = obj is not None
        if status >= 400:
            text = ""
            if isinstance(obj, dict):
                text = str(obj.get("msg") or obj.get("detail") or obj.get("error") or "")
            text = self._redact(text) if text else self._snippet(body)
            cls = OnlineAuthError if status in (401, 403) else OnlineHTTPError
            hint = "check the token (--token, GMP_ONLINE_TOKEN or the config file)" if status in (401, 403) else None
            raise cls(call, status, text, hint=hint)
        if not parsed:
            raise OnlineReplyError(
                call,
                "body",
                f"not JSON (HTTP {status}, Content-Type {ctype or 'none'}): {self._snippet(body)!r}",
            )
        if not isinstance(obj, dict):
            raise OnlineReplyError(call, "body", f"expected a JSON object, got {type(obj).__name__}")
        if "code" not in obj:
            raise OnlineReplyError(call, "code", "missing from the envelope")
        code = obj["code"]
        if isinstance(code, bool) or not isinstance(code, (int, str)):
            raise OnlineReplyError(call, "code", f"expected an integer, got {type(code).__name__}")
        if code not in (0, "0"):
            msg = obj.get("msg")
            shown = code if isinstance(code, int) else self._redact(str(code))
            raise OnlineServiceError(call, shown, self._redact(str(msg)) if msg is not None else "")
        payload = obj.get("data")
        if payload is None:
            return {}
        if not isinstance(payload, dict):
            raise OnlineReplyError(call, "data", f"expected a JSON object, got {type(payload).__name__}")
        return payload

    # -- calls -----------------------------------------------------------------------------

    def create_task(self, **fields: Any) -> str:
        """Create a task (or re-register ``task_id``); return the task id the service assigned.

        Keyword args are the ``createTask`` body fields (:data:`CREATE_FIELDS`); ``None`` values are
        not sent.
        """
        unknown = sorted(set(fields) - set(CREATE_FIELDS))
        if unknown:
            raise ValidationError(Violation(unknown[0], "one of " + ", ".join(CREATE_FIELDS), "unknown field"))
        body = {k: v for k, v in fields.items() if v is not None}
        call = "createTask"
        data = self._envelope(call, *self._post(call, self._origin, self._prefix + CREATE_PATH, body))
        if "task_id" not in data:
            if "task_id" in body:
                # Re-registering a known task may answer without echoing the id.
                return _check_task_id(body["task_id"], call)
            raise OnlineReplyError(call, "data.task_id", "missing")
        return _check_task_id(data["task_id"], call)

    def ready(self, task_id: str, *, timeout: float | None = None) -> ReadyStatus:
        """Ask once whether ``task_id`` has an endpoint. ``timeout`` caps this request only."""
        call = "ready"
        data = self._envelope(
            call,
            *self._post(call, self._origin, self._prefix + READY_PATH, {"task_id": task_id}, timeout=timeout),
        )
        if "ready" not in data:
            raise OnlineReplyError(call, "data.ready", "missing")
        ready = data["ready"]
        if not isinstance(ready, bool):
            raise OnlineReplyError(call, "data.ready", f"expected true or false, got {ready!r}")
        endpoint = data.get("endpoint")
        if ready:
            if not isinstance(endpoint, str) or not endpoint.strip():
                raise OnlineReplyError(call, "data.endpoint", "missing although data.ready is true")
            try:
                check_url(endpoint, insecure_http=True, field="data.endpoint")
            except ValidationError as e:
                raise OnlineReplyError(call, "data.endpoint", f"not an http(s) URL: {self._redact(repr(endpoint))[:120]}") from e
            endpoint = endpoint.strip().rstrip("/")
        else:
            endpoint = None
        pos = _opt_number(data, "queue_position", "position", "rank")
        status = data.get("status")
        return ReadyStatus(
            task_id=task_id,
            ready=ready,
            endpoint=endpoint,
            queue_position=None if pos is None else int(pos),
            eta_s=_opt_number(data, "eta_s", "eta_seconds", "eta"),
            status=status if isinstance(status, str) else None,
            data=dict(data),
        )

    def wait_ready(
        self,
        task_id: str,
        *,
        deadline: float,
        interval: float = 5.0,
        on_poll: Callable[[PollEvent], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> ReadyStatus:
        """Poll ``ready`` until the task has an endpoint; return that status.

        The first poll happens at once; later ones wait ``interval`` seconds, growing by 1.5x per
        poll up to ``max(interval, 30)`` with +-20% jitter, so many clients do not poll in lockstep.
        Transient failures (timeouts, unreachable, HTTP 429/5xx) are reported through ``on_poll``
        and retried; a non-zero ``code``, a rejected token or a malformed reply raise at once.

        Raises:
            OnlineDeadlineError: ``deadline`` seconds passed without an endpoint.
        """
        if not (deadline > 0):
            raise ValidationError(Violation("--deadline", "a positive number of seconds", repr(deadline)))
        if not (interval > 0):
            raise ValidationError(Violation("--interval", "a positive number of seconds", repr(interval)))
        backoff = Backoff(
            initial=interval,
            factor=1.5,
            max_delay=max(interval, 30.0),
            jitter=0.2,
            rng=rng,
        )
        delays = iter(backoff)
        start = clock()
        polls = 0
        last_error: GenmanipOnlineError | None = None
        while True:
            remaining = deadline - (clock() - start)
            if remaining <= 0:
                raise self._deadline_error(task_id, deadline, polls, last_error)
            polls += 1
            status: ReadyStatus | None = None
            error: GenmanipOnlineError | None = None
            try:
                status = self.ready(task_id, timeout=remaining)
            except (OnlineTimeout, OnlineUnreachable) as e:
                error = e
            except OnlineHTTPError as e:
                if isinstance(e, OnlineAuthError) or not (e.status == 429 or e.status >= 500):
                    raise
                error = e
            if error is not None:
                last_error = error
                log.debug("ready poll %d failed: %s", polls, error)
            elapsed = clock() - start
            if status is not None and status.ready:
                if on_poll is not None:
                    on_poll(PollEvent(polls, elapsed, status, None, None))
                return status
            delay = next(delays)
            remaining = deadline - elapsed
            if remaining <= 0:
                if on_poll is not None:
                    on_poll(PollEvent(polls, elapsed, status, error, None))
                raise self._deadline_error(task_id, deadline, polls, last_error)
            delay = min(delay, remaining)
            if on_poll is not None:
                on_poll(PollEvent(polls, elapsed, status, error, delay))
            sleep(delay)

    @staticmethod
    def _deadline_error(
        task_id: str, deadline: float, polls: int, last_error: GenmanipOnlineError | None
    ) -> OnlineDeadlineError:
        hint = (
            f"the task is still registered: wait again with `gmp online submit --task-id {task_id} "
            f"--deadline SECONDS`"
        )
        err = OnlineDeadlineError(task_id, deadline, polls, hint=hint)
        if last_error is not None:
            err.__cause__ = last_error
        return err

    def stop(self, task_id: str, endpoint: str, *, user_id: str | None = None) -> StopResult:
        """Stop the evaluation of ``task_id`` on its assigned ``endpoint``.

        Tries the candidates of :func:`~genmanip_online.urls.stop_candidates` in order, moving on
        only after an HTTP 404. The reply shape is not documented: any 2xx counts as stopped, except
        an envelope with ``code != 0`` (raised as :class:`OnlineServiceError`).
        """
        check_url(endpoint, insecure_http=self.insecure_http, field="endpoint")
        query = {"run_id": task_id}
        if user_id:
            query["user_id"] = user_id
        candidates = stop_candidates(endpoint)
        last: OnlineHTTPError | None = None
        call = "stop"
        for url in candidates:
            parts = urlsplit(url)
            origin, _ = origin_and_path(parts)
            status, body, ctype = self._post(call, origin, parts.path or "/", None, query=query)
            if status == 404:
                last = OnlineHTTPError(call, 404, self._snippet(body))
                log.debug("stop: %s answered 404, trying the next candidate", url)
                continue
            try:
                obj: Any = reply_json(body) if body else {}
            except (ValueError, UnicodeDecodeError):
                obj = None
            if status >= 400 or (isinstance(obj, dict) and "code" in obj):
                self._envelope(call, status, body, ctype)
            if obj is None:
                obj = {"text": self._snippet(body)}
            return StopResult(url=url, reply=obj)
        assert last is not None
        raise last

    def close(self) -> None:
        """Close every connection (idempotent)."""
        for t in self._transports.values():
            t.close()
        self._transports.clear()

    def __enter__(self) -> OnlineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
