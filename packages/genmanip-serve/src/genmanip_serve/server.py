"""``gmp policy serve``: one loaded policy served over WebSocket + msgpack to many clients.

The wire is openpi's policy-server protocol, so an ``openpi-client`` ``WebsocketClientPolicy``
works unchanged, and gmp's own client (:mod:`genmanip_serve.client`) adds a few fields:

* on connect the server sends one binary **metadata** frame (a msgpack map, :meth:`metadata`);
* then each binary request (an observation map, :mod:`genmanip_serve.wire`) gets exactly one
  reply: a binary map with ``actions`` (``(horizon, dim)`` float64: each action's ``action``
  values flattened, then its ``base_motion``) and ``server_timing`` (``infer_ms`` the batch's
  policy call, ``queue_ms`` the wait for the batch, ``batch_size``, ``batch_connections``,
  ``prev_total_ms`` the previous request's time in the server), or a **text frame** with the error
  (``"<kind>: <message>"``, kind ``invalid-request``, ``policy-failed`` or ``server-closing``);
  the connection and the server go on serving;
* a request carrying gmp's fields (``gmp/worker_id``, ``gmp/episode_id``, ``gmp/new_episode``,
  ``gmp/mode`` = ``"action"`` | ``"chunk"``) also gets ``gmp/actions``: the policy's exact
  action dicts (a list, one for ``"action"``), so nothing is lost by flattening;
* camera frames may travel as JPEG (gmp's ``__jpeg__`` form, :mod:`genmanip_serve.wire`) when the
  metadata's ``frames`` lists ``"jpeg"`` (it does when a JPEG decoder is installed): the policy
  gets them undecoded, as :class:`~genmanip_protocol.codec.JpegFrame` values of an
  :class:`~genmanip_protocol.Observation` that decodes each on first access, exactly what an
  in-process policy gets from the GenManip server's JPEG frames;
* ``GET /healthz`` answers ``ok``; ``GET /stats`` a JSON document of the batching so far
  (:meth:`PolicyServer.stats`).

Every connection is a participant (keyed by its number) of one
:class:`genmanip_eval.batcher.Batcher`: observations of all connected clients are served by the
same policy calls (``max_batch``, ``max_wait_s``; the batcher waits only for connections that are
due, judged from how long each usually stays away between its reply and its next request). A
connection is one worker: its worker id for the policy is ``"<gmp/worker_id>@<n>"`` (gmp clients)
or ``"conn<n>"`` (openpi clients), ``n`` the connection's number, so two clients' worker ``0``
never share a per-worker policy instance. When a connection closes, its worker ids are released
(:meth:`genmanip_eval.inference.Inference.drop`: a per-worker policy's instance is closed and
forgotten, a batched policy's ``drop(worker_id)`` is called), on the policy's thread just before
the next batch, so a long-lived server does not accumulate instances across reconnects.

Security defaults: the server binds 127.0.0.1; with an API key every route but ``/healthz``
requires ``Authorization: Api-Key <key>`` (compared in constant time; refused with HTTP 401 and
a message before the WebSocket handshake); permessage-deflate is off; a message larger than
``max_message_bytes`` closes the connection with code 1009; decoding is bounded (see
:mod:`genmanip_serve.wire`).
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import logging
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from genmanip_eval.batcher import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S, Batcher, BatcherClosed
from genmanip_eval.inference import BatchItem, Inference
from genmanip_protocol import Observation
from genmanip_protocol.codec.jpeg import jpeg_backend
from genmanip_protocol.errors import GenmanipError
from genmanip_runtime.text import safe_text
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from .__about__ import __version__
from .errors import ServeConfigError, WireError
from .wire import decode_message, encode_message

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "GMP_FIELDS",
    "PolicyServer",
    "ServeOptions",
    "serve_policy",
]

log = logging.getLogger("genmanip_serve.server")

#: Largest request by default (64 MiB: four 720x1280 frames are 11 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Request fields of gmp's client (every other key is the observation).
GMP_FIELDS = ("gmp/worker_id", "gmp/episode_id", "gmp/new_episode", "gmp/mode")
_MODES = ("action", "chunk")
_RECENT = 256
_POLL_S = 0.2


@dataclass(frozen=True)
class ServeOptions:
    """How :class:`PolicyServer` serves.

    Attributes:
        host: bind address (``127.0.0.1``: this machine only).
        port: TCP port (0: any free port; read :attr:`PolicyServer.port`).
        max_batch: largest batch of observations per policy call.
        max_wait_s: longest wait (s) for more observations once one waits and the policy is idle.
        api_key: required ``Authorization: Api-Key <key>`` (None: no authentication).
        max_message_bytes: largest request message (bytes); larger ones close the connection
            with code 1009.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = DEFAULT_MAX_BATCH
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    api_key: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class _Req:
    conn: int
    mode: str
    gmp: bool
    item: BatchItem


@dataclass
class _Stats:
    connections: int = 0
    connections_total: int = 0
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    batch_connections: Counter[int] = field(default_factory=Counter)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=_RECENT))


class PolicyServer:
    """Serve ``inference`` (one loaded policy) on ``options.host:options.port``.

    The socket is bound in the constructor; :meth:`serve_forever` serves until :meth:`close`
    (from another thread) or Ctrl-C. Use :func:`serve_policy` for a server in a background thread.

    Args:
        inference: the policy (:meth:`genmanip_eval.inference.Inference.create`).
        options: see :class:`ServeOptions`.
        policy: the ``--policy`` spec, reported in the metadata.
        on_policy_error: called with the exception of every request whose policy call failed,
            before its client gets the ``policy-failed`` text frame (which carries only the
            message): gmp's Ray replicas keep it, so that an eval actor re-raises the user's
            error with its hint and exit code.

    Raises:
        ServeConfigError: a bad option, or the address cannot be bound.
    """

    def __init__(
        self,
        inference: Inference,
        options: ServeOptions = ServeOptions(),
        *,
        policy: str = "",
        on_policy_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if options.max_message_bytes < 1024:
            raise ServeConfigError(f"max message size {options.max_message_bytes} bytes is too small")
        self.inference = inference
        self.options = options
        self.policy = policy or inference.name
        self._on_policy_error = on_policy_error
        self._stats = _Stats()
        self._lock = threading.Lock()
        self._conn_ids = itertools.count(1)
        self._stopping = threading.Event()
        # Worker ids of closed connections, released on the policy thread before the next batch.
        self._dropped: deque[str] = deque()
        #: Camera frames accepted as JPEG (gmp's ``__jpeg__`` form) only when they can be decoded.
        self.frames: tuple[str, ...] = ("raw", "jpeg") if jpeg_backend() else ("raw",)
        try:
            self._batcher: Batcher[tuple[list[dict[str, Any]], int]] = Batcher(
                self._call, max_batch=options.max_batch, max_wait_s=options.max_wait_s,
                name="gmp-policy-batcher",
            )
        except ValueError as exc:
            raise ServeConfigError(str(exc)) from None
        try:
            sock = socket.create_server((options.host, options.port), reuse_port=False)
        except OSError as exc:
            self._batcher.close()
            raise ServeConfigError(
                f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}",
                hint="pick another --port (0 = any free port)",
            ) from None
        self._server: Server = serve(
            self._handle,
            sock=sock,
            compression=None,
            max_size=options.max_message_bytes,
            process_request=self._process_request,
            server_header=f"genmanip-serve/{__version__}",
            logger=logging.getLogger("genmanip_serve.websockets"),
        )
        self.host, self.port = sock.getsockname()[:2]
        self._closed = False

    # ------------------------------------------------------------------ public

    @property
    def url(self) -> str:
        """``ws://host:port`` of the bound socket."""
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"ws://{host}:{self.port}"

    def metadata(self) -> dict[str, Any]:
        """The first frame every client receives (a msgpack map)."""
        return {
            "server": "genmanip-serve",
            "version": __version__,
            "gmp_protocol": 1,
            "policy": self.policy,
            "batched": self.inference.batched,
            "has_action": self.inference.has_action,
            "has_chunk": self.inference.has_chunk,
            "max_batch": self.options.max_batch,
            "max_wait_ms": self.options.max_wait_s * 1000,
            "max_message_bytes": self.options.max_message_bytes,
            "gmp_fields": list(GMP_FIELDS),
            "frames": list(self.frames),
        }

    def stats(self) -> dict[str, Any]:
        """JSON-ready counters: connections, requests, errors by kind, the batcher's counters
        (``batcher``: batches, items, mean batch, size histogram, mean queue/call ms), how many
        distinct connections shared each batch (``batch_connections`` histogram,
        ``max_batch_connections``) and the last batches (``recent``: size, connections)."""
        snap = self._batcher.snapshot().as_dict()
        with self._lock:
            s = self._stats
            return {
                "server": "genmanip-serve",
                "version": __version__,
                "policy": self.policy,
                "connections": s.connections,
                "connections_total": s.connections_total,
                "requests": s.requests,
                "errors": dict(s.errors),
                "batcher": snap,
                "batch_connections": {str(k): v for k, v in sorted(s.batch_connections.items())},
                "max_batch_connections": max(s.batch_connections, default=0),
                "recent": list(s.recent),
            }

    def serve_forever(self) -> None:
        """Accept connections until :meth:`close` (or an exception such as Ctrl-C)."""
        self._server.serve_forever()

    def close(self) -> None:
        """Stop: refuse new connections, end waiting requests (``server-closing``), close every
        connection and the batcher. Idempotent; the policy itself is not closed."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._batcher.close(timeout=5.0)
        self._server.shutdown()

    # ------------------------------------------------------------------ HTTP

    def _authorized(self, request: Request) -> str | None:
        key = self.options.api_key
        if not key:
            return None
        got = request.headers.get("Authorization")
        if got is None:
            return ("this policy server requires an API key: send the header "
                    "'Authorization: Api-Key <key>' (gmp: --policy-arg api_key=KEY)")
        if not hmac.compare_digest(got.encode("utf-8", "replace"), f"Api-Key {key}".encode()):
            return "the API key in the 'Authorization' header was refused"
        return None

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return connection.respond(200, "ok\n")
        refused = self._authorized(request)
        if refused is not None:
            with self._lock:
                self._stats.errors["auth"] += 1
            return connection.respond(401, refused + "\n")
        if path == "/stats":
            resp = connection.respond(200, json.dumps(self.stats()) + "\n")
            del resp.headers["Content-Type"]
            resp.headers["Content-Type"] = "application/json"
            return resp
        return None

    # ------------------------------------------------------------------ connections

    def _error(self, ws: ServerConnection, kind: str, message: str) -> None:
        with self._lock:
            self._stats.errors[kind] += 1
        log.info("connection %s: %s: %s", ws.id, kind, safe_text(message, limit=500))
        ws.send(f"{kind}: {message}")

    def _handle(self, ws: ServerConnection) -> None:
        conn = next(self._conn_ids)
        with self._lock:
            self._stats.connections += 1
            self._stats.connections_total += 1
        self._batcher.attach(conn)
        workers: set[str] = set()  # the worker ids this connection used (released at its end)
        state: dict[str, Any] = {"first": True, "episode": None, "workers": workers}
        try:
            ws.send(encode_message(self.metadata()))
            prev_total: float | None = None
            while not self._stopping.is_set():
                try:
                    msg = ws.recv()
                except ConnectionClosed:
                    return
                t0 = time.perf_counter()
                try:
                    req = self._parse(msg, conn, state)
                except WireError as exc:
                    self._error(ws, "invalid-request", str(exc))
                    continue
                with self._lock:
                    self._stats.requests += 1
                try:
                    outcome = self._wait(self._batcher.submit(req, conn))
                except BatcherClosed:
                    self._error(ws, "server-closing", "the policy server is shutting down")
                    return
                except GenmanipError as exc:
                    self._policy_failed(exc)
                    self._error(ws, "policy-failed", str(exc))
                    continue
                except Exception as exc:  # the policy's failure goes to its client
                    self._policy_failed(exc)
                    self._error(ws, "policy-failed", f"{type(exc).__name__}: {exc}")
                    continue
                timing: dict[str, Any] = {
                    "infer_ms": round(outcome.call_ms, 3),
                    "queue_ms": round(outcome.queue_ms, 3),
                    "batch_size": outcome.batch_size,
                    "batch_connections": outcome.value[1],
                }
                if prev_total is not None:
                    timing["prev_total_ms"] = round(prev_total, 3)
                try:
                    data = encode_message(self._reply(req, outcome.value[0], timing))
                except (WireError, GenmanipError) as exc:
                    self._error(ws, "policy-failed", f"the policy's reply cannot be sent: {exc}")
                    continue
                ws.send(data)
                prev_total = (time.perf_counter() - t0) * 1000
        except ConnectionClosed:
            return
        finally:
            self._batcher.detach(conn)
            self._dropped.extend(sorted(workers))
            with self._lock:
                self._stats.connections -= 1

    def _policy_failed(self, exc: BaseException) -> None:
        if self._on_policy_error is None:
            return
        try:
            self._on_policy_error(exc)
        except Exception as hook_exc:  # the client still gets its error frame
            log.warning("on_policy_error raised %s: %s", type(hook_exc).__name__, hook_exc)

    def _wait(self, fut: Any) -> Any:
        while True:
            try:
                return fut.result(timeout=_POLL_S)
            except FutureTimeout:
                if self._stopping.is_set():
                    raise BatcherClosed("the policy server is shutting down") from None

    def _parse(self, msg: Any, conn: int, state: dict[str, Any]) -> _Req:
        if isinstance(msg, str):
            raise WireError("a text frame: requests are binary msgpack maps (openpi msgpack-numpy)")
        body = decode_message(msg, what="request", jpeg="jpeg" in self.frames)
        gmp = any(k.startswith("gmp/") for k in body)
        for k in body:
            if k.startswith("gmp/") and k not in GMP_FIELDS:
                raise WireError(f"field {k!r}: unknown gmp field (known: {', '.join(GMP_FIELDS)})", field=k)
        wid = body.pop("gmp/worker_id", None)
        if wid is not None and (not isinstance(wid, str) or not wid or len(wid) > 200):
            raise WireError("field 'gmp/worker_id': expected a non-empty string", field="gmp/worker_id")
        episode = body.pop("gmp/episode_id", None)
        if episode is not None and not isinstance(episode, str):
            raise WireError("field 'gmp/episode_id': expected a string or nil", field="gmp/episode_id")
        new = body.pop("gmp/new_episode", None)
        if new is not None and type(new) is not bool:
            raise WireError("field 'gmp/new_episode': expected true or false", field="gmp/new_episode")
        mode = body.pop("gmp/mode", None)
        if mode is None:
            mode = "chunk" if self.inference.has_chunk else "action"
        elif mode not in _MODES:
            raise WireError(f"field 'gmp/mode': expected 'action' or 'chunk', got {str(mode)[:40]!r}",
                            field="gmp/mode")
        if episode is None and body.get("episode_id") is not None:
            episode = str(body["episode_id"])
        if new is None:
            new = bool(state["first"] or episode != state["episode"])
        state["first"] = False
        state["episode"] = episode
        obs: Any = body
        if any(k.startswith(("video.", "state.")) for k in body):
            obs = Observation(body)
        worker = f"{wid}@{conn}" if wid is not None else f"conn{conn}"
        state["workers"].add(worker)
        return _Req(conn, mode, gmp, BatchItem(worker, episode, obs, new_episode=new))

    # ------------------------------------------------------------------ the policy thread

    def _release(self) -> None:
        """Drop the worker ids of closed connections (on the policy thread, like every call)."""
        while self._dropped:
            worker = self._dropped.popleft()
            try:
                self.inference.drop(worker)
            except Exception as exc:  # a failing release must not fail the next batch
                log.warning("releasing worker %s: %s: %s", worker, type(exc).__name__,
                            safe_text(str(exc), limit=300))

    def _call(self, reqs: list[_Req]) -> list[tuple[list[dict[str, Any]], int]]:
        inf = self.inference
        self._release()
        out: list[list[dict[str, Any]] | None] = [None] * len(reqs)
        for mode in _MODES:
            idx = [i for i, r in enumerate(reqs) if r.mode == mode]
            if not idx:
                continue
            items = [reqs[i].item for i in idx]
            if (mode == "chunk" and inf.has_chunk) or (mode == "action" and not inf.has_action):
                chunks = inf.chunks(items)
                res = [c[:1] for c in chunks] if mode == "action" else chunks
            else:
                res = [[a] for a in inf.actions(items)]
            for i, r in zip(idx, res, strict=True):
                out[i] = r
        conns = len({r.conn for r in reqs})
        with self._lock:
            self._stats.batch_connections[conns] += 1
            self._stats.recent.append({"size": len(reqs), "connections": conns,
                                       "workers": [r.item.worker_id for r in reqs]})
        return [(r if r is not None else [], conns) for r in out]

    def _reply(self, req: _Req, chunk: Sequence[Mapping[str, Any]], timing: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"server_timing": timing}
        flat = _flatten(chunk)
        if flat is not None:
            reply["actions"] = flat
        elif not req.gmp:
            raise WireError("the policy's actions have different lengths: no (horizon, dim) array")
        if req.gmp:
            reply["gmp/actions"] = list(chunk)
            reply["gmp/mode"] = req.mode
        return reply


def _leaves(x: Any, out: list[float]) -> None:
    if isinstance(x, np.ndarray):
        out.extend(float(v) for v in x.reshape(-1).tolist())
    elif isinstance(x, (list, tuple)):
        for v in x:
            _leaves(v, out)
    elif isinstance(x, (int, float, np.number)) and not isinstance(x, bool):
        out.append(float(x))


def _flatten(chunk: Sequence[Mapping[str, Any]]) -> np.ndarray | None:
    """``(horizon, dim)``: each action's ``action`` values, then its ``base_motion``; None when
    the rows differ in length."""
    rows: list[list[float]] = []
    for a in chunk:
        row: list[float] = []
        _leaves(a.get("action"), row)
        _leaves(a.get("base_motion", ()), row)
        rows.append(row)
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        return None
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(rows[0]))


@contextlib.contextmanager
def serve_policy(
    policy: str | Inference,
    args: Mapping[str, str] | None = None,
    *,
    options: ServeOptions = ServeOptions(port=0),
) -> Iterator[PolicyServer]:
    """A :class:`PolicyServer` serving ``policy`` (a ``--policy`` spec or an :class:`Inference`)
    in a background thread; closed, with its policy, when the block ends. Port 0 by default."""
    inference = policy if isinstance(policy, Inference) else Inference.create(policy, args)
    try:
        server = PolicyServer(inference, options, policy=policy if isinstance(policy, str) else "")
        thread = threading.Thread(target=server.serve_forever, name="gmp-policy-server", daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.close()
            thread.join(timeout=10)
    finally:
        inference.close()
