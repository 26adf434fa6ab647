"""The HTTP layer: the real server's eval routes (both wires), auth, timing, faults, access log.

Every eval-route reply carries ``X-Genmanip-Server-Ms`` (time from the request reaching the app to
the response start). Pickle bodies are only ever read through the allow-list
(:class:`genmanip_protocol.codec.LegacyCodec`).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
import pickle
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from genmanip_protocol.codec import (
    LEGACY_CONTENT_TYPE,
    MSGPACK_CONTENT_TYPE,
    Codec,
    JpegFrame,
    LegacyCodec,
    MsgpackCodec,
)
from genmanip_protocol.errors import DecodeError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .__about__ import __version__
from .core import EvalCore, RemoteTaskError

if TYPE_CHECKING:
    from .server import LocalServer

__all__ = ["EVAL_ROUTES", "build_asgi_app"]

log = logging.getLogger("genmanip_testbed.app")
access_log = logging.getLogger("genmanip_testbed.access")


#: Route names (path without the slash) of the evaluation server.
EVAL_ROUTES = (
    "docs",
    "openapi.json",
    "protocol",
    "status",
    "start_new_job",
    "create_workers",
    "reset",
    "reset_result",
    "step",
    "step_chunk",
    "kill",
)
#: Request bodies (actions) are tiny; refuse to decode anything bigger than this.
_MAX_REQUEST = 64 * 1024 * 1024
_CHUNK_STR_ERRORS = (
    AttributeError,
    EOFError,
    RuntimeError,
    TypeError,
    ValueError,
    pickle.PickleError,
)
_TRUE = ("1", "true", "yes")


class _HttpError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _detail(e: BaseException) -> str:
    if isinstance(e, RemoteTaskError):
        return e.detail()
    return f"{type(e).__name__}: {e}"


def _json_error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


class _Wire:
    """Encodes replies for one request's codec and frame mode."""

    def __init__(
        self, codec: Codec, frames: str, core: EvalCore, pool: ThreadPoolExecutor | None = None
    ) -> None:
        self.codec = codec
        self.frames = frames
        self.core = core
        self.pool = pool

    def _encode_jpeg(self, arr: np.ndarray) -> JpegFrame:
        """Encode a frame the cache does not hold encoded, and keep its encoding there."""
        jf = JpegFrame.encode(arr, quality=85)
        self.core.cache.put_jpeg(arr, jf)
        return jf

    def entries(self, entries: dict[str, Any]) -> dict[str, Any]:
        if self.frames != "jpeg":
            return entries
        todo: list[tuple[dict[str, Any], str, np.ndarray]] = []
        out: dict[str, Any] = {}
        for wid, entry in entries.items():
            obs = entry.get("obs") if isinstance(entry, dict) else None
            if isinstance(obs, dict) and any(k.startswith("video.") for k in obs):
                obs = dict(obs)
                entry = {**entry, "obs": obs}  # noqa: PLW2901 - a shallow copy replaces the original
                for k, v in obs.items():
                    if k.startswith("video.") and isinstance(v, np.ndarray):
                        todo.append((obs, k, v))
            out[wid] = entry
        # Frames the cache already holds encoded cost nothing: only the others go to the pool
        # (a still scene, a policy holding its pose, would pay a thread hop per camera for nothing).
        fresh: list[tuple[dict[str, Any], str, np.ndarray]] = []
        for obs, k, v in todo:
            cached = self.core.cache.jpeg(v)
            if isinstance(cached, JpegFrame):
                obs[k] = cached
            else:
                fresh.append((obs, k, v))
        if len(fresh) > 1 and self.pool is not None:
            # simplejpeg releases the GIL: encode the cameras side by side.
            for (obs, k, _), jf in zip(
                fresh, self.pool.map(lambda t: self._encode_jpeg(t[2]), fresh), strict=True
            ):
                obs[k] = jf
        else:
            for obs, k, v in fresh:
                obs[k] = self._encode_jpeg(v)
        return out

    def encode(self, obj: Any) -> list[bytes | memoryview]:
        """The reply body as parts (msgpack: header + zero-copy array views; legacy: one pickle)."""
        return self.codec.encode_parts(obj)


class _PartsResponse(Response):
    """A 200 reply whose body is sent part by part (no join: the array buffers go out as they are)."""

    def __init__(self, parts: list[bytes | memoryview], media_type: str) -> None:
        self.parts = [p for p in parts if memoryview(p).nbytes]
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.body = b""
        total = sum(memoryview(p).nbytes for p in self.parts)
        self.raw_headers = [
            (b"content-type", media_type.encode()),
            (b"content-length", str(total).encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        if not self.parts:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        for i, part in enumerate(self.parts):
            await send(
                {"type": "http.response.body", "body": part, "more_body": i < len(self.parts) - 1}
            )


class _Handlers:
    """Route handlers bound to one :class:`LocalServer`."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server

    # --- helpers -----------------------------------------------------------------------------------
    def core(self, request: Request) -> EvalCore:
        task_id = request.path_params.get("task_id")
        if task_id is None:
            return self.server.core
        core = self.server.online_core(task_id)
        if core is None:
            raise _HttpError(404, f"Unknown online task {task_id!r}")
        return core

    def wire(self, request: Request, core: EvalCore) -> _Wire:
        mode = self.server.options.wire
        ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        codec: Codec
        if mode == "legacy":
            codec = LegacyCodec(max_size=_MAX_REQUEST)
        elif mode == "msgpack":
            if ctype == LEGACY_CONTENT_TYPE:
                raise _HttpError(
                    415,
                    f"This testbed serves the msgpack wire only: send Content-Type {MSGPACK_CONTENT_TYPE}",
                )
            codec = MsgpackCodec(max_size=_MAX_REQUEST)
        else:
            codec = (
                MsgpackCodec(max_size=_MAX_REQUEST)
                if ctype == MSGPACK_CONTENT_TYPE
                else LegacyCodec(max_size=_MAX_REQUEST)
            )
        pool = self.server.jpeg_pool
        if codec.name == "legacy":
            return _Wire(codec, "jpeg", core, pool)
        frames = request.headers.get("x-genmanip-frames", "raw").strip().lower() or "raw"
        if frames not in ("raw", "jpeg"):
            raise _HttpError(400, f"X-Genmanip-Frames must be raw or jpeg, got {frames!r}")
        return _Wire(codec, frames, core, pool)

    @staticmethod
    def _decode(wire: _Wire, body: bytes, what: str) -> Any:
        try:
            return wire.codec.decode(body)
        except DecodeError as e:
            kind = "pickle" if wire.codec.name == "legacy" else "msgpack"
            raise _HttpError(400, f"Invalid {kind} in {what} body: {e}") from None

    @staticmethod
    def _reply(wire: _Wire, payload: list[bytes | memoryview]) -> _PartsResponse:
        return _PartsResponse(payload, wire.codec.content_type)

    @staticmethod
    async def _json_body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _HttpError(500, f"JSONDecodeError: {e}") from None
        except UnicodeDecodeError as e:
            raise _HttpError(500, f"UnicodeDecodeError: {e}") from None
        if not isinstance(data, dict):
            raise _HttpError(400, "Request body must be a JSON object")
        return data

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except _HttpError:
            raise
        except Exception as e:
            raise _HttpError(500, _detail(e)) from e

    # --- GET routes -------------------------------------------------------------------------------
    async def docs(self, request: Request) -> Response:
        rows = "".join(
            f"<tr><td><code>{html.escape(m)}</code></td><td><code>/{html.escape(r)}</code></td>"
            f"<td>{html.escape(d)}</td></tr>"
            for m, r, d in _ROUTE_DOCS
        )
        body = (
            "<!doctype html><html><head><meta charset='utf-8'><title>GenManip testbed</title></head>"
            f"<body><h1>GenManip testbed {html.escape(__version__)}</h1>"
            f"<p>robot <code>{html.escape(self.server.core.robot.robot_id)}</code>, wire "
            f"<code>{html.escape(self.server.options.wire)}</code></p>"
            f"<table><tr><th>method</th><th>route</th><th>what</th></tr>{rows}</table></body></html>"
        )
        return HTMLResponse(body)

    async def openapi(self, request: Request) -> Response:
        paths: dict[str, Any] = {}
        for method, route, desc in _ROUTE_DOCS:
            paths.setdefault(f"/{route}", {})[method.lower()] = {
                "summary": desc,
                "responses": {"200": {"description": "OK"}},
            }
        return JSONResponse(
            {
                "openapi": "3.1.0",
                "info": {"title": "GenManip testbed", "version": __version__},
                "paths": paths,
            }
        )

    async def protocol(self, request: Request) -> Response:
        mode = self.server.options.wire
        codecs = ["msgpack", "legacy"] if mode == "both" else [mode]
        return JSONResponse(
            {
                "server": "genmanip-testbed",
                # a local stand-in, not a real GenManip server: gmp eval runs its zero policy
                # here without --policy (and nowhere else)
                "testbed": True,
                "version": __version__,
                "protocol_versions": [1],
                "codecs": codecs,
                "frames": ["raw", "jpeg"],
                "robot_id": self.server.core.robot.robot_id,
                "auth": self.server.options.token is not None,
            }
        )

    async def status(self, request: Request) -> Response:
        core = self.core(request)
        refresh = request.query_params.get("refresh", "").strip().lower() in _TRUE
        data = await self._run(core.status, refresh)
        return JSONResponse({"data": data})

    # --- JSON POST routes -----------------------------------------------------------------------------
    async def start_new_job(self, request: Request) -> Response:
        core = self.core(request)
        body = await self._json_body(request)
        data = body.get("data")
        if not isinstance(data, dict) or "config_path" not in data:
            raise _HttpError(400, "Request body must contain data.config_path")
        paths = data["config_path"]
        if not isinstance(paths, list) or not paths:
            raise _HttpError(400, "config_path must be a non-empty list of strings")
        if any(not isinstance(p, str) or not p.strip() for p in paths):
            raise _HttpError(400, "config_path must contain non-empty strings only")
        run_id = data.get("run_id")
        if run_id is not None and not isinstance(run_id, str):
            raise _HttpError(400, "run_id must be a string when provided")
        await self._run(core.start_new_job, paths, run_id)
        return JSONResponse({"data": {"success": True}})

    async def _worker_ids(self, request: Request) -> list[Any]:
        body = await self._json_body(request)
        data = body.get("data")
        if not isinstance(data, dict) or "worker_ids" not in data:
            raise _HttpError(400, "Request body must contain data.worker_ids")
        ids = data["worker_ids"]
        if not isinstance(ids, list):
            raise _HttpError(500, "ValueError: worker_ids must be a list")
        return ids

    async def create_workers(self, request: Request) -> Response:
        core = self.core(request)
        ids = await self._worker_ids(request)
        await self._run(core.create_workers, ids)
        return JSONResponse({"data": {"success": True}})

    async def kill(self, request: Request) -> Response:
        core = self.core(request)
        ids = await self._worker_ids(request)
        await self._run(core.kill, ids)  # ids as sent, like the real /kill
        return JSONResponse({"data": {"success": True}})

    # --- pickle / msgpack routes ----------------------------------------------------------------------
    async def _reset_like(
        self, request: Request, fn_name: str, what: str, shape_msg: str
    ) -> Response:
        core = self.core(request)
        wire = self.wire(request, core)
        body = await request.body()
        ids = None
        if body:
            obj = self._decode(wire, body, what)
            if not isinstance(obj, dict):
                raise _HttpError(400, shape_msg)
            ids = obj.get("worker_ids")
        resp = await self._run(getattr(core, fn_name), ids)
        payload = await run_in_threadpool(lambda: wire.encode(wire.entries(resp)))
        return self._reply(wire, payload)

    async def reset(self, request: Request) -> Response:
        return await self._reset_like(request, "reset", "reset", "Reset body must decode to a dict")

    async def reset_result(self, request: Request) -> Response:
        return await self._reset_like(
            request, "reset_result", "reset_result", "Reset result body must decode to a dict"
        )

    async def step(self, request: Request) -> Response:
        core = self.core(request)
        wire = self.wire(request, core)
        actions = self._decode(wire, await request.body(), "request")

        def work() -> list[bytes | memoryview]:
            return wire.encode(wire.entries(core.step(actions)))

        payload = await self._run(work)
        return self._reply(wire, payload)

    async def step_chunk(self, request: Request) -> Response:
        core = self.core(request)
        wire = self.wire(request, core)
        chunk = self._decode(wire, await request.body(), "request")
        if not isinstance(chunk, list):
            raise _HttpError(400, "action_chunk must be a list[action_dict]")
        q = request.query_params
        mode = q.get("render_mode", "lite")
        mode = mode if mode in ("lite", "always") else "lite"

        def _int(name: str, default: int) -> int:
            try:
                return int(q.get(name, default))
            except (TypeError, ValueError):
                return default

        subframes, suffix = _int("subframes", 2), _int("render_suffix", 2)

        def work() -> list[bytes | memoryview]:
            resp = core.step_chunk(
                chunk, render_mode=mode, subframes=subframes, render_suffix=suffix
            )
            resp = {**resp, "obs": wire.entries(resp["obs"])}
            return wire.encode(resp)

        try:
            payload = await run_in_threadpool(work)
        except Exception as e:
            if isinstance(e, RemoteTaskError) and isinstance(e.cause, _CHUNK_STR_ERRORS):
                raise _HttpError(500, str(e)) from e
            if isinstance(e, _CHUNK_STR_ERRORS) and not isinstance(e, RemoteTaskError):
                raise _HttpError(500, str(e)) from e
            return PlainTextResponse("Internal Server Error", status_code=500)
        return self._reply(wire, payload)


_ROUTE_DOCS = [
    ("GET", "docs", "this page (liveness check)"),
    ("GET", "openapi.json", "route list"),
    ("GET", "protocol", "capabilities: codecs, frame modes, robot, auth (testbed only)"),
    ("GET", "status", "job status; ?refresh=1 rescans the results directory"),
    ("POST", "start_new_job", "JSON {data: {config_path: [...], run_id}}"),
    ("POST", "create_workers", "JSON {data: {worker_ids: [...]}}"),
    ("POST", "reset", "pickle/msgpack {worker_ids: [...]}; empty body = all workers"),
    ("POST", "reset_result", "pickle/msgpack {worker_ids: [...]}; destructive read"),
    ("POST", "step", "pickle/msgpack {worker_id: action_dict}"),
    (
        "POST",
        "step_chunk",
        "pickle/msgpack [{worker_id: action_dict}, ...]; ?render_mode=&subframes=&render_suffix=",
    ),
    ("POST", "kill", "JSON {data: {worker_ids: [...]}}"),
]


def _wrap(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except _HttpError as e:
            return _json_error(e.status, e.detail)
        except ClientDisconnect:
            # The client went away mid-request (killed, timed out): nobody reads a reply, and
            # it is not a server error worth a traceback in the log.
            log.info(
                "%s %s: the client disconnected before its request was read",
                request.method,
                request.url.path,
            )
            return Response(status_code=499)

    endpoint.__name__ = getattr(fn, "__name__", "endpoint")
    return endpoint


def eval_routes(h: _Handlers) -> list[Route]:
    """The evaluation server's routes bound to handlers ``h``."""
    return [
        Route("/docs", _wrap(h.docs), methods=["GET"]),
        Route("/openapi.json", _wrap(h.openapi), methods=["GET"]),
        Route("/protocol", _wrap(h.protocol), methods=["GET"]),
        Route("/status", _wrap(h.status), methods=["GET"]),
        Route("/start_new_job", _wrap(h.start_new_job), methods=["POST"]),
        Route("/create_workers", _wrap(h.create_workers), methods=["POST"]),
        Route("/reset", _wrap(h.reset), methods=["POST"]),
        Route("/reset_result", _wrap(h.reset_result), methods=["POST"]),
        Route("/step", _wrap(h.step), methods=["POST"]),
        Route("/step_chunk", _wrap(h.step_chunk), methods=["POST"]),
        Route("/kill", _wrap(h.kill), methods=["POST"]),
    ]


# ============================================================================== middlewares ====
def _route_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _is_eval_path(path: str) -> bool:
    if path.startswith("/online/"):
        return True
    return _route_name(path) in EVAL_ROUTES and path.count("/") == 1


class _Outer:
    """Access log, per-route counters and the server-timing header (outermost middleware)."""

    def __init__(self, app: ASGIApp, server: LocalServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope.get("path", "")
        state: dict[str, Any] = {"status": 0, "bytes": 0}
        timed = _is_eval_path(path)
        stats = self.server.stats
        # Counted before the reply goes out: a client that has its answer must find its request
        # (and the status) in the stats, or tests reading them race the access log.
        stats.add("requests", path)

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                stats.add("statuses", message["status"])
                if timed:
                    ms = (time.perf_counter() - t0) * 1000.0
                    headers = list(message.get("headers", []))
                    headers.append((b"x-genmanip-server-ms", f"{ms:.3f}".encode()))
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                state["bytes"] += memoryview(message.get("body", b"")).nbytes
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            access_log.info(
                "%s %s %s %.1fms %dB",
                scope.get("method", "?"),
                path,
                state["status"] or "-",
                (time.perf_counter() - t0) * 1000.0,
                state["bytes"],
            )


class _Auth:
    """Bearer-token check (constant-time). ``/docs`` and the leaderboard routes are open."""

    def __init__(self, app: ASGIApp, server: LocalServer) -> None:
        self.app = app
        self.server = server

    def _required(self, path: str) -> str | None:
        opts = self.server.options
        if path == "/docs" or path.startswith("/api/upload") or path.startswith("/upload_status"):
            return None
        if path.startswith("/api/v1/benchmark/onlineEvaluation") or path.startswith("/online/"):
            return opts.online_token
        return opts.token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            need = self._required(scope.get("path", ""))
            if need is not None:
                got = b""
                for k, v in scope.get("headers", []):
                    if k == b"authorization":
                        got = v
                        break
                scheme, _, token = got.partition(b" ")
                if scheme.lower() != b"bearer" or not token:
                    await JSONResponse(
                        {"detail": "Not authenticated: send Authorization: Bearer <token>"},
                        status_code=401,
                        headers={"WWW-Authenticate": "Bearer"},
                    )(scope, receive, send)
                    return
                if not hmac.compare_digest(token.strip(), need.encode()):
                    await JSONResponse(
                        {"detail": "Invalid token"},
                        status_code=401,
                        headers={"WWW-Authenticate": "Bearer"},
                    )(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _abort_connection(receive: Receive) -> bool:
    """Reset the TCP connection under this request (RST, no reply). False if not possible."""
    cycle = getattr(receive, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        return False
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()
    return True


class _Faults:
    """Injects the configured faults into eval routes (see :mod:`genmanip_testbed.faults`).

    ``latency`` is the server's time per request, its own work included: the work is done when
    the request arrives and the reply leaves ``latency`` after that, as the real server's
    workers compute in parallel (~48 ms an action). Sleeping first and working after added the
    testbed's own work, serialized under its GIL, to every request of a burst: four simultaneous
    ``/step`` replies came 3 to 12 ms late. A request that gets no work (an error, a reset
    before) gets its failure at the same time.
    """

    def __init__(self, app: ASGIApp, server: LocalServer) -> None:
        self.app = app
        self.server = server

    async def _until(self, due: float) -> bool:
        """Sleep until ``due`` (monotonic); False if the server began shutting down meanwhile."""
        stopping = self.server.stopping
        while not stopping.is_set():
            left = due - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, 0.05))
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not _is_eval_path(path):
            await self.app(scope, receive, send)
            return
        due = time.monotonic()
        d = self.server.faults.decide(_route_name(path))
        stats = self.server.stats
        if d.latency_s:
            stats.add("faults", "latency")
            due += d.latency_s
        if d.error is not None or d.reset_before:
            if not await self._until(due):
                await _json_error(503, "Service Unavailable (the testbed is shutting down)")(
                    scope, receive, send
                )
                return
        if d.error is not None:
            stats.add("faults", f"error_{d.error}")
            text = {
                500: "Internal Server Error",
                502: "Bad Gateway",
                503: "Service Unavailable",
                504: f"{_route_name(path).replace('_', ' ').capitalize()} timed out after 600s",
            }[d.error]
            await JSONResponse({"detail": f"{text} (injected fault)"}, status_code=d.error)(
                scope, receive, send
            )
            return
        if d.reset_before and _abort_connection(receive):
            stats.add("faults", "reset_before")
            await asyncio.sleep(0.01)
            return
        if (
            d.reset_after
            and getattr(getattr(receive, "__self__", None), "transport", None) is not None
        ):

            async def swallow(message: Message) -> None:
                return None

            # The work is done, then the connection dies before any byte of the reply.
            await self.app(scope, receive, swallow)
            await self._until(due)
            _abort_connection(receive)
            stats.add("faults", "reset_after")
            await asyncio.sleep(0.01)
            return
        if not d.latency_s:
            await self.app(scope, receive, send)
            return

        async def held(message: Message) -> None:
            if message["type"] == "http.response.start":
                # (shutting down: the work is done, so its reply goes now rather than a 503)
                await self._until(due)
            await send(message)

        await self.app(scope, receive, held)


def build_asgi_app(
    server: LocalServer,
    extra_routes: list[Any] | None = None,
    online_routes: list[Any] | None = None,
) -> ASGIApp:
    """The full ASGI application of a :class:`LocalServer` (eval routes, online mount, extras)."""
    h = _Handlers(server)
    routes: list[Any] = eval_routes(h)
    online = eval_routes(h) + list(online_routes or [])
    routes.append(Mount("/online/{task_id}", routes=online))
    routes.extend(extra_routes or [])

    async def http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's shape for unknown routes and wrong methods: {"detail": "Not Found"}.
        code = int(getattr(exc, "status_code", 500))
        return JSONResponse(
            {"detail": str(getattr(exc, "detail", "Internal Server Error"))}, status_code=code
        )

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    return _Outer(_Auth(_Faults(app, server), server), server)
