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

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, ParamSpec, Protocol, TypeVar

from genmanip_protocol.robots import RobotSpec
from genmanip_protocol.schema import EpisodeResult
from genmanip_runtime.config import resolve_token
from genmanip_runtime.errors import RequestAborted
from genmanip_runtime.retry import Backoff
from genmanip_runtime.transport import HttpTransport

from .chunks import ChunkFanOut
from .errors import GenmanipEvalError, Interrupted
from .options import (
    DEFAULT_TIMEOUTS,
    DEFAULT_URL,
    TOKEN_ENV,
    ConnectionOptions,
    RecoveryOptions,
    StepOptions,
    options_from_reference,
    parse_worker_ids,
)
from .recovery import Recovery
from .replies import ReplyFolder
from .resets import ResetPoller
from .stepping import Stepper
from .wire import RETRY_DEADLINE_S, Wire
from .worker import Phase, StepTiming, WorkerState

__all__ = ["DEFAULT_TIMEOUTS", "DEFAULT_URL", "EvalClient", "StepListener", "StepTiming"]

log = logging.getLogger("genmanip_eval.client")

P = ParamSpec("P")
R = TypeVar("R")


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

    ``executed`` gets ``batch_size=`` only when the runner batched the policy call (the async
    runner): a listener written for one-worker-at-a-time loops need not accept it.
    """

    def executed(
        self,
        worker_id: str,
        actions: list[dict[str, Any]],
        *,
        obs_timesteps: list[int | None],
        chunk: list[dict[str, int] | None],
        latency: dict[str, float | None] | None,
        batch_size: int | None = None,
    ) -> None: ...

    def episode_end(
        self, worker_id: str, result: EpisodeResult | None, *, lock_lost: bool
    ) -> None: ...

    def observation(self, worker_id: str, obs: Any) -> None: ...

    def worker_finished(self, worker_id: str, metric: Any) -> None: ...


def _backoff(**kwargs: Any) -> Backoff:
    """Every retry schedule of the client, built from this module's ``Backoff`` (one place: the
    reliability battery shortens them all by replacing ``genmanip_eval.client.Backoff``)."""
    return Backoff(**kwargs)


def _interruptible(method: Callable[P, R]) -> Callable[P, R]:
    """A public call: an abort from :meth:`EvalClient.interrupt` leaves it as ``Interrupted``."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except RequestAborted as exc:
            raise Interrupted(f"EvalClient interrupted: {exc}") from exc

    return call


def _reference_recorder(
    base_url: str, results_dir: str | None
) -> tuple[StepListener, Callable[[EvalClient], None]]:
    """``record=True`` / ``save_process=True`` (reference compatibility): a Recorder of this
    client's own, and what ``close()`` does with it. The only place the client meets recording;
    ``gmp eval``'s runner builds its own Recorder and passes it as ``listener``."""
    from .recording import Recorder, resolve_results_root

    rec = Recorder(resolve_results_root(results_dir), manifest={"server_url": base_url})

    def finish(client: EvalClient) -> None:
        from datetime import datetime, timezone

        rec.update_manifest(
            finished=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            codec=client.codec_name,
            frames=client.frames,
            workers=list(client.worker_ids),
        )
        rec.close()

    return rec, finish


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

    The same configuration as options objects: :meth:`from_options`.
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
        conn, step, recovery = options_from_reference(
            base_url=base_url, host=host, port=port, run_id=run_id, token=token, codec=codec,
            frames=frames, ca_file=ca_file, timeouts=timeouts,
            # (read here, at call time: tests shorten every client's limits through it)
            default_timeouts=DEFAULT_TIMEOUTS,
            robot=robot if robot is not None else robot_id, validate=validate,
            render_mode=render_mode, subframes=subframes, render_suffix=render_suffix,
            parallel_chunks=parallel_chunks, max_recoveries=max_recoveries,
            kill_on_start=kill_on_start, adopt_on_start=adopt_on_start,
            kill_on_close=kill_on_close, poll_initial=poll_initial, poll_max=poll_max,
            reset_grace=reset_grace, reference_options=reference_options,
        )
        if save_process is not None:
            record = bool(save_process)
        close_listener = None
        if listener is None and record:
            listener, close_listener = _reference_recorder(conn.base_url, results_dir)
        self._setup(worker_ids, conn, step, recovery, on_event=on_event, listener=listener,
                    close_listener=close_listener)

    @classmethod
    def from_options(
        cls,
        worker_ids: Iterable[str | int] | str | int = ("0",),
        connection: ConnectionOptions | None = None,
        step: StepOptions | None = None,
        recovery: RecoveryOptions | None = None,
        *,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        listener: StepListener | None = None,
    ) -> EvalClient:
        """A client from options objects (defaults for those not given)."""
        self = cls.__new__(cls)
        self._setup(worker_ids, connection or ConnectionOptions(), step or StepOptions(),
                    recovery or RecoveryOptions(), on_event=on_event, listener=listener,
                    close_listener=None)
        return self

    def _setup(
        self,
        worker_ids: Iterable[str | int] | str | int,
        connection: ConnectionOptions,
        step: StepOptions,
        recovery: RecoveryOptions,
        *,
        on_event: Callable[[str, dict[str, Any]], None] | None,
        listener: StepListener | None,
        close_listener: Callable[[EvalClient], None] | None,
    ) -> None:
        self.worker_ids: list[str] = parse_worker_ids(worker_ids)
        self.connection_options = replace(
            connection, token=resolve_token(connection.token, TOKEN_ENV, "eval")
        )
        self.step_options = step
        self.recovery_options = recovery
        self._close_listener = close_listener
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
        # The client is a facade over its rooms, which share the workers' states (not copies):
        # Wire (every request), Recovery (failed requests), ChunkFanOut, ReplyFolder (replies into
        # state), ResetPoller (reset, poll, close's kill; whether reset() ran) and Stepper (step).
        self._wire = Wire(self.connection_options, requests=self.stats["requests"],
                          new_backoff=_backoff)
        self._recovery = Recovery(self)
        self._chunks = ChunkFanOut(len(self.worker_ids), parallel=step.parallel_chunks)
        self._state: dict[str, WorkerState] = {w: WorkerState(w) for w in self.worker_ids}
        self._fold = ReplyFolder(self._state, stats=self.stats, listener=listener, on_event=on_event)
        self._resets = ResetPoller(state=self._state, worker_ids=self.worker_ids, options=recovery,
                                   wire=self._wire, fold=self._fold, recovery=self._recovery,
                                   kill=self.kill)
        self._stepper = Stepper(state=self._state, worker_ids=self.worker_ids, options=step,
                                wire=self._wire, chunks=self._chunks, fold=self._fold,
                                recovery=self._recovery)
        self._closed = False
        #: Set once the client gave up waiting for an unreachable server (close() then does no
        #: cleanup requests).
        self.unreachable = False

    # ------------------------------------------------------------------ configuration (read-only)

    base_url = property(lambda self: self.connection_options.base_url, doc="The server URL.")
    run_id = property(lambda self: self.connection_options.run_id, doc="The run id sent, or None.")
    timeouts = property(lambda self: self.connection_options.timeouts, doc="Per-call limits (s).")
    validate = property(lambda self: self.step_options.validate)
    render_mode = property(lambda self: self.step_options.render_mode)
    subframes = property(lambda self: self.step_options.subframes)
    render_suffix = property(lambda self: self.step_options.render_suffix)
    kill_on_start = property(lambda self: self.recovery_options.kill_on_start)
    adopt_on_start = property(lambda self: self.recovery_options.adopt_on_start)
    max_recoveries = property(lambda self: self.recovery_options.max_recoveries)
    kill_on_close = property(lambda self: self.recovery_options.kill_on_close)
    reset_grace = property(lambda self: self.recovery_options.reset_grace)

    @property
    def episode_results(self) -> list[EpisodeResult]:
        """Every finished episode's result, in arrival order."""
        return self._fold.episode_results

    @property
    def lock_lost_count(self) -> int:
        """How many times the server reported ``lock_lost`` (the episode was aborted and re-queued)."""
        return self._fold.lock_lost_count

    @property
    def codec_name(self) -> str | None:
        """The wire codec (``"msgpack"`` or ``"legacy"``) once connected."""
        return self._wire.codec_name

    @property
    def frames(self) -> str | None:
        """Camera frames on the wire (``"raw"`` or ``"jpeg"``) once connected."""
        return self._wire.frames

    @property
    def server_info(self) -> dict[str, Any] | None:
        """The server's ``GET /protocol`` answer (None for the real server)."""
        return self._wire.server_info

    @property
    def http(self) -> HttpTransport:
        """The main keep-alive connection (created on first use)."""
        return self._wire.http

    def __repr__(self) -> str:  # never shows the token
        return f"EvalClient(base_url={self.base_url!r}, worker_ids={self.worker_ids!r}, run_id={self.run_id!r})"

    def __enter__(self) -> EvalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ connection and control

    @_interruptible
    def connect(self) -> None:
        """Check the server is alive and pick the codec (``GET /protocol`` once). Idempotent."""
        self._wire.connect()

    @_interruptible
    def kill(self, worker_ids: Iterable[str] | None = None) -> None:
        """``POST /kill`` for the given (default: own) worker ids. Safe to repeat."""
        ids = [str(w) for w in (worker_ids if worker_ids is not None else self.worker_ids)]
        self._wire.json_call("/kill", {"data": {"worker_ids": ids}}, timeout_key="kill", retry=True)

    @_interruptible
    def status(self, refresh: bool = False, *, retry: bool = True, retry_deadline: float = RETRY_DEADLINE_S) -> dict[str, Any]:
        """``GET /status`` (the JSON ``data`` object as the server sent it; retried when safe, for
        up to ``retry_deadline`` seconds)."""
        from genmanip_protocol.errors import ResponseError, Violation
        from genmanip_runtime.text import safe_text

        payload = self._wire.json_call(
            "/status", {"refresh": "1"} if refresh else {}, method="GET", timeout_key="status",
            retry=retry, retry_deadline=retry_deadline,
        )
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
            raise ResponseError(Violation(
                "GET /status.data", "a JSON object",
                safe_text(repr(payload), limit=80, tokens=(self.connection_options.token,)),
            ))
        data: dict[str, Any] = payload["data"]
        return data

    @_interruptible
    def _json_call(
        self, route: str, payload: Any, *, method: str = "POST", timeout_key: str, retry: bool
    ) -> Any:
        """A JSON route of the server (``gmp submit``'s ``/start_new_job``)."""
        return self._wire.json_call(route, payload, method=method, timeout_key=timeout_key,
                                    retry=retry)

    def interrupt(self) -> None:
        """Stop this client now, from any thread; idempotent.

        The request in progress (on any of the client's connections) and every later request or
        wait of the client (retry backoff, ``/reset_result`` polling, waiting for a server or a
        job) end within a fraction of a second by raising
        :class:`~genmanip_eval.errors.Interrupted` (a ``KeyboardInterrupt``), with the same
        bookkeeping as a Ctrl-C: workers whose request went unanswered are settled by
        :meth:`close`, which clears the interrupt first and then works as usual.
        """
        self._wire.abort()

    # ------------------------------------------------------------------ reset and poll

    @_interruptible
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
        self._resets.reset()
        return self.entries()

    @_interruptible
    def poll(self, *, block: bool = True) -> dict[str, dict[str, Any]]:
        """Resolve workers that are ``reset_pending``; with ``block`` wait until one can act.

        ``reset()`` and ``step()`` already do this; call it when every worker you could act on
        is pending (then ``step`` has nothing to send).
        """
        self._check_open()
        self._resets.poll(block=block)
        return self.entries()

    # ------------------------------------------------------------------ step

    @_interruptible
    def step(
        self,
        actions: Any,
        *,
        meta: Mapping[str, Mapping[str, Any]] | None = None,
        settle: bool = True,
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
        act, or all finished — unless ``settle`` is False: then it returns as soon as the
        request is answered, a worker whose episode ended comes back ``reset_pending`` and
        :meth:`poll` resolves it (the asynchronous runner's lanes: they report the executed
        steps when the server executed them, not once the next episode is ready).

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
            Interrupted: :meth:`interrupt` was called (the unanswered workers are settled by
                :meth:`close`).
        """
        self._check_open()
        if not self._resets.started:
            raise GenmanipEvalError(
                "step() before reset(): call client.reset() first to get the first observations"
            )
        self._stepper.step(actions, meta=meta)
        if settle:
            self._resets.settle(block=not self._resets.any_actionable())
        return self.entries(), self.done

    # ------------------------------------------------------------------ state

    def entries(self) -> dict[str, dict[str, Any]]:
        """The latest entry of every worker (the same shape ``reset``/``step`` return)."""
        return {
            wid: {
                "obs": st.obs,
                "metric": st.metric,
                "episode_result": st.episode_result,
                "lock_lost": st.out.lock_lost,
                "reset_pending": st.phase.pending,
                "executed_steps": st.out.executed_steps,
                "stopped_early": st.out.stopped_early,
            }
            for wid, st in self._state.items()
        }

    @property
    def done(self) -> bool:
        """True once every worker of this client has finished (no task left for it)."""
        return self._resets.started and all(st.phase is Phase.FINISHED for st in self._state.values())

    def timing(self, worker_id: str) -> StepTiming:
        """Latency split of the last request for ``worker_id``."""
        return self._state[str(worker_id)].timing

    def robot(self, worker_id: str) -> RobotSpec | None:
        """The robot of ``worker_id`` (from ``robot=`` or its last ``obs["robot_id"]``)."""
        return self.step_options.robot or self._state[str(worker_id)].robot

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

    @_interruptible
    def close(self) -> None:
        """Release the workers (``/kill`` unless all finished) and the connections. Idempotent.

        A worker whose episode ended but whose result has not arrived yet is not killed (a kill
        would discard the result, and the server will not run that seed again): the next client
        on that worker id collects it (``adopt_on_start``), e.g. ``gmp eval --run-id`` again.
        Never raises because of the kill: a failure there is logged, so it cannot mask the
        error that made the caller close the client. After :meth:`interrupt` it clears the
        interrupt first, then settles the interrupted requests (one quick ``/reset_result`` each).
        """
        if self._closed:
            return
        self._closed = True
        self._wire.rearm()
        try:
            if self.unreachable and self._resets.started and not self.done:
                # Cleanup against a server known to be gone would only wait (a kill's retries,
                # a probe's timeout): its workers and their seeds die or expire with it.
                log.info("close(): the server at %s is unreachable: workers not released", self.base_url)
            elif self.recovery_options.kill_on_close and self._resets.started and not self.done:
                self._resets.release()
            if self._close_listener is not None:
                self._close_listener(self)
        finally:
            self._chunks.close()
            self._wire.close()
