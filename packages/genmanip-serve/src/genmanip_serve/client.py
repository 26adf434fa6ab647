"""The ``ws://`` / ``wss://`` policy of ``gmp eval``: a batched policy whose model is a server.

``gmp eval --policy ws://HOST:PORT`` finds :func:`connect_policy` through the
``genmanip.policy_schemes`` entry points and calls it with the ``--policy-arg`` strings. The
result is a *batched* policy (:class:`RemotePolicy`): ``get_actions(batch)`` /
``get_action_chunks(batch)`` send every item of the batch on **its worker's own connection**
(one WebSocket per worker id, opened at the worker's first observation), all before reading any
reply, so the requests of one batch are in flight together and a ``gmp policy serve`` answers
them with one batched policy call; then it reads the replies, each by one overall deadline.

Two kinds of server:

* a gmp server (``gmp policy serve``): the observation travels as is (GenManip keys) with the
  worker's identity (``gmp/worker_id``, ``gmp/episode_id``, ``gmp/new_episode``, ``gmp/mode``),
  and the reply's ``gmp/actions`` are the policy's exact action dicts. A camera frame that arrived
  from the GenManip server as JPEG travels as those JPEG bytes (gmp's ``__jpeg__`` form, when the
  server's metadata lists ``"jpeg"`` in ``frames``; never decoded here), a raw frame as a uint8
  array; ``--policy-arg frames=raw`` sends every frame decoded. :attr:`RemotePolicy.prefers_jpeg`
  tells ``gmp eval`` that JPEG frames from the GenManip server are the cheaper choice;
* any openpi-compatible server, with ``--policy-arg keymap=PATH`` (:mod:`genmanip_serve.keymap`):
  only the mapped keys travel, renamed, and the reply's ``actions`` ``(horizon, dim)`` is split
  into GenManip action dicts.

Failures are :class:`~genmanip_serve.errors.RemotePolicyError` subclasses (all
:class:`genmanip_eval.PolicyError`): unreachable, refused key, timeout, a server that died or
closed the connection (never a hang: every wait has a deadline), an error frame, a malformed or
oversized reply, a wrong key map.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeGuard
from urllib.parse import urlsplit

from genmanip_eval.errors import PolicyError
from genmanip_eval.inference import BatchItem
from genmanip_protocol.codec import JpegFrame
from genmanip_runtime.config import resolve_token
from genmanip_runtime.netpolicy import check_plain_http, is_loopback_host
from genmanip_runtime.text import safe_text
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

from .errors import (
    PolicyServerAuthError,
    PolicyServerGone,
    PolicyServerRejected,
    PolicyServerTimeout,
    PolicyServerUnreachable,
    RemotePolicyError,
    WireError,
)
from .keymap import KeyMap, load_keymap
from .wire import decode_message, encode_message

__all__ = ["API_KEY_ENV", "DEFAULT_TIMEOUT_S", "RemotePolicy", "connect_policy"]

log = logging.getLogger("genmanip_serve.client")

#: Environment variable of the API key (client and server), else ``[policy] token`` in the config.
API_KEY_ENV = "GMP_POLICY_API_KEY"
#: Deadline of one batch's replies (s).
DEFAULT_TIMEOUT_S = 60.0
_DEFAULT_REPLY_BYTES = 16 * 1024 * 1024
_ARGS = ("keymap", "api_key", "timeout", "connect_timeout", "max_reply_mb", "ca_cert", "frames")
_FRAMES = ("auto", "raw")
_KINDS = ("invalid-request", "policy-failed", "server-closing")
#: The largest ``server_timing`` ``batch_size`` believed (with the server's advertised
#: ``max_batch``, when lower): no policy call batches more observations, so a larger number is a
#: broken or hostile server's, and it would skew the batch statistics ``gmp eval`` reports.
_BATCH_CEILING = 1 << 16


def _positive_int(value: Any) -> TypeGuard[int]:
    """``value`` is an int of at least 1 (not a bool: msgpack's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _float(name: str, value: str | float, low: float = 0.0) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise PolicyError(f"--policy-arg {name}={value!r}: not a number") from None
    if not f > low:
        raise PolicyError(f"--policy-arg {name}={value!r}: must be more than {low:g}")
    return f


class _Conn:
    __slots__ = ("metadata", "stack", "ws")

    def __init__(self, ws: ClientConnection, stack: contextlib.ExitStack, metadata: dict[str, Any]) -> None:
        self.ws = ws
        self.stack = stack  # websockets >= 17 wants connect() entered as a context manager
        self.metadata = metadata

    def close(self) -> None:
        self.stack.close()


class RemotePolicy:
    """A batched policy served by a policy server at ``url`` (see the module docstring).

    Args:
        url: ``ws://host:port[/path]`` or ``wss://...``.
        keymap: a parsed key map for an openpi server that does not speak GenManip keys.
        api_key: sent as ``Authorization: Api-Key <key>``.
        timeout: deadline (s) for the replies of one batch, from when its first request is sent.
        connect_timeout: deadline (s) of opening one connection and reading its metadata.
        max_reply_bytes: largest reply message accepted.
        ca_cert: CA bundle that signed a ``wss://`` server's certificate.
        frames: ``"auto"`` (JPEG frames travel as JPEG to a gmp server that takes them) or
            ``"raw"`` (every frame travels decoded, as a uint8 array).
        trusted_network: the caller vouches for the network between it and ``url`` (a Ray
            cluster's own, whose traffic is plain gRPC too): no environment proxy is used and no
            plain-text warning is logged for an API key over ``ws://`` to another host.

    The constructor opens one connection (kept for the first worker) to fail early: an
    unreachable server, a refused key or a server that is not gmp's without a key map raise here.

    Attributes:
        metadata: the server's metadata frame (a dict).
        last_timing: worker id -> the ``server_timing`` of its last reply, as the server sent it
            (unchecked: for display; :meth:`batch_size_of` is the checked batch size).
        concurrent_workers: True: calls for different workers may run at the same time, each on
            its own thread (every worker has its own connection). ``gmp eval`` then lets each
            worker's lane send its own observation as soon as it has one, and the policy server
            batches them: one batching, where the workers' timing is seen.
    """

    concurrent_workers = True

    def __init__(
        self,
        url: str,
        *,
        keymap: KeyMap | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = 10.0,
        max_reply_bytes: int = _DEFAULT_REPLY_BYTES,
        ca_cert: str | None = None,
        frames: str = "auto",
        trusted_network: bool = False,
    ) -> None:
        if frames not in _FRAMES:
            raise PolicyError(f"--policy-arg frames={frames!r}: expected one of {', '.join(_FRAMES)}")
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
            _ = parts.port
        except ValueError as exc:
            raise PolicyError(f"--policy {url!r}: not a valid URL: {exc}") from None
        if parts.scheme not in ("ws", "wss") or not host:
            raise PolicyError(f"--policy {url!r}: expected ws://HOST:PORT or wss://HOST:PORT")
        if parts.username or parts.password:
            raise PolicyError(f"--policy {parts.scheme}://{host}...: credentials do not go in the URL",
                              hint="pass --policy-arg api_key=KEY (or $GMP_POLICY_API_KEY)")
        self.url = url
        self.keymap = keymap
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_reply_bytes = int(max_reply_bytes)
        self._api_key = api_key
        if not trusted_network:
            check_plain_http(f"http{url[2:]}" if parts.scheme == "ws" else url, has_token=bool(api_key),
                             mode="warn", what="--policy")
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "wss":
            self._ssl = ssl.create_default_context(cafile=ca_cert) if ca_cert else ssl.create_default_context()
        self._proxy: Literal[True] | None = None if trusted_network or is_loopback_host(host) else True
        self._conns: dict[str, _Conn] = {}
        self._conns_lock = threading.Lock()  # the connection table (lanes call concurrently)
        self.last_timing: dict[str, dict[str, Any]] = {}
        #: worker id -> the batch size of its last reply, checked where the reply is parsed
        #: (None: the reply did not say, or said something no batch can be).
        self._batch_sizes: dict[str, int | None] = {}
        first = self._open("(probe)")
        self.metadata = first.metadata
        advertised = first.metadata.get("max_batch")
        self._batch_ceiling = (min(advertised, _BATCH_CEILING)
                               if _positive_int(advertised) else _BATCH_CEILING)
        self._spare: _Conn | None = first
        if keymap is None and first.metadata.get("server") != "genmanip-serve":
            self.close()
            raise RemotePolicyError(
                f"--policy {url}: the server is not a gmp policy server (its metadata names no "
                "'server': 'genmanip-serve'), so it does not understand GenManip observations",
                url=url,
                hint="for an openpi server pass --policy-arg keymap=PATH (see docs/policy-server.md)",
            )
        offered = first.metadata.get("frames")
        self._jpeg = (keymap is None and frames == "auto" and isinstance(offered, list)
                      and "jpeg" in offered)

    @property
    def prefers_jpeg(self) -> bool:
        """True when JPEG frames travel to the server as they are (a gmp server that takes them,
        no key map, ``frames=auto``): then the GenManip server's JPEG frames cost this process
        nothing to forward and the policy server's wire a small fraction of raw frames' bytes."""
        return self._jpeg

    # ------------------------------------------------------------------ connections

    def _open(self, worker: str) -> _Conn:
        headers = {"Authorization": f"Api-Key {self._api_key}"} if self._api_key else None
        stack = contextlib.ExitStack()
        try:
            ws = stack.enter_context(connect(
                self.url,
                compression=None,
                max_size=self.max_reply_bytes,
                additional_headers=headers,
                open_timeout=self.connect_timeout,
                ssl=self._ssl,
                proxy=self._proxy,
                user_agent_header="genmanip-serve client",
            ))
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = safe_text(bytes(exc.response.body or b""), limit=300).strip()
            cls = PolicyServerAuthError if status in (401, 403) else PolicyServerUnreachable
            raise cls(
                f"policy server {self.url} refused the connection (HTTP {status})"
                + (f": {body}" if body else ""),
                url=self.url,
                hint="pass the server's key with --policy-arg api_key=KEY or $GMP_POLICY_API_KEY"
                if status in (401, 403) else None,
            ) from None
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            raise PolicyServerUnreachable(
                f"cannot reach the policy server at {self.url}: {safe_text(reason, limit=200)}",
                url=self.url,
                hint="start one with: gmp policy serve --policy SPEC --port PORT",
            ) from None
        try:
            msg = ws.recv(timeout=self.connect_timeout)
        except (TimeoutError, ConnectionClosed) as exc:
            stack.close()
            raise PolicyServerUnreachable(
                f"policy server {self.url} sent no metadata frame after connecting "
                f"({type(exc).__name__})", url=self.url,
            ) from None
        if isinstance(msg, str):
            stack.close()
            raise PolicyServerRejected(
                f"policy server {self.url} answered the connection with an error: "
                f"{safe_text(msg, limit=300)}", detail=safe_text(msg, limit=2000), url=self.url,
            )
        try:
            meta = decode_message(msg, what="metadata frame")
        except WireError as exc:
            stack.close()
            raise RemotePolicyError(f"policy server {self.url}: {exc}", url=self.url) from None
        log.debug("connected to %s for worker %s", self.url, worker)
        return _Conn(ws, stack, meta)

    def _conn(self, worker: str) -> _Conn:
        with self._conns_lock:
            c = self._conns.get(worker)
            if c is not None:
                return c
            c, self._spare = self._spare, None
        if c is None:
            c = self._open(worker)  # (outside the lock: other workers' calls go on meanwhile)
        with self._conns_lock:
            self._conns[worker] = c
        return c

    def batch_size_of(self, worker_id: str) -> int | None:
        """How many observations the policy server's call for ``worker_id``'s last request held
        (its reply's ``server_timing``), None before one."""
        return self._batch_sizes.get(str(worker_id))

    def _drop(self, worker: str) -> None:
        self._batch_sizes.pop(worker, None)  # (its next connection has served no batch yet)
        with self._conns_lock:
            c = self._conns.pop(worker, None)
        if c is not None:
            c.close()

    # ------------------------------------------------------------------ the policy interface

    def get_actions(self, batch: Sequence[BatchItem]) -> list[dict[str, Any]]:
        """One action dict per item, in order (each from its worker's connection)."""
        return [chunk[0] for chunk in self._exchange(batch, "action")]

    def get_action_chunks(self, batch: Sequence[BatchItem]) -> list[list[dict[str, Any]]]:
        """One chunk (a list of action dicts) per item, in order."""
        return self._exchange(batch, "chunk")

    def drop(self, worker_id: str) -> None:
        """Close worker ``worker_id``'s connection (the server releases that worker's state); its
        next observation, if any, opens a new one."""
        self._drop(str(worker_id))

    def close(self) -> None:
        """Close every connection. Idempotent."""
        with self._conns_lock:
            conns = list(self._conns.values()) + ([self._spare] if self._spare is not None else [])
            self._conns.clear()
            self._spare = None
        for c in conns:
            try:
                c.close()
            except Exception as exc:  # closing must not mask the run's outcome
                log.debug("closing a connection to %s: %s", self.url, exc)

    # ------------------------------------------------------------------ internals

    def _body(self, item: BatchItem, mode: str) -> dict[str, Any]:
        obs = item.obs
        if self._jpeg:
            # Every camera that arrived as JPEG goes as its JPEG bytes (also when something here
            # decoded it since): nothing is decoded in this process.
            jpeg_frame = getattr(obs, "jpeg_frame", None)
            body = {}
            for k in obs.keys():
                frame = jpeg_frame(k) if callable(jpeg_frame) else None
                body[str(k)] = frame if isinstance(frame, JpegFrame) else obs[k]
        else:
            decode_all = getattr(obs, "decode_all", None)
            if callable(decode_all):
                decode_all()  # JPEG frames in parallel, not one by one while encoding
            if self.keymap is not None:
                return self.keymap.map_observation(obs)
            body = {str(k): v for k, v in obs.items()}
        body["gmp/worker_id"] = str(item.worker_id)
        body["gmp/episode_id"] = item.episode_id
        body["gmp/new_episode"] = bool(item.new_episode)
        body["gmp/mode"] = mode
        return body

    def _exchange(self, batch: Sequence[BatchItem], mode: str) -> list[list[dict[str, Any]]]:
        items = list(batch)
        workers = [str(it.worker_id) for it in items]
        if len(set(workers)) != len(workers):
            raise PolicyError("a batch holds two observations of one worker: one connection per "
                              "worker carries one request at a time")
        limit = self.metadata.get("max_message_bytes")
        payloads: list[bytes] = []
        for it, wid in zip(items, workers, strict=True):
            try:
                data = encode_message(self._body(it, mode), jpeg=self._jpeg)
            except WireError as exc:
                raise RemotePolicyError(f"worker {wid}: the observation cannot be sent: {exc}",
                                        url=self.url, worker_id=wid) from None
            if isinstance(limit, int) and len(data) > limit:
                raise RemotePolicyError(
                    f"worker {wid}: the request is {len(data)} bytes, over the policy server's "
                    f"limit of {limit} bytes", url=self.url, worker_id=wid,
                    hint="raise it with gmp policy serve --max-message-mb N",
                )
            payloads.append(data)
        deadline = time.monotonic() + self.timeout
        conns = [self._conn(wid) for wid in workers]
        for wid, c, data in zip(workers, conns, payloads, strict=True):
            try:
                c.ws.send(data)
            except ConnectionClosed as exc:
                self._drop(wid)
                raise self._gone(wid, exc, "sending its observation") from None
        out: list[list[dict[str, Any]]] = []
        for it, wid, c in zip(items, workers, conns, strict=True):
            left = deadline - time.monotonic()
            try:
                msg = c.ws.recv(timeout=max(0.0, left))
            except TimeoutError:
                for w in workers:  # replies still due would answer the next requests: start over
                    self._drop(w)
                raise PolicyServerTimeout(
                    f"policy server {self.url}: no reply for worker {wid} within {self.timeout:g} s",
                    timeout=self.timeout, url=self.url, worker_id=wid,
                    hint="raise the deadline with --policy-arg timeout=SECONDS",
                ) from None
            except ConnectionClosed as exc:
                self._drop(wid)
                raise self._gone(wid, exc, "waiting for its action") from None
            out.append(self._parse(it, wid, msg, mode))
        return out

    def _gone(self, wid: str, exc: ConnectionClosed, doing: str) -> PolicyServerGone:
        code = exc.rcvd.code if exc.rcvd is not None else None
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        if code == 1009:
            why = "the request was larger than the server accepts (close code 1009, message too big)"
        elif code is None:
            why = "the connection dropped (the server process died or the network failed)"
        else:
            why = f"close code {code}" + (f": {safe_text(reason, limit=200)}" if reason else "")
        return PolicyServerGone(
            f"policy server {self.url} closed worker {wid}'s connection while {doing}: {why}",
            code=code if code is not None else 1006, url=self.url, worker_id=wid,
        )

    def _parse(self, item: BatchItem, wid: str, msg: Any, mode: str) -> list[dict[str, Any]]:
        if isinstance(msg, str):
            text = safe_text(msg, limit=2000)
            kind = next((k for k in _KINDS if msg.startswith(k + ":")), "")
            detail = text[len(kind) + 1:].strip() if kind else text
            raise PolicyServerRejected(
                f"policy server {self.url} answered worker {wid}'s request with an error: "
                f"{safe_text(detail, limit=600)}",
                kind=kind, detail=detail, url=self.url, worker_id=wid,
            )
        try:
            reply = decode_message(msg, what="reply")
        except WireError as exc:
            raise RemotePolicyError(f"policy server {self.url}, worker {wid}: {exc}",
                                    url=self.url, worker_id=wid) from None
        timing = reply.get("server_timing")
        if isinstance(timing, dict):
            self.last_timing[wid] = timing
        # The wire's one check of the batch size (Inference.batch_size_of checks what any policy
        # reports): a bool, a string, a nested map or an impossible count says nothing.
        n = timing.get("batch_size") if isinstance(timing, dict) else None
        self._batch_sizes[wid] = n if _positive_int(n) and n <= self._batch_ceiling else None
        if self.keymap is not None:
            if "actions" not in reply:
                raise RemotePolicyError(f"policy server {self.url}: the reply for worker {wid} has no "
                                        "'actions'", url=self.url, worker_id=wid)
            chunk = self.keymap.split(reply["actions"], item.obs.get("robot_id"))
        else:
            got = reply.get("gmp/actions")
            if not isinstance(got, list) or not got or not all(isinstance(a, Mapping) for a in got):
                raise RemotePolicyError(
                    f"policy server {self.url}: the reply for worker {wid} has no 'gmp/actions' "
                    "list of action dicts", url=self.url, worker_id=wid,
                )
            chunk = [dict(a) for a in got]
        return chunk[:1] if mode == "action" else chunk


def connect_policy(url: str, **policy_args: str) -> RemotePolicy:
    """The ``genmanip.policy_schemes`` factory of ``ws://`` and ``wss://``.

    ``policy_args`` (strings, from ``--policy-arg``): ``keymap=PATH`` (a TOML key map, see
    :mod:`genmanip_serve.keymap`), ``api_key=KEY`` (else ``$GMP_POLICY_API_KEY``, else
    ``[policy] token`` of the config file), ``timeout=SECONDS`` (reply deadline, default 60),
    ``connect_timeout=SECONDS`` (default 10), ``max_reply_mb=N`` (default 16),
    ``ca_cert=PEM`` (wss only), ``frames=auto|raw`` (default auto: JPEG frames travel as JPEG to
    a gmp server that takes them).

    Raises:
        PolicyError: an unknown or malformed argument; a :class:`RemotePolicyError` subclass when
            the server cannot be used; :class:`KeyMapError` for a wrong key map.
    """
    unknown = sorted(set(policy_args) - set(_ARGS))
    if unknown:
        raise PolicyError(f"--policy {url}: unknown --policy-arg {', '.join(unknown)} "
                          f"(known: {', '.join(_ARGS)})")
    km = load_keymap(policy_args["keymap"]) if policy_args.get("keymap") else None
    key = resolve_token(policy_args.get("api_key"), API_KEY_ENV, "policy")
    return RemotePolicy(
        url,
        keymap=km,
        api_key=key,
        timeout=_float("timeout", policy_args.get("timeout", DEFAULT_TIMEOUT_S)),
        connect_timeout=_float("connect_timeout", policy_args.get("connect_timeout", 10.0)),
        max_reply_bytes=int(_float("max_reply_mb", policy_args.get("max_reply_mb", 16)) * 1024 * 1024),
        ca_cert=policy_args.get("ca_cert") or None,
        frames=policy_args.get("frames", "auto"),
    )
