"""The results browser: a Starlette app and a small uvicorn runner.

Routes (all GET):

* ``/`` runs; ``/run/{key}`` one run (``?failures=1``, ``?compare=<key>``);
  ``/episode/{key}/{task}/{seed}`` one episode with the Rerun viewer;
* ``/files/{key}/{task}/{seed}`` the episode directory's files, ``/file/{key}/{name}/{task}/{seed}``
  one of them (plots, videos, ``steps.jsonl``, ...);
* ``/api/runs``, ``/api/run/{key}`` the runs' state and numbers as JSON (pages of a live run poll it);
* ``/rrd/{key}/{task}/{seed}/recording.rrd`` the episode's recording (built on first request in a
  bounded process pool; concurrent requests for one episode share one build);
* ``/viewer/{file}`` the Rerun web viewer files (fixed allow-list, from the rerun-sdk cache);
* ``/live/{key}`` live frames page; ``/live/{key}/{worker}/state.json`` and
  ``/live/{key}/{worker}/{camera}.jpg``;
* ``/static/app.css``, ``/static/app.js``.

Runs are addressed by opaque keys and episodes by ``<task>/<seed>`` looked up in the scanned index;
no request path is ever turned into a file path (an episode file's name must pass
:func:`genmanip_results.paths.safe_file` in its episode directory, so nothing hidden and nothing
elsewhere). Every file a route reads (``result.json`` or ``meta_record.pkl`` for the instruction,
the ``.rrd``, the episode's files, live frames and state) is opened through
:func:`genmanip_results.paths.open_within`, checked where it is opened against the served root, so
a symlink inside the root that points out of it (also one swapped in after the scan) is never
served: a 404, never its bytes. Security middleware: Host header check on loopback
(DNS rebinding), access token (query once -> HttpOnly cookie) when configured, strict headers, no CORS.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import hmac
import json
import math
import multiprocessing
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from genmanip_protocol.errors import GenmanipError
from genmanip_results.discovery import EpisodeInfo
from genmanip_results.frames import FrameStore, episode_streams
from genmanip_results.layout import META_RECORD, RESULT_JSON
from genmanip_results.live import (
    live_frame_path,
    live_state_path,
    read_live_frame,
    read_live_state,
)
from genmanip_results.paths import (
    UnsafePathError,
    is_within,
    open_within,
    read_bytes_within,
    safe_file,
    safe_relative,
)
from genmanip_runtime.netpolicy import is_loopback_host
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from . import pages
from .assets import VIEWER_FILES, ensure_viewer_assets
from .errors import PortInUseError, RecordingBuildError
from .index import FRESH_WAIT_S, ResultsIndex, RunView, compare_runs, live_workers
from .recording import (
    IGNORE_SIGINT,
    SERVER_RRD_NAME,
    build_recording,
    recording_is_fresh,
    recording_path,
)

__all__ = ["RecordingPool", "VizServer", "bind_socket", "create_app", "is_loopback"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_RRD_SUFFIX = "/recording.rrd"
_PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'"
)
# The Rerun viewer's own page has inline bootstrap scripts and compiles Wasm; it still may only talk
# to this server (no CDN, no telemetry).
_VIEWER_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' 'wasm-unsafe-eval'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self' data: blob:; "
    "worker-src 'self' blob:; media-src 'self' blob:; font-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'self'"
)
#: True for addresses only this machine can reach: gmp's one loopback rule
#: (:func:`genmanip_runtime.netpolicy.is_loopback_host`), kept under this package's old name.
is_loopback = is_loopback_host


# --------------------------------------------------------------------------------------------------
# Recording builds
# --------------------------------------------------------------------------------------------------


def _build_in_child(episode: EpisodeInfo) -> str:
    return str(build_recording(episode))


def _warm_child() -> bool:
    # Importing rerun (pyarrow, a 200 MB native module) is most of a first build's latency.
    import rerun  # noqa: F401

    return True


#: The build processes are replaced once they have served about this many builds each (and no
#: build is running): a backstop that bounds whatever native state (threads, buffers) a rerun
#: build might still leave behind, at the cost of one rerun import per that many builds. The known
#: leak (four threads per build) is fixed at its root in genmanip_viz.recording. (Not
#: ``max_tasks_per_child``: on Python 3.11-3.13 it deadlocks a pool with queued work, CPython
#: gh-115634.)
BUILDS_PER_PROCESS = 64


class RecordingPool:
    """Builds recordings in at most ``workers`` child processes; one build per episode at a time.

    After ``builds_per_process * workers`` builds, the next submit made while no build runs
    starts fresh processes.
    """

    def __init__(self, workers: int = 2, *, builds_per_process: int = BUILDS_PER_PROCESS) -> None:
        self.workers = max(1, int(workers))
        self.builds_per_process = max(1, int(builds_per_process))
        self._submitted = 0  # builds given to the current executor
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._inflight: dict[Path, concurrent.futures.Future[str]] = {}
        self._lock = threading.Lock()

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            # spawn: the server has threads (uvicorn, scanner); forking them is not safe.
            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                **IGNORE_SIGINT,
            )
            self._submitted = 0
        return self._executor

    def _recycle_if_due(self) -> None:
        # (under self._lock) Only between builds: a running build is never cut short.
        if self._executor is None or self._submitted < self.builds_per_process * self.workers:
            return
        if any(not f.done() for f in self._inflight.values()):
            return
        old, self._executor = self._executor, None
        old.shutdown(wait=False)

    def submit(self, episode: EpisodeInfo) -> concurrent.futures.Future[str]:
        """Future of the recording path of ``episode`` (shared with a build already running)."""
        key = Path(episode.path)
        with self._lock:
            fut = self._inflight.get(key)
            if fut is not None and not fut.done():
                return fut
            self._recycle_if_due()
            try:
                fut = self._pool().submit(_build_in_child, episode)
            except concurrent.futures.process.BrokenProcessPool:
                # A child died (OOM, signal): start a fresh pool instead of failing forever.
                self._executor = None
                fut = self._pool().submit(_build_in_child, episode)
            self._submitted += 1
            self._inflight[key] = fut

        def _forget(f: concurrent.futures.Future[str], key: Path = key) -> None:
            with self._lock:
                if self._inflight.get(key) is f:
                    del self._inflight[key]

        fut.add_done_callback(_forget)
        return fut

    def warm(self) -> None:
        """Start one build process and import rerun in it now, so the first episode opens fast."""
        with self._lock:
            self._pool().submit(_warm_child)

    def shutdown(self) -> None:
        """Stop the child processes (running builds are cancelled)."""
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------------------------------
# Security middleware
# --------------------------------------------------------------------------------------------------


def _header(scope: Scope, name: bytes) -> str:
    for k, v in scope.get("headers", []):
        if k == name:
            return bytes(v).decode("latin-1")
    return ""


def _host_name(host_header: str) -> str:
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[: h.find("]") + 1] if "]" in h else h
    return h.rsplit(":", 1)[0] if ":" in h else h


class SecurityMiddleware:
    """Host check, access token, security headers. Pure ASGI (no buffering of file responses)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        loopback_only: bool,
        secure: bool,
        cookie_name: str,
    ) -> None:
        self.app = app
        self.token = token
        self.loopback_only = loopback_only
        self.secure = secure
        self.cookie_name = cookie_name

    async def _plain(
        self, send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        body = pages.error_page(status, text).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    *self._security_headers(b"/"),
                    *(headers or []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _security_headers(self, path: bytes) -> list[tuple[bytes, bytes]]:
        viewer = path.startswith(b"/viewer/")
        hdrs = [
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"cross-origin-opener-policy", b"same-origin"),
            (b"content-security-policy", (_VIEWER_CSP if viewer else _PAGE_CSP).encode()),
            (b"x-frame-options", b"SAMEORIGIN"),
        ]
        if self.secure:
            hdrs.append((b"strict-transport-security", b"max-age=86400"))
        return hdrs

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        auth = _header(scope, b"authorization")
        if auth.startswith("Bearer ") and hmac.compare_digest(
            auth[7:].encode(), self.token.encode()
        ):
            return True
        cookie = _header(scope, b"cookie")
        if cookie:
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(cookie)
            except Exception:
                return False
            morsel = jar.get(self.cookie_name)
            if morsel is not None and hmac.compare_digest(
                morsel.value.encode(), self.token.encode()
            ):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "/")
        if "\x00" in path or "\x00" in scope.get("query_string", b"").decode("latin-1"):
            await self._plain(send, 400, "bad request")
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await self._plain(send, 405, "method not allowed", [(b"allow", b"GET, HEAD")])
            return
        if self.loopback_only and not is_loopback_host(_host_name(_header(scope, b"host"))):
            # DNS rebinding: a web page elsewhere must not read results through a name it controls.
            await self._plain(send, 421, "unexpected Host header; open the URL gmp viz printed")
            return
        if self.token is not None and not self._authorized(scope):
            query = parse_qsl(
                scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
            )
            given = [v for k, v in query if k == "access_token"]
            if given and hmac.compare_digest(given[0].encode(), self.token.encode()):
                # Move the token from the URL into a cookie and drop it from the address bar/history.
                rest = urlencode([(k, v) for k, v in query if k != "access_token"])
                location = path + ("?" + rest if rest else "")
                cookie = f"{self.cookie_name}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                if self.secure:
                    cookie += "; Secure"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 303,
                        "headers": [
                            (b"location", location.encode("latin-1", "replace")),
                            (b"set-cookie", cookie.encode("latin-1")),
                            (b"content-length", b"0"),
                            (b"cache-control", b"no-store"),
                            *self._security_headers(b"/"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
            await self._plain(
                send,
                401,
                "access token required: open the URL gmp viz printed (it carries the token)",
            )
            return

        extra = self._security_headers(path.encode("latin-1", "replace"))

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in (b"access-control-allow-origin",)
                ]
                message["headers"] = headers + extra
            await send(message)

        await self.app(scope, receive, send_wrapper)


# --------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------


@dataclass
class _State:
    root: Path
    index: ResultsIndex
    pool: RecordingPool
    assets_dir: Path | None
    assets_lock: threading.Lock
    cache_dir: Path | None
    instructions: OrderedDict[tuple[str, float], str]


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"cache-control": "no-store"})


def _not_found(what: str) -> HTMLResponse:
    return _html(pages.error_page(404, f"{what} not found"), 404)


def _read_instruction(ep: EpisodeInfo) -> str:
    # Opened within the root the episode was found under: the scan left out a result file that
    # is a symlink out of the tree, and reading it here by name would serve it anyway.
    if getattr(ep, "instruction", None):
        return str(ep.instruction)
    if ep.layout == "client":
        try:
            raw = read_bytes_within(Path(ep.path) / RESULT_JSON, ep.containment, field=RESULT_JSON)
            data = json.loads(raw.decode("utf-8"))
            return str(data.get("instruction") or "") if isinstance(data, dict) else ""
        except (OSError, ValueError, UnsafePathError):
            return ""
    meta = ep.meta_record or Path(ep.path) / META_RECORD
    try:
        from genmanip_protocol.codec import safe_loads

        data = safe_loads(read_bytes_within(meta, ep.containment, field=META_RECORD))
    except Exception:
        return ""
    return str(data.get("instruction") or "") if isinstance(data, dict) else ""


#: Media types of an episode's files by suffix; any other file is sent as a download. Never HTML
#: or SVG: a file of a results tree must not run script on this origin (nosniff is set too).
_FILE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".mp4": "video/mp4",
    ".json": "application/json",
    ".jsonl": "text/plain; charset=utf-8",
    ".log": "text/plain; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}


def _episode_files(ep: EpisodeInfo) -> list[pages.EpisodeFile]:
    """The regular files of the episode's directory the pages may link and ``/file`` serves:
    names that pass :func:`safe_file` there (nothing hidden, nothing resolving out of it)."""
    directory = Path(ep.path)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            st = safe_file(directory, name, field="file").stat()
        except (UnsafePathError, OSError):
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(pages.EpisodeFile(name, st.st_size, st.st_mtime))
    return out


def _file_response(path: Path, root: Path, media_type: str, headers: dict[str, str]) -> Response | None:
    """Stream ``path`` when it opens within ``root`` (:func:`open_within`); None otherwise.

    The descriptor checked is the one streamed: nothing can be swapped in between.
    """
    try:
        fh = open_within(path, root, field="file")
    except (OSError, UnsafePathError):
        return None
    size = os.fstat(fh.fileno()).st_size

    async def body() -> Any:
        try:
            while chunk := await run_in_threadpool(fh.read, 1 << 20):
                yield chunk
        finally:
            fh.close()

    return StreamingResponse(
        body(), media_type=media_type, headers={**headers, "content-length": str(size)}
    )


def create_app(
    root: Path,
    *,
    token: str | None = None,
    loopback_only: bool = True,
    secure: bool = False,
    workers: int = 2,
    cache_dir: Path | None = None,
    scan_interval: float = 2.0,
    cookie_name: str = "gmp_viz",
) -> Starlette:
    """The results browser for ``root`` (a project root, results root, benchmark or run directory).

    ``token``: when set, every request needs it (``?access_token=`` once, then a cookie, or a Bearer
    header). ``loopback_only``: refuse Host headers that are not loopback (localhost, 127.0.0.0/8, [::1]).
    ``workers``: recording build processes. ``cache_dir``: where the Rerun viewer files are cached.
    """
    root = Path(root).resolve()
    state = _State(
        root=root,
        index=ResultsIndex(root, min_interval=scan_interval),
        pool=RecordingPool(workers),
        assets_dir=None,
        assets_lock=threading.Lock(),
        cache_dir=cache_dir,
        instructions=OrderedDict(),
    )

    def snapshot_or_scanning() -> Any:
        # Pages show the tree as it is now: a snapshot older than the scan interval is refreshed
        # (an incremental rescan) before the page is made, not after.
        return state.index.snapshot(wait=FRESH_WAIT_S)

    def _scanning() -> HTMLResponse:
        err = state.index.last_error
        if err is not None:
            return _html(pages.error_page(500, f"cannot scan {root}: {err}"), 500)
        return _html(pages.scanning_page())

    async def runs(request: Request) -> Response:
        snap = await run_in_threadpool(snapshot_or_scanning)
        if snap is None:
            return _scanning()
        return _html(pages.runs_page(snap, str(root)))

    def _view(request: Request, *, fresh: bool = False) -> RunView | None:
        # (files, frames, recordings: the episode exists in the snapshot there is, no rescan)
        snap = snapshot_or_scanning() if fresh else state.index.snapshot()
        if snap is None:
            return None
        return snap.by_key.get(str(request.path_params["key"]))

    async def run(request: Request) -> Response:
        snap = await run_in_threadpool(snapshot_or_scanning)
        if snap is None:
            return _scanning()
        view = snap.by_key.get(str(request.path_params["key"]))
        if view is None:
            return _not_found("run")
        comparison = None
        other_key = request.query_params.get("compare")
        if other_key:
            other = snap.by_key.get(other_key)
            if other is None:
                return _not_found("comparison run")
            comparison = (other, compare_runs(view, other))
        others = sorted(snap.runs, key=lambda v: (v.info.benchmark != view.info.benchmark, v.title))
        workers = await run_in_threadpool(live_workers, Path(view.info.path))
        return _html(
            pages.run_page(
                view,
                failures_only=request.query_params.get("failures") in ("1", "true", "yes"),
                others=others,
                comparison=comparison,
                workers=workers,
            )
        )

    def _episode(
        request: Request, rel: str, *, fresh: bool = False
    ) -> tuple[RunView, str, EpisodeInfo] | None:
        view = _view(request, fresh=fresh)
        if view is None:
            return None
        try:
            safe_relative(rel, field="episode")
        except UnsafePathError:
            return None
        ep = view.episodes.get(rel)
        if ep is None or not is_within(Path(ep.path), root):
            return None
        return view, rel, ep

    def _instruction(ep: EpisodeInfo) -> str:
        key = (str(ep.path), float(ep.mtime or 0.0))
        cached = state.instructions.get(key)
        if cached is not None:
            return cached
        text = _read_instruction(ep)
        state.instructions[key] = text
        while len(state.instructions) > 512:
            state.instructions.popitem(last=False)
        return text

    async def episode(request: Request) -> Response:
        found = await run_in_threadpool(
            lambda: _episode(request, str(request.path_params["rel"]), fresh=True)
        )
        if found is None:
            return _not_found("episode")
        view, rel, ep = found
        instruction = await run_in_threadpool(_instruction, ep)
        # Start building now: by the time the viewer has loaded and asks for the recording it is
        # (nearly) ready. The /rrd request joins the same build.
        if not (ep.layout == "server" and (Path(ep.path) / SERVER_RRD_NAME).is_file()):
            if not await run_in_threadpool(recording_is_fresh, ep):
                state.pool.submit(ep)
        # The page plays the JPEG frames directly (no video needed: the first open of a 600-step
        # episode costs an index of each frame store, ~1 ms, not an x264 pass).
        frame_counts = await run_in_threadpool(_frame_counts, ep)
        files = await run_in_threadpool(_episode_files, ep)
        return _html(
            pages.episode_page(
                view, rel, ep, instruction=instruction, frame_counts=frame_counts, files=files
            )
        )

    async def files(request: Request) -> Response:
        found = await run_in_threadpool(_episode, request, str(request.path_params["rel"]))
        if found is None:
            return _not_found("episode")
        view, rel, ep = found
        listing = await run_in_threadpool(_episode_files, ep)
        return _html(pages.files_page(view, rel, ep, listing))

    async def episode_file(request: Request) -> Response:
        found = await run_in_threadpool(_episode, request, str(request.path_params["rel"]))
        if found is None:
            return _not_found("file")
        name = str(request.path_params["name"])
        try:
            # The name is one plain component of the episode directory, checked where the path is
            # built; the file is then opened within the root (open_within, in _file_response).
            path = safe_file(Path(found[2].path), name, field="file")
        except UnsafePathError:
            return _not_found("file")
        media = _FILE_TYPES.get(Path(name).suffix.lower())
        headers = {"cache-control": "no-cache"}
        if media is None:
            media = "application/octet-stream"
            headers["content-disposition"] = f'attachment; filename="{name}"'
        served = await run_in_threadpool(_file_response, path, root, media, headers)
        return served if served is not None else _not_found("file")

    async def api_runs(request: Request) -> Response:
        snap = await run_in_threadpool(snapshot_or_scanning)
        if snap is None:
            return JSONResponse({"error": "scanning"}, status_code=503)
        return JSONResponse(
            {"runs": [pages.run_status(v) for v in snap.runs]}, headers={"cache-control": "no-store"}
        )

    async def api_run(request: Request) -> Response:
        view = await run_in_threadpool(lambda: _view(request, fresh=True))
        if view is None:
            return JSONResponse({"error": "no such run"}, status_code=404)
        return JSONResponse({"runs": [pages.run_status(view)]}, headers={"cache-control": "no-store"})

    def _frame_counts(ep: EpisodeInfo) -> dict[str, int]:
        out: dict[str, int] = {}
        for cam, s in episode_streams(ep.path).items():
            src = s.store or s.spool
            if src is None:
                continue
            try:
                with FrameStore(src, within=root) as store:
                    out[cam] = len(store)
            except (OSError, GenmanipError):
                continue
        return out

    def _frame(request: Request) -> bytes | None:
        found = _episode(request, str(request.path_params["rel"]))
        if found is None:
            return None
        ep = found[2]
        # The camera is looked up among the episode's streams, never joined onto a path.
        s = episode_streams(ep.path).get(str(request.path_params["camera"]))
        src = None if s is None else (s.store or s.spool)
        if src is None:
            return None
        try:
            with FrameStore(src, within=root) as store:
                i = int(request.path_params["index"])
                return store[i] if 0 <= i < len(store) else None
        except (OSError, GenmanipError):
            return None

    async def frame(request: Request) -> Response:
        data = await run_in_threadpool(_frame, request)
        if data is None:
            return _not_found("frame")
        return Response(data, media_type="image/jpeg", headers={"cache-control": "private, max-age=3600"})

    def _timeline(request: Request) -> dict[str, Any] | None:
        found = _episode(request, str(request.path_params["rel"]))
        if found is None:
            return None
        from genmanip_results.series import SeriesError, load_series

        try:
            series = load_series(found[2])
        except (SeriesError, OSError):
            return {"frame_steps": [], "state": {}}
        steps, frames = series.frame_steps()
        t = series.state_t.tolist()
        state = {k: {"t": t, "v": [[x if math.isfinite(x) else None for x in row] for row in v.T.tolist()]}
                 for k, v in series.state.items() if v.shape[1]}
        pairs = zip(steps.tolist(), frames.tolist(), strict=True)
        return {"frame_steps": [[int(a), int(b)] for a, b in pairs], "state": state}

    async def timeline(request: Request) -> Response:
        data = await run_in_threadpool(_timeline, request)
        if data is None:
            return JSONResponse({"error": "no such episode"}, status_code=404)
        return JSONResponse(data, headers={"cache-control": "no-cache"})

    async def rrd(request: Request) -> Response:
        rel = str(request.path_params["rel"])
        if not rel.endswith(_RRD_SUFFIX):
            return _not_found("recording")
        found = await run_in_threadpool(_episode, request, rel[: -len(_RRD_SUFFIX)])
        if found is None:
            return _not_found("recording")
        _, _, ep = found
        server_rrd = Path(ep.path) / SERVER_RRD_NAME
        if ep.layout == "server" and server_rrd.is_file():
            path = server_rrd
        elif await run_in_threadpool(recording_is_fresh, ep):
            path = recording_path(Path(ep.path))
        else:
            try:
                built: str = await asyncio.wrap_future(state.pool.submit(ep))
                path = Path(built)
            except RecordingBuildError as exc:
                return _html(pages.error_page(500, f"cannot build the recording: {exc}"), 500)
            except Exception as exc:  # a crashed build process must not take the page down
                return _html(pages.error_page(500, f"recording build failed: {exc!r}"), 500)
        served = await run_in_threadpool(
            _file_response, path, root, "application/octet-stream", {"cache-control": "no-cache"}
        )
        return served if served is not None else _not_found("recording")

    def _assets() -> Path:
        with state.assets_lock:
            if state.assets_dir is None:
                state.assets_dir = ensure_viewer_assets(cache_dir=state.cache_dir)
            return state.assets_dir

    async def viewer(request: Request) -> Response:
        name = str(request.path_params["name"])
        if name not in VIEWER_FILES:
            return _not_found("viewer file")
        assets = await run_in_threadpool(_assets)
        headers = {"cache-control": "no-cache" if name == "index.html" else "max-age=86400"}
        if name == "re_viewer_bg.wasm":
            plain = assets / name
            headers["rerun-final-length"] = str(plain.stat().st_size)
            if "gzip" in request.headers.get("accept-encoding", ""):
                headers["content-encoding"] = "gzip"
                headers["vary"] = "Accept-Encoding"
                return FileResponse(
                    assets / (name + ".gz"), media_type="application/wasm", headers=headers
                )
            return FileResponse(plain, media_type="application/wasm", headers=headers)
        media = {
            "index.html": "text/html; charset=utf-8",
            "re_viewer.js": "text/javascript; charset=utf-8",
            "favicon.ico": "image/x-icon",
        }[name]
        return FileResponse(assets / name, media_type=media, headers=headers)

    static_files = {
        "app.css": "text/css; charset=utf-8",
        "app.js": "text/javascript; charset=utf-8",
    }
    static_cache: dict[str, bytes] = {}

    async def static(request: Request) -> Response:
        name = str(request.path_params["name"])
        if name not in static_files:
            return _not_found("file")
        if name not in static_cache:
            static_cache[name] = (
                resources.files("genmanip_viz").joinpath("static").joinpath(name).read_bytes()
            )
        return Response(
            static_cache[name], media_type=static_files[name], headers={"cache-control": "no-cache"}
        )

    async def live(request: Request) -> Response:
        snap = await run_in_threadpool(snapshot_or_scanning)
        if snap is None:
            return _scanning()
        view = snap.by_key.get(str(request.path_params["key"]))
        if view is None:
            return _not_found("run")
        workers = await run_in_threadpool(live_workers, Path(view.info.path))
        wanted = request.query_params.get("worker")
        chosen = next((w for w in workers if w.worker_id == wanted), None)
        if chosen is None and workers and not wanted:
            fresh = [w for w in workers if w.fresh] or workers
            chosen = max(fresh, key=lambda w: w.updated)
        return _html(pages.live_page(view, workers, chosen))

    def _live_path(request: Request, camera: str | None) -> Path | None:
        # The live-view contract (names from the wire checked, nothing followed out of the run
        # or the served root) is genmanip_results.live's; None = 404.
        view = _view(request)
        if view is None:
            return None
        run_dir = Path(view.info.path)
        worker = str(request.path_params["worker"])
        if camera is None:
            return live_state_path(run_dir, worker, within=root)
        return live_frame_path(run_dir, worker, camera, within=root)

    async def live_state(request: Request) -> Response:
        path = await run_in_threadpool(_live_path, request, None)
        if path is None:
            return JSONResponse({"error": "no live state"}, status_code=404)
        data = await run_in_threadpool(read_live_state, path, within=root)
        if data is None:
            # Written atomically by the eval side, so this is a real problem, but a transient one.
            return JSONResponse({"error": "unreadable live state"}, status_code=503)
        return JSONResponse(data, headers={"cache-control": "no-store"})

    async def live_frame(request: Request) -> Response:
        path = await run_in_threadpool(_live_path, request, str(request.path_params["camera"]))
        if path is None:
            return _not_found("camera")
        data = await run_in_threadpool(read_live_frame, path, within=root)
        if data is None:
            return _not_found("camera")
        return Response(data, media_type="image/jpeg", headers={"cache-control": "no-store"})

    async def favicon(request: Request) -> Response:
        return Response(status_code=204, headers={"cache-control": "max-age=86400"})

    routes = [
        Route("/", runs),
        Route("/favicon.ico", favicon),
        Route("/run/{key:str}", run),
        Route("/episode/{key:str}/{rel:path}", episode),
        Route("/files/{key:str}/{rel:path}", files),
        Route("/file/{key:str}/{name:str}/{rel:path}", episode_file),
        Route("/api/runs", api_runs),
        Route("/api/run/{key:str}", api_run),
        Route("/rrd/{key:str}/{rel:path}", rrd),
        Route("/frame/{key:str}/{camera:str}/{index:int}/{rel:path}", frame),
        Route("/timeline/{key:str}/{rel:path}", timeline),
        Route("/viewer/{name:str}", viewer),
        Route("/static/{name:str}", static),
        Route("/live/{key:str}", live),
        Route("/live/{key:str}/{worker:str}/state.json", live_state),
        Route("/live/{key:str}/{worker:str}/{camera:str}.jpg", live_frame),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _not_found("page")

    app = Starlette(routes=routes, exception_handlers={404: not_found})
    app.state.viz = state

    def _shutdown() -> None:
        state.index.close()
        state.pool.shutdown()

    app.state.shutdown = _shutdown
    wrapped = SecurityMiddleware(
        app, token=token, loopback_only=loopback_only, secure=secure, cookie_name=cookie_name
    )
    wrapped.state = app.state  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------------


def bind_socket(host: str, port: int, *, tries: int = 20) -> socket.socket:
    """A listening socket on ``host`` at ``port`` or the next free one of ``tries`` ports.

    ``port == 0`` picks an ephemeral port. Raises :class:`PortInUseError` when all are taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    last: OSError | None = None
    for p in [0] if port == 0 else range(port, min(port + tries, 65536)):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, p))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.set_inheritable(True)
        return sock
    raise PortInUseError(
        f"ports {port}-{port + tries - 1} on {host} are all in use ({last})",
        hint="pass --port with a free port",
    )


class VizServer:
    """Runs :func:`create_app` under uvicorn on a background thread (``gmp viz`` and the tests).

    ``warm``: start a build process (and import rerun in it) right away, so the first episode a
    user opens does not wait for that.
    """

    def __init__(
        self,
        root: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        https: bool | None = None,
        token: str | None = None,
        workers: int = 2,
        cache_dir: Path | None = None,
        tls_dir: Path | None = None,
        scan_interval: float = 2.0,
        warm: bool = True,
    ) -> None:
        self.host = host
        self.warm = warm
        self.loopback = is_loopback_host(host)
        self.https = (not self.loopback) if https is None else https
        self.token = token
        self.sock = bind_socket(host, port)
        self.port = int(self.sock.getsockname()[1])
        self.app = create_app(
            root,
            token=token,
            loopback_only=self.loopback,
            secure=self.https,
            workers=workers,
            cache_dir=cache_dir,
            scan_interval=scan_interval,
            cookie_name=f"gmp_viz_{self.port}",
        )
        self.cert: tuple[Path, Path] | None = None
        if self.https:
            from .tls import ensure_certificate

            self.cert = ensure_certificate(host, cache_dir=tls_dir)
        import uvicorn

        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ssl_certfile=str(self.cert[0]) if self.cert else None,
            ssl_keyfile=str(self.cert[1]) if self.cert else None,
            timeout_keep_alive=30,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http(s)://<host>:<port>`` (``localhost`` for a loopback bind: a secure context)."""
        host = self.host
        if self.loopback:
            host = "localhost" if host in ("127.0.0.1", "localhost", "::1") else host
        elif host in ("0.0.0.0", "::"):  # noqa: S104 - naming the wildcard bind, not binding
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.https else 'http'}://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL to open (carries the access token when one is required)."""
        return self.base_url + "/" + (f"?access_token={self.token}" if self.token else "")

    def run(self) -> None:
        """Serve until interrupted (blocking)."""
        if self.warm:
            self.app.state.viz.pool.warm()
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.close()

    def start(self) -> VizServer:
        """Serve on a daemon thread; returns when the server accepts connections."""
        if self.warm:
            self.app.state.viz.pool.warm()
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("gmp viz server did not start")
            time.sleep(0.02)
        return self

    def close(self) -> None:
        """Stop serving, the scanner and the build processes."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.app.state.shutdown()
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> VizServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
