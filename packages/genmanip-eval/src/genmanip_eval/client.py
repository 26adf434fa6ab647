"""`EvalClient`: drive GenManip evaluation workers over HTTP without losing an action or an observation.

Compatible with the reference client's documented use::

    client = EvalClient(base_url="http://127.0.0.1:8087", worker_ids=["0"], run_id="myrun")
    obs = client.reset()                 # {"0": {"obs": {...}, "metric": ..., "episode_result": ...}}
    while True:
        obs, done = client.step({"0": action_dict})   # or a list of action dicts (a chunk)
        if done:
            break
    client.close()

What it does differently (see docs/eval.md):

* ``reset()`` kills its own worker ids first, then ``/reset``, then polls ``/reset_result`` until
  every worker has its real first observation, so the first action of a job is never dropped.
* ``step()`` polls ``/reset_result`` whenever an episode ends, so it always returns real
  observations; ``obs["reset"]`` is True on each episode's first one and the finished episode's
  result is in ``entry["episode_result"]`` and in :attr:`EvalClient.episode_results`.
* Chunks go through ``/step_chunk`` per worker (in parallel threads), so a finished or resetting
  worker never cuts another worker's chunk short.
* Every action is validated against the robot spec before it is sent; a failed ``/step`` is never
  replayed. The client finds out what happened instead (``/reset_result`` of that worker): if the
  request ended the episode, its result is collected; otherwise the episode is restarted
  (``/kill``, ``/reset``: the server re-queues the seed), so no action ever counts twice. After
  ``max_recoveries`` consecutive failures of a worker it raises
  :class:`~genmanip_eval.errors.StepError` saying whether the action may have run.
* ``reset()`` first collects what a previous client left on its workers (a finished episode's
  result, a reset already under way) instead of killing it, so a resumed run loses nothing.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol
from urllib.parse import urlsplit

from genmanip_protocol.codec import get_codec
from genmanip_protocol.errors import (
    DecodeError,
    GenmanipError,
    ResponseError,
    ValidationError,
    Violation,
)
from genmanip_protocol.robots import RobotSpec, get_robot
from genmanip_protocol.schema import (
    EpisodeResult,
    WorkerEntry,
    parse_chunk_response,
    parse_step_response,
    validate_action,
)
from genmanip_runtime.config import resolve_token
from genmanip_runtime.errors import ConnectError, HTTPStatusError, RequestTimeout, TransportError
from genmanip_runtime.netpolicy import is_loopback_host
from genmanip_runtime.retry import Backoff, retry_call
from genmanip_runtime.text import safe_text
from genmanip_runtime.transport import HttpTransport, build_base_url

from .actions import normalize_step_input
from .errors import GenmanipEvalError, ResetTimeout, StepError, StepTimeout

__all__ = ["DEFAULT_TIMEOUTS", "DEFAULT_URL", "EvalClient", "StepListener", "StepTiming"]

log = logging.getLogger("genmanip_eval.client")

DEFAULT_URL = "http://127.0.0.1:8087"
#: What the server should be, in the message about a reply that is not one's.
_SERVICE = "a GenManip eval server"
#: Environment variable holding the server token (after ``token=``/``--token``).
TOKEN_ENV = "GMP_TOKEN"  # noqa: S105 - an env var name, not a secret

#: Per-call time limits in seconds (the real server's limits, facts §1.2). ``step_chunk`` is per
#: action of the chunk. ``reset_deadline`` bounds the whole polling loop.
DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "step": 600.0,
    "step_chunk": 600.0,
    "reset": 600.0,
    "reset_result": 600.0,
    "reset_deadline": 600.0,
    "kill": 120.0,
    "create_workers": 600.0,
    "start_new_job": 60.0,
    "status": 30.0,
    "docs": 5.0,
    "protocol": 5.0,
}

_REFERENCE_IGNORED = frozenset(
    {
        "save_result",
        "web_view",
        "web_view_port",
        "web_view_interval",
        "web_view_scale",
        "frame_save_interval",
        "plot_on_episode_end",
        "chunk_size",
        "control_type",
    }
)


@dataclass
class StepTiming:
    """Latency of the last request for one worker, in milliseconds.

    ``server_ms`` comes from the ``X-Genmanip-Server-Ms`` header (the testbed sends it, the real
    server does not: then it and ``network_ms`` are None). ``poll_ms`` is time spent polling
    ``/reset_result`` after an episode ended; ``policy_ms`` is filled in by the runner.
    """

    total_ms: float = 0.0
    server_ms: float | None = None
    network_ms: float | None = None
    poll_ms: float = 0.0
    policy_ms: float | None = None

    def as_row(self) -> dict[str, float | None]:
        """The ``latency_ms`` object of a ``steps.jsonl`` row."""
        net = self.network_ms if self.network_ms is not None else self.total_ms
        return {
            "network": round(net, 3),
            "server": None if self.server_ms is None else round(self.server_ms, 3),
            "policy": None if self.policy_ms is None else round(self.policy_ms, 3),
        }


class StepListener(Protocol):
    """What the client tells a recorder, in order, on the thread that calls ``reset``/``step``.

    Optional methods, called when the listener has them:

    * ``episode_ended(worker_id)``: the server ended the worker's episode (its last action was
      reported through ``executed``); the result follows with ``episode_end``.
    * ``episode_aborted(worker_id, reason)``: the episode will never be completed by this client
      (e.g. restarted after a failed request); without it ``episode_end(wid, None, lock_lost=False)``.
    * ``adopt_result(worker_id, result)``: a result for an episode this client did not record
      (a previous client's, collected when resuming, or one whose recording was aborted).
    * ``results_not_held(worker_ids)``: when resuming, the server held nothing for these workers:
      an episode a previous client left waiting for its result on one of them will never get it.
    """

    def executed(
        self,
        worker_id: str,
        actions: list[dict[str, Any]],
        *,
        obs_timesteps: list[int | None],
        chunk: list[dict[str, int] | None],
        latency: dict[str, float | None] | None,
    ) -> None: ...

    def episode_end(
        self, worker_id: str, result: EpisodeResult | None, *, lock_lost: bool
    ) -> None: ...

    def observation(self, worker_id: str, obs: Any) -> None: ...

    def worker_finished(self, worker_id: str, metric: Any) -> None: ...


@dataclass
class _WorkerState:
    obs: Any = None
    metric: Any = None
    episode_result: dict[str, Any] | None = None
    lock_lost: bool = False
    finished: bool = False
    executed_steps: int = 0
    pending: bool = False
    stopped_early: bool = False
    in_episode: bool = False
    #: the server ended the recorded episode; its result is awaited
    awaiting: bool = False
    #: consecutive failed requests recovered from (reset by a successful step)
    failures: int = 0
    #: actions of a failed request that turned out to have ended the episode, recorded once the
    #: result confirms it: (actions, meta, chunked)
    unconfirmed: tuple[list[dict[str, Any]], Mapping[str, Any], bool] | None = None
    #: actions of a request cut short by Ctrl-C / SIGTERM before its reply was applied, same form
    #: (close() asks the server whether it ended the episode before killing the worker)
    in_flight: tuple[list[dict[str, Any]], Mapping[str, Any], bool] | None = None
    episode_id: str | None = None
    robot: RobotSpec | None = None
    timing: StepTiming = field(default_factory=StepTiming)


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    val = getter(name)
    if val is None:
        val = getter(name.lower())
    return None if val is None else str(val)


def _server_ms(resp: Any) -> float | None:
    raw = _header(getattr(resp, "headers", None), "X-Genmanip-Server-Ms")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


class EvalClient:
    """Drive one or more GenManip evaluation workers.

    Args:
        base_url: server URL, e.g. ``http://127.0.0.1:8087`` (default). ``host``/``port`` build it
            when ``base_url`` is not given.
        worker_ids: worker ids this client drives (strings; ints and a comma string accepted).
        run_id: sent as the ``run_id`` header and query parameter on every call (online service).
        token: bearer token; else ``GMP_TOKEN``, else the config file's ``[eval] token``. Never
            printed or logged.
        codec: ``"auto"`` (ask ``GET /protocol`` once: msgpack when offered, else legacy pickle),
            ``"msgpack"`` or ``"legacy"``.
        frames: camera frames on the msgpack wire: ``"auto"`` (raw on loopback, JPEG otherwise),
            ``"raw"`` or ``"jpeg"``. The legacy wire is always JPEG.
        robot: robot id for validation; default: ``obs["robot_id"]`` of each worker.
        validate: validate every action before sending it (default True).
        timeouts: overrides of :data:`DEFAULT_TIMEOUTS` (seconds).
        render_mode, subframes, render_suffix: ``/step_chunk`` query parameters (server defaults
            when None).
        kill_on_start: ``/kill`` own worker ids before ``/reset`` (the correct order; default True).
        adopt_on_start: before that kill, collect what each worker holds from a previous client
            (a reset under way or finished, with the previous episode's result): such a worker is
            not killed and its result is not lost (default True).
        max_recoveries: consecutive failed requests of one worker the client recovers from
            (finding out whether the request ran, restarting the episode if unsure) before it
            raises; 0 raises at the first failure.
        kill_on_close: ``/kill`` own worker ids in :meth:`close` unless every worker finished.
        on_event: ``callback(name, payload)`` for ``"episode_finished"``, ``"episode_restarted"``,
            ``"lock_lost"`` and ``"worker_finished"``.
        listener: a :class:`StepListener` (the recorder).
        record: record episodes (steps, videos, results) under ``results_dir`` (or
            ``GENMANIP_RESULT_DIR`` / ``./client_results``). Off by default for the Python API.
        parallel_chunks: send per-worker chunks from parallel threads (default True).
        poll_initial, poll_max: first and largest delay between ``/reset_result`` polls (s).
        reset_grace: once one worker is ready, how long ``reset()`` keeps polling for the others
            before returning them ``reset_pending`` (s).
        ca_file: CA bundle for ``https://`` servers (verification is always on).
    """

    def __init__(
        self,
        base_url: str | None = None,
        worker_ids: Iterable[str | int] | str | int = ("0",),
        run_id: str | None = None,
        token: str | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        codec: str = "auto",
        frames: str = "auto",
        robot: str | RobotSpec | None = None,
        validate: bool = True,
        timeouts: Mapping[str, float] | None = None,
        render_mode: str | None = None,
        subframes: int | None = None,
        render_suffix: int | None = None,
        kill_on_start: bool = True,
        adopt_on_start: bool = True,
        max_recoveries: int = 5,
        kill_on_close: bool = True,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        listener: StepListener | None = None,
        record: bool = False,
        results_dir: str | None = None,
        parallel_chunks: bool = True,
        poll_initial: float = 0.01,
        poll_max: float = 0.5,
        reset_grace: float = 2.0,
        ca_file: str | None = None,
        save_process: bool | None = None,
        robot_id: str | None = None,
        **reference_options: Any,
    ) -> None:
        unknown = set(reference_options) - _REFERENCE_IGNORED
        if unknown:
            raise TypeError(f"EvalClient got unexpected keyword argument(s): {sorted(unknown)}")
        if reference_options:
            log.warning(
                "EvalClient: reference-client option(s) %s have no effect here (see docs/eval.md)",
                ", ".join(sorted(reference_options)),
            )
        if base_url is None:
            base_url = build_base_url(None, host, port or 8087) if host else DEFAULT_URL
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValidationError(
                _violation("base_url", "an http:// or https:// URL with a host", repr(base_url))
            )
        self._loopback = is_loopback_host(parts.hostname)
        self.worker_ids: list[str] = _parse_worker_ids(worker_ids)
        self.run_id = run_id or None
        self._token = resolve_token(token, TOKEN_ENV, "eval")
        if codec not in ("auto", "msgpack", "legacy"):
            raise ValidationError(_violation("codec", "auto, msgpack or legacy", repr(codec)))
        if frames not in ("auto", "raw", "jpeg"):
            raise ValidationError(_violation("frames", "auto, raw or jpeg", repr(frames)))
        self._codec_choice = codec
        self._frames_choice = frames
        robot = robot if robot is not None else robot_id
        self._robot: RobotSpec | None = get_robot(robot) if robot is not None else None
        self.validate = validate
        self.timeouts: dict[str, float] = dict(DEFAULT_TIMEOUTS)
        if timeouts:
            bad = set(timeouts) - set(DEFAULT_TIMEOUTS)
            if bad:
                raise ValidationError(
                    _violation("timeouts", f"keys among {sorted(DEFAULT_TIMEOUTS)}", repr(sorted(bad)))
                )
            self.timeouts.update({k: float(v) for k, v in timeouts.items()})
        if render_mode is not None and render_mode not in ("lite", "always"):
            raise ValidationError(_violation("render_mode", "lite or always", repr(render_mode)))
        self.render_mode = render_mode
        self.subframes = subframes
        self.render_suffix = render_suffix
        self.kill_on_start = kill_on_start
        self.adopt_on_start = adopt_on_start
        self.max_recoveries = max(0, int(max_recoveries))
        self.kill_on_close = kill_on_close
        self._on_event = on_event
        self._poll_initial = poll_initial
        self.reset_grace = reset_grace
        self._poll_max = poll_max
        self._ca_file = ca_file
        self._parallel_chunks = parallel_chunks

        if save_process is not None:
            record = bool(save_process)
        self._owns_listener = False
        if listener is None and record:
            from .recording import Recorder, resolve_results_root

            listener = Recorder(resolve_results_root(results_dir), manifest={"server_url": self.base_url})
            self._owns_listener = True
        self._listener = listener

        self._codec: Any = None
        self.codec_name: str | None = None
        self.frames: str | None = None
        self.server_info: dict[str, Any] | None = None
        self._http: HttpTransport | None = None
        self._worker_http: dict[str, HttpTransport] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._state: dict[str, _WorkerState] = {w: _WorkerState() for w in self.worker_ids}
        self._started = False
        self._closed = False
        self._poll_delay = poll_initial
        self._next_poll = 0.0

        #: Every finished episode's result, in arrival order.
        self.episode_results: list[EpisodeResult] = []
        #: How many times the server reported ``lock_lost`` (the episode was aborted and re-queued).
        self.lock_lost_count = 0
        #: Counters: requests per route, executed steps per worker, episodes, failed requests
        #: recovered from, episodes restarted, results collected from a previous client.
        self.stats: dict[str, Any] = {
            "requests": {},
            "executed_steps": {},
            "episodes": 0,
            "recoveries": 0,
            "restarts": 0,
            "adopted": 0,
        }

    # ------------------------------------------------------------------ plumbing

    def __repr__(self) -> str:  # never shows the token
        return f"EvalClient(base_url={self.base_url!r}, worker_ids={self.worker_ids!r}, run_id={self.run_id!r})"

    def __enter__(self) -> EvalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.run_id:
            h["run_id"] = self.run_id
        if self.codec_name == "msgpack" and self.frames:
            h["X-Genmanip-Frames"] = self.frames
        return h

    def _query(self, extra: Mapping[str, Any] | None = None) -> dict[str, str] | None:
        q: dict[str, str] = {}
        if self.run_id:
            q["run_id"] = self.run_id
        if extra:
            q.update({k: str(v) for k, v in extra.items() if v is not None})
        return q or None

    def _new_transport(self) -> HttpTransport:
        # (service: named when a reply is not a GenManip server's -- a redirect, an HTML page)
        return HttpTransport(self.base_url, token=self._token, ca_file=self._ca_file,
                             service=_SERVICE)

    @property
    def http(self) -> HttpTransport:
        """The main keep-alive connection (created on first use)."""
        if self._http is None:
            self._http = self._new_transport()
        return self._http

    def _transport_for(self, wid: str) -> HttpTransport:
        t = self._worker_http.get(wid)
        if t is None:
            t = self._worker_http[wid] = self._new_transport()
        return t

    def _count(self, route: str) -> None:
        reqs = self.stats["requests"]
        with self._lock:
            reqs[route] = reqs.get(route, 0) + 1

    def _json_call(
        self, route: str, payload: Any, *, method: str = "POST", timeout_key: str, retry: bool
    ) -> Any:
        import json

        def call() -> Any:
            self._count(route)
            headers = self._headers()
            body = None if method == "GET" else json.dumps(payload).encode()
            return self.http.request(
                method,
                route,
                body=body,
                content_type=None if body is None else "application/json",
                query=self._query(payload if method == "GET" else None),
                headers=headers,
                timeout=self.timeouts[timeout_key],
                route_name=route,
                idempotent=retry,
                expect="application/json",
            )

        resp = self._retry(call) if retry else call()
        return resp.json()

    def _retry(self, fn: Callable[[], Any], *, deadline: float = 30.0) -> Any:
        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, ConnectError):
                return True
            if isinstance(exc, HTTPStatusError):
                return exc.status in (502, 503)
            return isinstance(exc, TransportError) and not exc.maybe_executed

        return retry_call(
            fn,
            retry_on=retryable,
            backoff=Backoff(initial=0.2, factor=2.0, max_delay=2.0, jitter=0.2, deadline=deadline),
        )

    def _wire_call(
        self,
        http: HttpTransport,
        route: str,
        obj: Any,
        *,
        timeout: float,
        query: Mapping[str, Any] | None = None,
        idempotent: bool = False,
    ) -> tuple[Any, Any]:
        """POST a wire-encoded body; return (decoded reply, response)."""
        codec = self._codec
        body = codec.encode(obj, tag_arrays=False) if self.codec_name == "legacy" else codec.encode(obj)
        self._count(route)
        resp = http.request(
            "POST",
            route,
            body=body,
            content_type=codec.content_type,
            query=self._query(query),
            headers=self._headers(),
            timeout=timeout,
            route_name=route,
            idempotent=idempotent,
            # a 2xx that is not this codec's (an HTML page, a JSON error, an empty 204) is
            # refused by the transport, naming what came instead of a decoder's complaint
            expect=codec.content_type,
        )
        return codec.decode(resp.body), resp

    # ------------------------------------------------------------------ connection setup

    def connect(self) -> None:
        """Check the server is alive and pick the codec (``GET /protocol`` once). Idempotent."""
        if self._codec is not None:
            return
        info: dict[str, Any] | None = None
        if self._codec_choice == "auto":

            def probe() -> Any:
                self._count("/protocol")
                return self.http.request(
                    "GET",
                    "/protocol",
                    query=self._query(),
                    headers=self._headers(),
                    timeout=self.timeouts["protocol"],
                    route_name="/protocol",
                    idempotent=True,
                    raise_for_status=False,
                )

            resp = self._retry(probe, deadline=self.timeouts["docs"])
            if resp.status == 404:
                name = "legacy"  # the real server has no /protocol: legacy wire
            else:
                # Any other answer is judged like every reply (the transport's one place): a
                # redirect, a 1xx, a 204, an HTML page or an error raise, naming what came.
                resp.raise_for_status(expect="application/json")
                try:
                    info = resp.json()
                except GenmanipError as exc:
                    raise ResponseError(
                        _violation("GET /protocol", "a JSON object", f"undecodable body ({exc})")
                    ) from exc
                if not isinstance(info, dict) or not isinstance(info.get("codecs"), list):
                    raise ResponseError(
                        _violation("GET /protocol.codecs", "a list of codec names",
                                   safe_text(repr(info), limit=80, tokens=(self._token,)))
                    )
                name = "msgpack" if "msgpack" in info["codecs"] else "legacy"
        else:
            name = self._codec_choice

            def docs() -> Any:
                self._count("/docs")
                return self.http.request(
                    "GET", "/docs", timeout=self.timeouts["docs"], route_name="/docs", idempotent=True
                )

            self._retry(docs, deadline=self.timeouts["docs"])
        self.server_info = info
        self._codec = get_codec(name)
        self.codec_name = name
        if name == "msgpack":
            # Without /protocol (codec forced) the user's choice stands. Only the kinds gmp
            # knows are taken from the server (the choice goes back to it in a header).
            offered = (info or {}).get("frames") or ["raw", "jpeg"]
            offered = [f for f in offered if f in ("raw", "jpeg")] if isinstance(offered, list) else []
            if not offered:
                raise ResponseError(_violation(
                    "GET /protocol.frames", "a list of frame kinds among raw, jpeg",
                    safe_text(repr((info or {}).get("frames")), limit=80, tokens=(self._token,)),
                ))
            want = self._frames_choice
            if want == "auto":
                want = "raw" if self._loopback else "jpeg"
            if want not in offered:
                want = offered[0]
            self.frames = want
        else:
            self.frames = "jpeg"
        log.debug("connected to %s: codec=%s frames=%s", self.base_url, name, self.frames)

    def kill(self, worker_ids: Iterable[str] | None = None) -> None:
        """``POST /kill`` for the given (default: own) worker ids. Safe to repeat."""
        ids = [str(w) for w in (worker_ids if worker_ids is not None else self.worker_ids)]
        self._json_call(
            "/kill", {"data": {"worker_ids": ids}}, timeout_key="kill", retry=True
        )

    def status(self, refresh: bool = False, *, retry: bool = True) -> dict[str, Any]:
        """``GET /status`` (the JSON ``data`` object as the server sent it; retried when safe)."""
        payload = self._json_call(
            "/status", {"refresh": "1"} if refresh else {}, method="GET", timeout_key="status", retry=retry
        )
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
            raise ResponseError(_violation("GET /status.data", "a JSON object",
                                          safe_text(repr(payload), limit=80, tokens=(self._token,))))
        data: dict[str, Any] = payload["data"]
        return data

    # ------------------------------------------------------------------ reset

    def reset(self) -> dict[str, dict[str, Any]]:
        """Start (or restart) evaluation on this client's workers.

        First collects, per worker, what a previous client left there (``adopt_on_start``): a
        worker whose reset is under way or finished keeps it, and the previous episode's result
        it carries is reported (``episode_results``, the listener's ``adopt_result``). Every other
        worker is killed (so no seed leaks) and reset with ``/reset``. Then ``/reset_result`` is
        polled until workers have their first observation. It returns as soon as at least one
        worker can act (or all have finished); a worker still resetting then has ``obs=None``
        and ``reset_pending=True`` and is resolved by later calls — blocking on it could deadlock
        a multi-worker client whose other workers hold the seeds it waits for.

        Returns:
            ``{worker_id: {"obs": Observation | None, "metric": dict | None, "episode_result":
            dict | None, "lock_lost": bool, "reset_pending": bool, "executed_steps": 0}}``;
            ``obs["reset"]`` is True.
        """
        self._check_open()
        self.connect()
        for st in self._state.values():
            st.executed_steps = 0
            st.lock_lost = False
            st.finished = False
            st.pending = False
            st.awaiting = False
            st.unconfirmed = None
        self._started = True
        adopted: list[str] = []
        if self.kill_on_start and self.adopt_on_start:
            for wid in self.worker_ids:
                entry = self._probe(wid)
                if entry is not None:
                    # Applied at once: a finished reset was just handed out, for the last time.
                    adopted.append(wid)
                    self._apply_entry(wid, entry, first=True)
            if adopted:
                log.info(
                    "worker(s) %s: a reset from a previous client is under way or finished: "
                    "collected instead of killing the worker", ", ".join(adopted)
                )
        rest = [w for w in self.worker_ids if w not in adopted]
        if self.kill_on_start and rest:
            if self.adopt_on_start:
                self._notify("results_not_held", list(rest))
            self.kill(rest)
        if rest:
            t0 = time.perf_counter()
            # Repeated if the connection is lost (a server restarting under a starting client):
            # /reset is safe to repeat and re-creates workers the server lost.
            data, resp = self._reset_call(rest)
            entries = parse_step_response(data, rest)
            total = (time.perf_counter() - t0) * 1000
            for wid in rest:
                self._state[wid].timing = StepTiming(total_ms=total, server_ms=_server_ms(resp))
                self._apply_entry(wid, entries[wid], first=True)
        # Workers usually finish their first reset together: give the others a moment.
        self._settle(block=True, grace=self.reset_grace)
        return self.entries()

    def poll(self, *, block: bool = True) -> dict[str, dict[str, Any]]:
        """Resolve workers that are ``reset_pending``; with ``block`` wait until one can act.

        ``reset()`` and ``step()`` already do this; call it when every worker you could act on
        is pending (then ``step`` has nothing to send).
        """
        self._check_open()
        for st in self._state.values():
            st.executed_steps = 0
            st.lock_lost = False
        self._settle(block=block)
        return self.entries()

    def _settle(self, *, block: bool, grace: float = 0.0) -> None:
        """Poll ``/reset_result`` for pending workers.

        ``block``: keep polling (with backoff) until some worker has an observation or every
        worker finished — and, with ``grace``, up to that many more seconds for the others;
        else at most one poll, rate-limited by the backoff.
        """
        pending = [w for w in self.worker_ids if self._state[w].pending]
        if not pending:
            self._poll_delay = self._poll_initial
            return
        now = time.monotonic()
        if not block:
            if now < self._next_poll:
                return
        deadline = self.timeouts["reset_deadline"]
        started = now
        grace_start: float | None = None
        if block and not any(self._actionable(w) for w in self.worker_ids):
            time.sleep(self._poll_initial)
        while True:
            try:
                self._poll_once(pending)
            except GenmanipError as exc:
                self._recover_poll(exc, pending)
            pending = [w for w in self.worker_ids if self._state[w].pending]
            self._poll_delay = min(self._poll_max, self._poll_delay * 1.5) if pending else self._poll_initial
            self._next_poll = time.monotonic() + self._poll_delay
            if not pending or not block:
                return
            if any(self._actionable(w) for w in self.worker_ids):
                if grace_start is None:
                    grace_start = time.monotonic()
                if time.monotonic() - grace_start >= grace:
                    return
            waited = time.monotonic() - started
            if waited >= deadline:
                raise ResetTimeout(
                    f"worker(s) {', '.join(pending)} still reset_pending after {deadline:g} s "
                    "of polling /reset_result",
                    workers=pending,
                    deadline=deadline,
                )
            time.sleep(min(self._poll_delay, max(0.0, deadline - waited)))

    def _poll_once(self, ids: list[str]) -> None:
        def poll() -> Any:
            return self._wire_call(
                self.http, "/reset_result", {"worker_ids": ids}, timeout=self.timeouts["reset_result"]
            )[0]

        data = retry_call(
            poll,
            # Only retry what never reached the server: /reset_result is a destructive read.
            retry_on=lambda e: isinstance(e, ConnectError)
            or (isinstance(e, HTTPStatusError) and e.status == 503),
            backoff=Backoff(initial=0.2, factor=2.0, max_delay=2.0, jitter=0.2, deadline=30.0),
        )
        parsed = parse_step_response(data, ids)
        for w in ids:
            self._apply_entry(w, parsed[w], first=False)

    def _actionable(self, wid: str) -> bool:
        st = self._state[wid]
        return st.obs is not None and not st.pending and not st.finished

    # ------------------------------------------------------------------ step

    def step(
        self,
        actions: Any,
        *,
        meta: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, dict[str, Any]], bool]:
        """Apply actions and return ``(entries, done)``.

        ``actions`` forms are listed in :mod:`genmanip_eval.actions`: a bare action dict (one
        worker), ``{worker_id: action_dict}`` (one ``/step`` for all), a list of action dicts (a
        chunk, one worker), ``{worker_id: [action_dict, ...]}`` or a time-major list of
        ``{worker_id: action_dict}`` (per-worker ``/step_chunk`` calls, in parallel).

        Only workers with an observation can act: actions for finished or ``reset_pending``
        workers are ignored (there is no episode to apply them to); workers left out are not
        stepped (their entry is returned again, ``executed_steps`` 0).

        When an episode ends, the worker's next observation (``obs["reset"]`` True, the finished
        ``episode_result`` alongside) is fetched before returning — unless other workers of this
        client can act meanwhile: then the worker is returned ``reset_pending`` (``obs`` None)
        and resolved by a later call. ``step`` always returns with at least one worker able to
        act, or all finished.

        ``meta`` (used by the runner) gives per worker ``"obs_timesteps"`` and ``"chunk"`` lists
        (one per action, for recording client-side chunk replay) and ``"policy_ms"``.

        Returns:
            ``entries`` as in :meth:`reset` for every worker (``executed_steps`` = actions the
            server executed for that worker in this call), and ``done`` = every worker finished.

        A failed request is recovered from (see the module docstring): the workers it was for
        come back either with their next episode's first observation (the request ended the
        episode: its result is in ``episode_result``) or restarted (``obs["reset"]`` True, the
        interrupted episode discarded and re-queued by the server).

        Raises:
            ValidationError: an action does not fit the robot (nothing was sent).
            StepError: the request failed and could not be recovered from (more than
                ``max_recoveries`` failures in a row, or the server unreachable);
                ``maybe_executed`` tells whether it may have run.
        """
        self._check_open()
        if not self._started:
            raise GenmanipEvalError(
                "step() before reset(): call client.reset() first to get the first observations"
            )
        norm = normalize_step_input(actions, self.worker_ids)
        per_worker: dict[str, list[dict[str, Any]]] = {}
        for wid, acts in norm.per_worker.items():
            if not self._actionable(wid):
                log.debug("worker %s has no observation to act on: ignoring its action(s)", wid)
                continue
            per_worker[wid] = [self._check_action(wid, a, i) for i, a in enumerate(acts)]
        for st in self._state.values():
            st.executed_steps = 0
            st.lock_lost = False
            st.stopped_early = False
        if per_worker:
            for wid, sent in per_worker.items():
                self._state[wid].in_flight = (sent, (meta or {}).get(wid) or {}, norm.chunk)
            try:
                if norm.chunk:
                    self._step_chunks(per_worker, meta or {})
                else:
                    self._step_single(per_worker, meta or {})
            except StepError as exc:
                self._recover_step(exc, per_worker, meta or {}, chunked=norm.chunk)
            except KeyboardInterrupt:
                raise  # the unanswered workers keep in_flight: close() asks what became of them
            except BaseException:
                self._clear_in_flight()
                raise
            self._clear_in_flight()
        self._settle(block=not any(self._actionable(w) for w in self.worker_ids))
        return self.entries(), self.done

    def _check_action(self, wid: str, action: Mapping[str, Any], index: int) -> dict[str, Any]:
        if not self.validate:
            return dict(action)
        st = self._state[wid]
        robot = self._robot or st.robot
        ts = _timestep(st.obs)
        step = None if ts is None else ts + index
        if robot is None:
            raise GenmanipEvalError(
                f"worker {wid}: cannot validate the action: the robot is unknown "
                "(no robot_id in the observation)",
                hint="pass robot='manip/lift2/R5a' (or --robot) or validate=False",
            )
        return validate_action(robot, action, worker=wid, step=step)

    def _step_single(
        self, per_worker: dict[str, list[dict[str, Any]]], meta: Mapping[str, Mapping[str, Any]]
    ) -> None:
        body = {wid: acts[0] for wid, acts in per_worker.items()}
        wids = list(body)
        t0 = time.perf_counter()
        try:
            data, resp = self._wire_call(self.http, "/step", body, timeout=self.timeouts["step"])
            entries = parse_step_response(data, wids)
        except GenmanipError as exc:
            raise _step_error(exc, "/step", wids, self.timeouts["step"]) from exc
        total = (time.perf_counter() - t0) * 1000
        server = _server_ms(resp)
        for wid in wids:
            timing = StepTiming(
                total_ms=total,
                server_ms=server,
                network_ms=None if server is None else max(0.0, total - server),
                policy_ms=_meta_policy(meta, wid),
            )
            self._finish_worker_step(wid, per_worker[wid], entries[wid], timing, meta, chunked=False)

    def _one_chunk(self, wid: str, acts: list[dict[str, Any]]) -> tuple[WorkerEntry, Any, int, float]:
        http = self._transport_for(wid) if self._parallel_chunks else self.http
        body = [{wid: a} for a in acts]
        q = {"render_mode": self.render_mode, "subframes": self.subframes, "render_suffix": self.render_suffix}
        timeout = self.timeouts["step_chunk"] * max(1, len(acts))
        t0 = time.perf_counter()
        try:
            data, resp = self._wire_call(http, "/step_chunk", body, timeout=timeout, query=q)
            parsed = parse_chunk_response(data, [wid])
        except GenmanipError as exc:
            raise _step_error(exc, "/step_chunk", [wid], timeout) from exc
        total = (time.perf_counter() - t0) * 1000
        executed = parsed.executed_steps
        if not 0 <= executed <= len(acts):
            raise StepError(
                f"reply to POST /step_chunk for worker {wid}: executed_steps={executed} is outside "
                f"0..{len(acts)}",
                route="/step_chunk",
                workers=[wid],
                sent=True,
                maybe_executed=True,
            )
        self._state[wid].stopped_early = parsed.stopped_early
        return parsed.entries[wid], resp, executed, total

    def _step_chunks(
        self, per_worker: dict[str, list[dict[str, Any]]], meta: Mapping[str, Mapping[str, Any]]
    ) -> None:
        wids = list(per_worker)
        results: dict[str, Any] = {}
        errors: dict[str, BaseException] = {}
        if len(wids) == 1 or not self._parallel_chunks:
            for wid in wids:
                try:
                    results[wid] = self._one_chunk(wid, per_worker[wid])
                except BaseException as exc:
                    errors[wid] = exc
                    break
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=len(self.worker_ids), thread_name_prefix="gmp-chunk"
                )
            futs = {wid: self._pool.submit(self._one_chunk, wid, per_worker[wid]) for wid in wids}
            for wid, fut in futs.items():
                try:
                    results[wid] = fut.result()
                except BaseException as exc:
                    errors[wid] = exc
        # Workers whose chunk succeeded are applied (and recorded) even if another one failed.
        for wid in wids:
            if wid not in results:
                continue
            entry, resp, executed, total = results[wid]
            server = _server_ms(resp)
            timing = StepTiming(
                total_ms=total,
                server_ms=server,
                network_ms=None if server is None else max(0.0, total - server),
                policy_ms=_meta_policy(meta, wid),
            )
            self._finish_worker_step(
                wid, per_worker[wid][:executed], entry, timing, meta, chunked=True,
                chunk_size=len(per_worker[wid]),
            )
        if errors:
            for e in errors.values():
                if not isinstance(e, Exception):  # Ctrl-C / SIGTERM while waiting: not a failure
                    raise e
            first = next(iter(errors.values()))
            if isinstance(first, StepError):
                first.workers = list(errors)
                first.transient = all(isinstance(e, StepError) and e.transient for e in errors.values())
            raise first

    def _finish_worker_step(
        self,
        wid: str,
        executed: list[dict[str, Any]],
        entry: WorkerEntry,
        timing: StepTiming,
        meta: Mapping[str, Mapping[str, Any]],
        *,
        chunked: bool,
        chunk_size: int | None = None,
    ) -> None:
        st = self._state[wid]
        st.timing = timing
        st.failures = 0
        st.in_flight = None
        self._record_executed(wid, executed, meta.get(wid) or {}, chunked=chunked, chunk_size=chunk_size)
        self._apply_entry(wid, entry, first=False)

    def _record_executed(
        self,
        wid: str,
        executed: list[dict[str, Any]],
        m: Mapping[str, Any],
        *,
        chunked: bool,
        chunk_size: int | None = None,
    ) -> None:
        st = self._state[wid]
        st.executed_steps = len(executed)
        counts = self.stats["executed_steps"]
        counts[wid] = counts.get(wid, 0) + len(executed)
        if self._listener is not None and executed:
            base_ts = _timestep(st.obs)
            obs_ts = list(m.get("obs_timesteps") or [base_ts] * len(executed))[: len(executed)]
            if chunked and not m.get("chunk"):
                size = chunk_size or len(executed)
                chunk: list[dict[str, int] | None] = [{"index": i, "size": size} for i in range(len(executed))]
            else:
                chunk = list(m.get("chunk") or [None] * len(executed))[: len(executed)]
            self._listener.executed(
                wid, executed, obs_timesteps=obs_ts, chunk=chunk, latency=st.timing.as_row()
            )

    def _apply_entry(self, wid: str, entry: WorkerEntry, *, first: bool) -> None:
        """Fold one server entry into the worker's state (and tell the listener)."""
        st = self._state[wid]
        if entry.metric is not None:
            st.metric = entry.metric
        listener = self._listener
        if entry.lock_lost:
            st.lock_lost = True
            self.lock_lost_count += 1
            eid = _get(st.obs, "episode_id") or st.episode_id
            log.warning(
                "worker %s: the server lost the episode lock; episode %s was aborted and re-queued", wid, eid
            )
            self._emit("lock_lost", {"worker_id": wid, "episode_id": eid})
            if listener is not None and st.in_episode:
                listener.episode_end(wid, None, lock_lost=True)
            st.in_episode = st.awaiting = False
            st.unconfirmed = None
        if entry.reset_pending:
            st.pending = True
            st.obs = None
            if not first and st.in_episode and not st.awaiting and st.unconfirmed is None:
                # The request just reported ended the episode on the server: everything of it is
                # recorded except its result, which the next /reset_result brings.
                st.awaiting = True
                self._notify("episode_ended", wid)
            return
        was_pending = st.pending
        st.pending = False
        er = entry.episode_result
        if st.unconfirmed is not None:
            acts, m, chunked = st.unconfirmed
            st.unconfirmed = None
            if st.in_episode and er is not None and er.episode_id == st.episode_id and not entry.lock_lost:
                # The failed request ended this episode, so it did run: record it now.
                if chunked:
                    self._abort_recording(
                        wid,
                        f"the server finished this episode (score {er.score:g}), but the reply to its "
                        "last /step_chunk was lost: how many of that chunk's actions ran is unknown",
                    )
                else:
                    self._record_executed(wid, acts, m, chunked=False)
        if er is not None:
            st.episode_result = er.to_dict()
            self.episode_results.append(er)
            self.stats["episodes"] += 1
            self._emit("episode_finished", {"worker_id": wid, "episode_result": st.episode_result})
        obs: Any = entry.obs  # a decoded (mutable) dict or Observation
        new_episode = obs is not None and (
            first or was_pending or er is not None or entry.lock_lost or bool(_get(obs, "reset"))
        )
        if st.in_episode and (obs is None or new_episode):
            # The recorded episode ended: with its result, or without one (re-queued, aborted).
            if listener is not None:
                listener.episode_end(wid, er, lock_lost=False)
            st.in_episode = st.awaiting = False
        elif er is not None:
            # A result for an episode this client did not record to the end: a previous client's
            # (collected on resume) or one whose recording was aborted.
            self.stats["adopted"] += 1
            self._notify("adopt_result", wid, er)
        if obs is not None:
            # Make the flag reliable for the policy: True exactly on an episode's first obs.
            obs["reset"] = bool(new_episode)
            st.episode_id = _get(obs, "episode_id")
            rid = _get(obs, "robot_id")
            if rid and (st.robot is None or st.robot.robot_id != rid):
                try:
                    st.robot = get_robot(rid)
                except ValidationError:
                    log.warning("worker %s: unknown robot_id %r (validation needs robot=)", wid, rid)
            if listener is not None:
                listener.observation(wid, obs)
            st.in_episode = True
        st.obs = obs
        if obs is None and not st.finished:
            st.finished = True
            self._emit("worker_finished", {"worker_id": wid, "metric": st.metric})
            if listener is not None:
                listener.worker_finished(wid, st.metric)

    def _notify(self, name: str, *args: Any) -> None:
        """Call the listener's optional method ``name`` (see :class:`StepListener`) if it has one."""
        fn = getattr(self._listener, name, None)
        if fn is not None:
            fn(*args)

    def _abort_recording(self, wid: str, reason: str) -> None:
        st = self._state[wid]
        if st.in_episode and self._listener is not None:
            fn = getattr(self._listener, "episode_aborted", None)
            if fn is not None:
                fn(wid, reason)
            else:
                self._listener.episode_end(wid, None, lock_lost=False)
        st.in_episode = st.awaiting = False
        st.unconfirmed = None

    # ------------------------------------------------------------------ recovery

    def _can_recover(self, wids: Iterable[str]) -> bool:
        return self.max_recoveries > 0 and all(
            self._state[w].failures < self.max_recoveries for w in wids
        )

    def _probe(self, wid: str, *, quick: bool = False) -> WorkerEntry | None:
        """``/reset_result`` for one worker: its entry if a reset is under way or finished (a
        finished one is consumed and returned), None if it has nothing pending (it is mid-episode,
        unknown to the server, or the server has no job). Transient failures are retried, unless
        ``quick`` (one attempt of at most 3 s: the process is stopping)."""
        limit = min(3.0, self.timeouts["reset_result"]) if quick else self.timeouts["reset_result"]

        def call() -> Any:
            return self._wire_call(self.http, "/reset_result", {"worker_ids": [wid]}, timeout=limit)[0]

        try:
            data = call() if quick else retry_call(
                call,
                # (the real "no pending" answer is a 500 naming ValueError: not transient). An
                # unreachable server is waited for as long as _await_server does: a restarted
                # server takes seconds to come back, longer on a loaded machine.
                retry_on=_transient,
                backoff=Backoff(initial=0.2, factor=2.0, max_delay=2.0, jitter=0.2,
                                deadline=_SERVER_WAIT_S),
            )
        except HTTPStatusError as exc:
            if exc.status == 500:
                # "worker <id> has no pending reset result", an unknown worker, no job: the same
                # answer for us — there is nothing to collect.
                log.debug("worker %s: nothing pending (%s)", wid, exc.detail or exc)
                return None
            raise
        return parse_step_response(data, [wid])[wid]

    def _reset_call(
        self, wids: list[str], *, any_5xx: bool = False, await_job: bool = False
    ) -> tuple[Any, Any]:
        """``/reset`` of ``wids``: (decoded reply, response). Repeated while it fails in a way that
        may pass: ``/reset`` is safe to repeat (a worker whose reset is under way or finished gets
        that one back; nothing new is taken) and it creates the workers the server does not know.

        ``any_5xx``: every 5xx is repeated (a recovery: the server is known to be flaky), else only
        lost connections and 502/503/504. ``await_job``: a server without a job (restarted: idle
        until the job is submitted again) is waited for (:meth:`_await_job`), then asked again.
        """

        def call() -> tuple[Any, Any]:
            return self._wire_call(self.http, "/reset", {"worker_ids": wids}, timeout=self.timeouts["reset"])

        def again(e: BaseException) -> bool:
            if not isinstance(e, TransportError):
                return False
            if not isinstance(e, HTTPStatusError):
                return True
            if _no_job(e):
                return False
            return e.status >= 500 if any_5xx else e.status in (502, 503, 504)

        def told(n: int, e: BaseException, delay: float) -> None:
            if n == 1:
                log.warning("%s; repeating /reset for worker(s) %s (safe to repeat; waiting up to "
                            "%.0f s for the server)", e, ", ".join(wids), _SERVER_WAIT_S)

        def attempt() -> tuple[Any, Any]:
            result: tuple[Any, Any] = retry_call(
                call, retry_on=again,
                backoff=Backoff(initial=0.2, factor=2.0, max_delay=2.0, jitter=0.2,
                                deadline=_SERVER_WAIT_S),
                on_retry=told,
            )
            return result

        try:
            return attempt()
        except HTTPStatusError as exc:
            if not (await_job and _no_job(exc)):
                raise
            self._await_job(exc)
            return attempt()

    def _restart(self, wid: str, reason: str, *, detail: str = "") -> None:
        """Discard the worker's episode: ``/kill`` (the server re-queues the seed), ``/reset``.

        ``reason`` is short (the ``episode_restarted`` event, the log); ``detail`` (the failed
        call) is added in the recording's ``INCOMPLETE`` marker.
        """
        st = self._state[wid]
        eid = st.episode_id
        self._abort_recording(wid, f"restarted: {reason}" + (f" ({detail})" if detail else ""))
        self.kill([wid])
        # (/reset re-creates a worker the server does not know: a restarted server's)
        data, _ = self._reset_call([wid], any_5xx=True, await_job=True)
        entry = parse_step_response(data, [wid])[wid]
        st.pending = st.finished = False
        st.executed_steps = 0
        self._apply_entry(wid, entry, first=True)
        if eid is None:
            # No episode had started on this worker (its first reset was lost): nothing restarted.
            log.info("worker %s: reset again (%s)", wid, reason)
            return
        self.stats["restarts"] += 1
        log.info("worker %s: episode %s restarted (%s)", wid, eid, reason)
        self._emit("episode_restarted", {"worker_id": wid, "episode_id": eid, "reason": reason})

    def _clear_in_flight(self) -> None:
        for st in self._state.values():
            st.in_flight = None

    def _settle_in_flight(self) -> None:
        """Before ``close()`` kills anything: a worker whose request was cut short by Ctrl-C or
        SIGTERM may have had its episode ended by that request. Ask the server (one quick
        ``/reset_result``); if it did, record the episode (its result now, or by the next client
        on that worker id) instead of killing the worker, which would discard the result."""
        for wid, st in self._state.items():
            if st.in_flight is None:
                continue
            acts, meta, chunked = st.in_flight
            st.in_flight = None
            try:
                entry = self._probe(wid, quick=True)
                if entry is None:
                    continue  # still mid-episode: the kill re-queues it
                if not entry.reset_pending:
                    st.unconfirmed = (list(acts), meta, chunked)
                elif chunked:
                    # Ended within the chunk, result to come: how many of the chunk's actions ran
                    # is unknown. The next client collects the result into the INCOMPLETE marker.
                    self._abort_recording(
                        wid,
                        "stopped during this episode's last /step_chunk, which ended it on the "
                        "server: how many of that chunk's actions ran is unknown",
                    )
                    st.awaiting = True
                else:
                    # The single action ran and ended the episode: it is recorded; the result
                    # comes with the next client's /reset_result (the worker is left resetting).
                    self._record_executed(wid, list(acts), meta, chunked=False)
                self._apply_entry(wid, entry, first=False)
                log.info("worker %s: the interrupted request ended episode %s", wid, st.episode_id)
            except GenmanipError as exc:
                log.warning("worker %s: cannot settle its interrupted request: %s", wid, exc)

    def _give_up(self, exc: GenmanipError, wids: list[str]) -> NoReturn:
        """Raise ``exc``, a transient failure the client will not recover from, saying why."""
        if self.max_recoveries > 0:
            worst = [w for w in wids if self._state[w].failures >= self.max_recoveries]
            exc.hint = (
                f"worker(s) {', '.join(worst)} failed {self.max_recoveries} "
                f"time{'s' if self.max_recoveries != 1 else ''} in a row without "
                "a successful step (max_recoveries); the server looks unwell. Finished episodes "
                "are kept: run again with the same run id to do the rest"
            )
        raise exc

    def _count_failure(self, exc: GenmanipError, wids: list[str]) -> None:
        self.stats["recoveries"] += 1
        for w in wids:
            self._state[w].failures += 1
        worst = max(self._state[w].failures for w in wids)
        log.warning("%s; recovering (failure %d of at most %d in a row)", exc, worst, self.max_recoveries)

    def _recover_step(
        self,
        exc: StepError,
        per_worker: Mapping[str, list[dict[str, Any]]],
        meta: Mapping[str, Mapping[str, Any]],
        *,
        chunked: bool,
    ) -> None:
        failed = [w for w in exc.workers if w in per_worker]
        for w in failed:
            self._state[w].in_flight = None  # (settled below, or the error stands)
        # "I do not know this worker" (KeyError, no job) is not the request's fault: the server
        # lost the worker (restarted). Settled like any uncertain failure, below: nothing is ever
        # resent, the probe finds nothing pending, the episode restarts on a re-created worker.
        unknown = _unknown_workers(exc, failed, polled=False)
        if not (exc.transient or unknown) or not failed:
            raise exc
        if not self._can_recover(failed):
            self._give_up(exc, failed)
        self._count_failure(exc, failed)
        if not exc.sent:
            # Nothing reached the server. Wait until it answers; the workers are as they were --
            # unless it is a new process (a restart while this client was between requests):
            # then they are gone, and the next request would meet KeyError.
            self._await_server(exc)
            self._reattach_after_outage(exc)
            return
        view = _ServerView(self, exc)
        for wid in failed:
            entry = self._resolve(exc, wid, "the failed request may have run", view=view)
            if entry is not None:
                # The worker is resetting: the failed request ended its episode.
                self._state[wid].unconfirmed = (list(per_worker[wid]), meta.get(wid) or {}, chunked)
                self._apply_entry(wid, entry, first=False)

    def _recover_poll(self, exc: GenmanipError, ids: list[str]) -> None:
        # These workers are resetting as far as this client knows: "no pending reset result"
        # (or KeyError, no job) means the server lost their resets -- it restarted.
        if not (_transient(exc) or _unknown_workers(exc, ids, polled=True)):
            raise exc
        if not self._can_recover(ids):
            self._give_up(exc, ids)
        self._count_failure(exc, ids)
        view = _ServerView(self, exc)
        for wid in ids:
            # Nothing pending means the lost reply consumed the finished reset: the previous
            # episode's result and the next one's first observation are gone, and the worker is
            # already stepping an episode we never saw.
            entry = self._resolve(
                exc,
                wid,
                "its first observation was lost with a reply",
                lost="the server finished this episode, but the reply carrying its result was lost",
                view=view,
            )
            if entry is not None:
                self._apply_entry(wid, entry, first=False)

    def _resolve(
        self, exc: GenmanipError, wid: str, reason: str, *, lost: str | None = None,
        view: _ServerView | None = None,
    ) -> WorkerEntry | None:
        """Settle one worker after ``exc``, a transient failure that may or may not have run.

        Returns the worker's entry if a reset is under way or finished (the failed request ended
        its episode). Otherwise the worker is mid-episode in a state nobody can know: its
        recording is aborted (with ``lost`` as the reason if given) and the episode restarted
        (``reason``), and None is returned. Never resends. A failure while settling re-raises
        ``exc``, chained to its cause.

        With ``view``, a worker with nothing pending is looked up in ``/status``: one the server
        does not know (it restarted, see :meth:`_reattach_after_outage` for why nothing counts
        twice) is re-created by the restart, and its reasons say so.
        """
        short = str(exc).split(";")[0]
        try:
            entry = self._probe(wid)
        except GenmanipError as err:
            raise exc from err
        if entry is None:
            # (a job that is gone for good or changed raises its own, clear error here)
            if view is not None and not view.knows(wid):
                reason = _RESTARTED
                if lost is not None:
                    lost = _RESULT_DIED
            if lost is not None:
                # (outside the try: a recording failure is its own error, not a network one)
                self._abort_recording(wid, f"{lost} ({short})")
            try:
                self._restart(wid, reason, detail=short)
            except TransportError as err:
                raise exc from err  # (a job that never came back raises its own, clear error)
        return entry

    def _await_server(self, exc: GenmanipError) -> None:
        def docs() -> Any:
            return self.http.request(
                "GET", "/docs", timeout=self.timeouts["docs"], route_name="/docs", idempotent=True
            )

        try:
            retry_call(
                docs,
                retry_on=lambda e: isinstance(e, TransportError),
                backoff=Backoff(initial=0.5, factor=2.0, max_delay=5.0, jitter=0.2,
                                deadline=_SERVER_WAIT_S),
            )
        except GenmanipError as derr:
            raise exc from derr

    # Exactly once across a server restart. A server process that dies takes every episode in
    # progress with it: their actions lived in that process's world only and no result_info.json
    # was written for them, so the restarted server (resuming the run from disk, facts §9.2)
    # serves those seeds again from their first step. A request that failed when the server died
    # either ran in the dead process -- and died with it -- or never ran; it cannot run in the
    # new process, which has no episode to run it in (it answers KeyError / "no pending reset
    # result"). So restarting each interrupted episode from its first observation counts no
    # action twice, and the failed request is never resent: on the new server it could only
    # fail, or, after a /reset, act on a different episode. What the dead process may have
    # finished is an episode whose result_info.json it wrote before dying while its result was
    # still to be handed out: the new server keeps that score and never serves the seed again, so
    # that recording is marked INCOMPLETE with the reason (_RESULT_DIED), never waited for.

    def _reattach_after_outage(self, exc: GenmanipError) -> None:
        """The server answers again after being unreachable: if it lost this client's workers (a
        new process), re-create each unfinished one and restart its episode (see above)."""
        view = _ServerView(self, exc)
        short = str(exc).split(";")[0]
        for wid in self.worker_ids:
            st = self._state[wid]
            if st.finished or view.knows(wid):
                continue
            if st.awaiting:
                self._abort_recording(wid, f"{_RESULT_DIED} ({short})")
            try:
                self._restart(wid, _RESTARTED, detail=short)
            except TransportError as err:
                raise exc from err

    def _known_workers(self, exc: GenmanipError) -> set[str] | None:
        """The worker ids the server has (``/status`` ``active_workers``; None when it does not
        say), once it has this client's job: a server without one is waited for
        (:meth:`_await_job`), one running another run is an error."""
        status = self.status()
        if status.get("benchmark_id") is None or status.get("run_id") is None:
            status = self._await_job(exc)
        self._check_same_run(status, exc)
        active = status.get("active_workers")
        return {str(w) for w in active} if isinstance(active, list) else None

    def _run_label(self) -> str:
        """This client's run, for messages: its run id, else that of its last episode id."""
        if self.run_id:
            return f"run {self.run_id}"
        eid = next((st.episode_id for st in self._state.values() if st.episode_id), None)
        return f"the run of episode {eid}" if eid else "this client's run"

    def _check_same_run(self, status: Mapping[str, Any], exc: GenmanipError) -> None:
        """Refuse to re-attach to a job of another run (the server restarted with another job,
        or someone started one): its episodes would be recorded as this run's."""
        bench, run = status.get("benchmark_id"), status.get("run_id")
        eids = [st.episode_id for st in self._state.values() if st.episode_id]
        if eids:
            same = any(str(e).startswith(f"{bench}/{run}/") for e in eids)
        else:
            same = not self.run_id or run == self.run_id
        if not same:
            rid = self.run_id or "RUN_ID"
            raise GenmanipEvalError(
                f"the server's job is now run {run!r} of {bench!r}, not {self._run_label()}: it "
                "restarted with another job or someone started one; not mixing runs",
                hint=f"resume the run: gmp submit CONFIG... --run-id {rid}, then gmp eval --run-id "
                f"{rid} again (finished episodes are kept)",
            ) from exc

    def _await_job(self, exc: GenmanipError) -> dict[str, Any]:
        """Wait (up to ``reset_deadline``) until the server has a job again; return its status.

        A restarted server is idle: the job was in the dead process's memory. The protocol brings
        it back only by ``/start_new_job`` with the job's config paths (facts §9.2), which a client
        does not have -- and that call kills every worker of every client of the server, so a
        client sending it would kill its siblings' re-created workers. Whoever submitted the job
        submits it again with the same run id (the server keeps every seed finished on disk); the
        client waits for it, saying so, then re-creates its workers.
        """
        deadline = self.timeouts["reset_deadline"]
        rid = self.run_id or "RUN_ID"
        t0 = time.monotonic()
        note_at = 0.0
        while True:
            status = self.status()
            if status.get("benchmark_id") is not None and status.get("run_id") is not None:
                log.warning("the server has a job again (run %s): re-attaching", status.get("run_id"))
                return status
            waited = time.monotonic() - t0
            if waited >= deadline:
                raise GenmanipEvalError(
                    f"the server at {self.base_url} has had no job for {waited:.0f} s (it restarted "
                    f"and {self._run_label()} was not submitted again)",
                    hint=f"submit it again: gmp submit CONFIG... --run-id {rid}; then gmp eval "
                    f"--run-id {rid} (finished episodes are kept)",
                ) from exc
            if waited >= note_at:
                log.warning(
                    "the server at %s has no job (it restarted?): waiting up to %.0f s for %s to be "
                    "submitted again (gmp submit CONFIG... --run-id %s)",
                    self.base_url, deadline - waited, self._run_label(), rid,
                )
                note_at = waited + 30.0
            time.sleep(min(1.0, max(0.0, deadline - waited)))

    def _emit(self, name: str, payload: dict[str, Any]) -> None:
        if self._on_event is not None:
            try:
                self._on_event(name, payload)
            except Exception:  # a callback bug must not kill the evaluation
                log.exception("on_event callback failed for %s", name)

    # ------------------------------------------------------------------ state

    def entries(self) -> dict[str, dict[str, Any]]:
        """The latest entry of every worker (the same shape ``reset``/``step`` return)."""
        return {
            wid: {
                "obs": st.obs,
                "metric": st.metric,
                "episode_result": st.episode_result,
                "lock_lost": st.lock_lost,
                "reset_pending": st.pending,
                "executed_steps": st.executed_steps,
                "stopped_early": st.stopped_early,
            }
            for wid, st in self._state.items()
        }

    @property
    def done(self) -> bool:
        """True once every worker of this client has finished (no task left for it)."""
        return self._started and all(st.finished for st in self._state.values())

    def timing(self, worker_id: str) -> StepTiming:
        """Latency split of the last request for ``worker_id``."""
        return self._state[str(worker_id)].timing

    def robot(self, worker_id: str) -> RobotSpec | None:
        """The robot of ``worker_id`` (from ``robot=`` or its last ``obs["robot_id"]``)."""
        return self._robot or self._state[str(worker_id)].robot

    @property
    def metrics(self) -> dict[str, Any]:
        """The latest metric dict merged over workers (keys with ``*`` are unfinished tasks)."""
        merged: dict[str, Any] = {}
        for st in self._state.values():
            if isinstance(st.metric, Mapping):
                merged.update(st.metric)
        return merged

    def _check_open(self) -> None:
        if self._closed:
            raise GenmanipEvalError("this EvalClient is closed")

    def close(self) -> None:
        """Release the workers (``/kill`` unless all finished) and the connections. Idempotent.

        A worker whose episode ended but whose result has not arrived yet is not killed (a kill
        would discard the result, and the server will not run that seed again): the next client
        on that worker id collects it (``adopt_on_start``), e.g. ``gmp eval --run-id`` again.
        Never raises because of the kill: a failure there is logged, so it cannot mask the
        error that made the caller close the client.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self.kill_on_close and self._started and not self.done:
                self._settle_in_flight()
                kept = [w for w, st in self._state.items() if st.pending and st.awaiting]
                doomed = [w for w, st in self._state.items() if not st.finished and w not in kept]
                if kept:
                    log.info(
                        "worker(s) %s left resetting: the result of the episode each just finished "
                        "is collected by the next client on the same worker id(s)", ", ".join(kept)
                    )
                try:
                    if doomed:
                        self.kill(doomed)
                except GenmanipError as exc:
                    log.warning("close(): /kill of workers %s failed: %s", ",".join(doomed), exc)
            if self._owns_listener and self._listener is not None:
                from datetime import datetime, timezone

                rec: Any = self._listener
                rec.update_manifest(
                    finished=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                    codec=self.codec_name,
                    frames=self.frames,
                    workers=list(self.worker_ids),
                )
                rec.close()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            for t in [self._http, *self._worker_http.values()]:
                if t is not None:
                    t.close()


# ---------------------------------------------------------------------- helpers


def _violation(field_: str, expected: str, actual: str) -> Violation:
    return Violation(field_, expected, actual)


def _parse_worker_ids(worker_ids: Iterable[str | int] | str | int) -> list[str]:
    if isinstance(worker_ids, (str, int)):
        items = [s.strip() for s in str(worker_ids).split(",")]
    else:
        items = [str(w).strip() for w in worker_ids]
    if not items or any(not w for w in items):
        raise ValidationError(
            _violation("worker_ids", "a non-empty list of non-empty ids", repr(worker_ids))
        )
    if len(set(items)) != len(items):
        raise ValidationError(_violation("worker_ids", "distinct ids", repr(items)))
    return items


def _get(obs: Any, key: str) -> Any:
    if obs is None:
        return None
    try:
        return obs.get(key)
    except AttributeError:
        return None


def _timestep(obs: Any) -> int | None:
    ts = _get(obs, "timestep")
    try:
        return None if ts is None else int(ts)
    except (TypeError, ValueError):
        return None


def _meta_policy(meta: Mapping[str, Mapping[str, Any]], wid: str) -> float | None:
    m = meta.get(wid)
    if not m:
        return None
    v = m.get("policy_ms")
    return None if v is None else float(v)


#: How long a client waits for an unreachable server before it gives up (a restart takes seconds).
_SERVER_WAIT_S = 60.0
#: Restart reason of an episode the server lost with its worker (the event, the log, INCOMPLETE).
#: (If the failed request was the episode's last, the dead server may have scored it first: then
#: the restarted one keeps that score and does not serve the seed again.)
_RESTARTED = (
    "the server lost the worker (it restarted?): the episode died with it, unless the failed "
    "request ended it and the server kept its result"
)
#: INCOMPLETE reason of an ended episode whose result the restarted server cannot hand out.
_RESULT_DIED = (
    "the server restarted before handing out this episode's result (the reply carrying its result "
    "was lost with the old server process)"
)


class _ServerView:
    """What the server knows, from one ``GET /status`` per recovery, fetched only when needed."""

    def __init__(self, client: EvalClient, exc: GenmanipError) -> None:
        self._client = client
        self._exc = exc
        self._fetched = False
        self._known: set[str] | None = None
        self._told = False

    def knows(self, wid: str) -> bool:
        """False when the server does not have worker ``wid`` (a restarted server's case)."""
        if not self._fetched:
            self._fetched = True
            try:
                self._known = self._client._known_workers(self._exc)
            except (TransportError, ResponseError) as err:
                # /status unusable: assume known. A lost worker is re-created all the same (the
                # restart's /reset creates it), or met at the next request (KeyError).
                log.debug("GET /status failed (%s): cannot tell whether the server restarted", err)
        known = self._known
        if known is None or wid in known:
            return True
        if not self._told:
            self._told = True
            c = self._client
            lost = [w for w in c.worker_ids if not c._state[w].finished and w not in known]
            log.warning(
                "the server at %s no longer knows worker(s) %s (it restarted, or they were killed): "
                "re-creating them and restarting their episodes from the first step (nothing is resent)",
                c.base_url, ", ".join(lost),
            )
        return False


#: A 500 naming one of these was raised by the request's content (a wrong action shape, an unknown
#: worker, ...): sending it again would fail again, so it is not recovered from.
_REQUEST_FAULT = re.compile(
    r"\b(ValueError|TypeError|KeyError|IndexError|AttributeError|AssertionError|NotImplementedError)\b"
)


def _transient(exc: BaseException) -> bool:
    """Does the failure say nothing against the request itself (see ``StepError.transient``)?"""
    if isinstance(exc, HTTPStatusError):
        return exc.status in (502, 503, 504) or (
            exc.status == 500 and not _REQUEST_FAULT.search(exc.detail or "")
        )
    return isinstance(exc, TransportError)


#: How a server that does not know a worker answers, per route (reference facts §1.1, §2): it
#: restarted (its workers died with the old process), or someone's ``/start_new_job`` or ``/kill``
#: removed it. ``/step`` fails with 500 ``KeyError: '<id>'`` (ids stringified); ``/reset_result``
#: with 500 ``ValueError: worker <id> has no pending reset result`` (the answer for any worker with
#: nothing pending); ``/step_chunk`` with a bare text 500 ``Internal Server Error``, which it gives
#: for every exception it does not format, so that one is not told apart here: it is a transient
#: 500, and the probe that follows finds the worker gone. ``/reset`` creates a missing worker and
#: ``/kill`` accepts an unknown id, so neither fails. A server without a job (a real one after a
#: restart, until ``/start_new_job``) answers 500 ``... No job started. Call start_new_job first.``
_UNKNOWN_WORKER = re.compile(r"^KeyError: '(?P<wid>[^']*)'$")
_NO_PENDING = re.compile(r"\bworker (?P<wid>\S+) has no pending reset result\b")
_NO_JOB = "No job started"


def _no_job(exc: BaseException) -> bool:
    """Does ``exc`` say the server has no job (a 500 naming ``No job started``)?"""
    detail = getattr(exc, "detail", None) or ""
    return getattr(exc, "status", None) == 500 and _NO_JOB in detail


def _unknown_workers(exc: BaseException, wids: Iterable[str], *, polled: bool) -> list[str]:
    """The workers of ``wids`` that the reply ``exc`` says the server does not know (all of them
    when it has no job). ``polled``: the request was a ``/reset_result`` poll of workers this
    client holds as resetting, so "no pending reset result" means the server lost their reset."""
    ids = list(wids)
    if getattr(exc, "status", None) != 500:
        return []
    if _no_job(exc):
        return ids
    detail = (getattr(exc, "detail", None) or "").strip()
    m = _UNKNOWN_WORKER.match(detail) or (_NO_PENDING.search(detail) if polled else None)
    return [m.group("wid")] if m and m.group("wid") in ids else []


def _step_error(exc: GenmanipError, route: str, workers: list[str], timeout: float) -> StepError:
    who = ", ".join(workers)
    if isinstance(exc, RequestTimeout):
        return StepTimeout(
            f"POST {route} for worker(s) {who} timed out after {timeout:g} s; the server may still "
            "apply the action(s): it was not resent",
            timeout=timeout,
            route=route,
            workers=workers,
            sent=True,
            maybe_executed=True,
            transient=True,
        )
    if isinstance(exc, ConnectError):
        return StepError(
            f"POST {route} for worker(s) {who}: could not reach the server ({exc}); nothing was sent",
            route=route,
            workers=workers,
            sent=False,
            maybe_executed=False,
            transient=True,
        )
    if isinstance(exc, HTTPStatusError):
        # 4xx: the server rejected the request before acting on it. 5xx: a worker may have stepped.
        maybe = exc.status >= 500
        tail = "the action(s) may have been applied" if maybe else "nothing was executed"
        return StepError(
            f"POST {route} for worker(s) {who} failed: HTTP {exc.status}: {exc.detail or exc}; {tail}",
            route=route,
            workers=workers,
            sent=True,
            maybe_executed=maybe,
            status=exc.status,
            detail=exc.detail,
            transient=_transient(exc),
        )
    if isinstance(exc, TransportError):
        return StepError(
            f"POST {route} for worker(s) {who} failed: {exc}"
            + ("; the action(s) may have been applied" if exc.maybe_executed else ""),
            route=route,
            workers=workers,
            sent=exc.sent,
            maybe_executed=exc.maybe_executed,
            transient=True,
        )
    if isinstance(exc, (DecodeError, ResponseError)):
        return StepError(
            f"the reply to POST {route} for worker(s) {who} is malformed: {exc}; the action(s) were "
            "probably applied",
            route=route,
            workers=workers,
            sent=True,
            maybe_executed=True,
        )
    return StepError(
        f"POST {route} for worker(s) {who} failed: {exc}",
        route=route,
        workers=workers,
        sent=True,
        maybe_executed=True,
    )
