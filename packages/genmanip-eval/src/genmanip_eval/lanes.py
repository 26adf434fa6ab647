"""The asynchronous runner: one lane per worker, one policy call per batch of ready observations.

Each worker id gets a :class:`Lane`: its own single-worker :class:`~genmanip_eval.client.EvalClient`
(its own connection, its own recovery), on its own thread. A lane with an observation submits it to
the shared :class:`~genmanip_eval.batcher.Batcher`, which calls the policy once for every
observation that is ready, then the lane steps the server with its action while the policy serves
the others. A worker that is resetting, or behind a slow reply, holds nobody else.

Exactly-once actions, recovery, resume and recording are the client's, per lane, unchanged. The
recorder is shared: lanes reach it through :class:`SerializedListener`, one call at a time.

Stopping: ``stop`` ends every lane at its next step boundary; :meth:`Lane.interrupt` ends a lane
now (the Ctrl-C path: its client settles the request it cut short on close, as a Ctrl-C does).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .batcher import Batcher, BatchOutcome, Unbatched
from .client import EvalClient
from .inference import BatchItem

__all__ = ["Lane", "LaneSettings", "SerializedListener", "wait_lanes"]

log = logging.getLogger("genmanip_eval.lanes")

Emit = Callable[[str, dict[str, Any]], None]


class SerializedListener:
    """A listener (the recorder) shared by lanes: each call holds one lock.

    Every :class:`~genmanip_eval.client.StepListener` method, optional ones included, is forwarded
    under the lock, so the recorder keeps its one-caller-at-a-time contract.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)  # AttributeError for what the inner listener lacks
        if not callable(fn):
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return fn(*args, **kwargs)

        return call


@dataclass(frozen=True)
class LaneSettings:
    """How every lane of a run talks to the server and the policy (built once by the runner).

    ``client_kwargs`` are :class:`EvalClient` keyword arguments (url, run id, codec, timeouts, ...);
    ``mode`` is ``"single"`` (one action per step), ``"buffered"`` (a chunk replayed step by step)
    or ``"step_chunk"`` (a chunk sent whole); ``chunk`` truncates chunks (None: as the policy gives).
    """

    client_kwargs: dict[str, Any]
    mode: str
    chunk: int | None


@dataclass(frozen=True)
class _Buffered:
    """One action of a buffered chunk, with where it came from (for ``steps.jsonl``)."""

    action: dict[str, Any]
    obs_timestep: int | None
    index: int
    size: int


class Lane:
    """One worker's loop: observe, ask the batcher, step; on its own thread and connection.

    Args:
        worker_id: the worker this lane drives.
        settings: the run's :class:`LaneSettings`.
        batcher: the policy's batcher (this lane attaches to it while it runs), or an
            :class:`~genmanip_eval.batcher.Unbatched` for a policy that batches elsewhere.
        listener: the (serialized) recorder, or None.
        on_event: the client's ``on_event`` callback (thread-safe on the runner's side).
        emit: the runner's event stream (``"steps"`` after every request).
        stop: asked before every step: True ends the lane at this step boundary.
    """

    def __init__(
        self,
        worker_id: str,
        settings: LaneSettings,
        *,
        batcher: Batcher[Any] | Unbatched[Any],
        listener: Any,
        on_event: Callable[[str, dict[str, Any]], None],
        emit: Emit,
        stop: Callable[[], bool],
    ) -> None:
        self.worker_id = worker_id
        self._settings = settings
        self._batcher = batcher
        self._emit = emit
        self._stop = stop
        self.client = EvalClient(
            worker_ids=[worker_id], on_event=on_event, listener=listener, **settings.client_kwargs
        )
        self._buffer: deque[_Buffered] = deque()
        #: the exception that ended the lane (None: finished or stopped)
        self.error: BaseException | None = None
        #: executed steps
        self.steps = 0
        #: True while a request of this lane is on the wire (an interrupt then cuts it short)
        self.stepping = False
        self.connected = threading.Event()
        self._interrupted = False
        # Set as the lane's thread ends. Waiting on it, not on Thread.join: a Ctrl-C that lands
        # inside Thread.join can leave a running thread looking ended (Python 3.11), and the
        # cleanup after that Ctrl-C must really wait for the lanes.
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gmp-lane-{worker_id}", daemon=True)

    # ------------------------------------------------------------------ control (runner thread)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` s; True once the lane's thread has ended."""
        return self._ended.wait(timeout) if self._thread.ident is not None else True

    @property
    def alive(self) -> bool:
        """Started and not ended yet."""
        return self._thread.ident is not None and not self._ended.is_set()

    def interrupt(self) -> None:
        """End the lane now (Ctrl-C, SIGTERM, or a stop while it waits on a reset). Once: a second
        call would also cut short the cleanup the first one started (the client's close())."""
        if self._interrupted:
            return
        self._interrupted = True
        self.client.interrupt()

    # ------------------------------------------------------------------ the loop (lane thread)

    def _run(self) -> None:
        try:
            self._run_once()
        finally:
            self._ended.set()

    def _run_once(self) -> None:
        self._batcher.attach(self.worker_id)
        try:
            self._loop()
        except BaseException as exc:  # handed to the runner, which decides (KeyboardInterrupt too)
            self.error = exc
        finally:
            self._batcher.detach(self.worker_id)
            try:
                self.client.close()
            except BaseException as exc:  # kept unless an earlier error explains more
                if self.error is None:
                    self.error = exc
                else:
                    log.warning("worker %s: closing the client also failed: %s", self.worker_id, exc)

    def _loop(self) -> None:
        wid = self.worker_id
        client = self.client
        entries = client.reset()
        self.connected.set()
        while not client.done and not self._stop():
            obs = entries[wid]["obs"]
            if obs is None:
                entries = client.poll()
                continue
            action, meta = self._act(obs)
            # (stepping: a stop lets this request and the poll for the episode it may have ended
            # finish; the finished episode's result comes with that poll)
            self.stepping = True
            try:
                # settle=False: the steps are reported as soon as the server executed them, and
                # the next episode is polled for after that: its reset is no stepping time
                entries, _ = client.step({wid: action}, meta={wid: meta}, settle=False)
                executed = entries[wid]["executed_steps"]
                self.steps += executed
                t = client.timing(wid)
                self._emit("steps", {
                    "worker_id": wid,
                    "n": executed,
                    "network_ms": t.network_ms if t.network_ms is not None else t.total_ms,
                    "server_ms": t.server_ms,
                    "policy_ms": meta.get("policy_ms"),
                    "queue_ms": meta.get("queue_ms"),
                    "batch_size": meta.get("batch_size"),
                })
                if entries[wid]["obs"] is None and not client.done:
                    self._batcher.away(wid)  # resetting: its group's next batch goes without it
                    entries = client.poll()
            finally:
                self.stepping = False

    def _ask(self, obs: Any) -> BatchOutcome[Any]:
        item = BatchItem(self.worker_id, _str_or_none(obs.get("episode_id")), obs,
                         new_episode=bool(obs.get("reset")))
        return self._batcher(item, self.worker_id)

    def _act(self, obs: Any) -> tuple[Any, dict[str, Any]]:
        """The action(s) to send for ``obs`` and their recording meta (policy time, chunk place)."""
        mode, n = self._settings.mode, self._settings.chunk
        if obs.get("reset"):
            self._buffer.clear()
        if mode != "buffered":
            out = self._ask(obs)
            value = out.value[:n] if (mode == "step_chunk" and n) else out.value
            return value, _meta(out)
        if not self._buffer:
            out = self._ask(obs)
            chunk = out.value[:n] if n else out.value
            ts = obs.get("timestep")
            ots = None if ts is None else int(ts)
            self._buffer.extend(_Buffered(a, ots, i, len(chunk)) for i, a in enumerate(chunk))
            meta = _meta(out)
        else:
            meta = {"policy_ms": 0.0, "queue_ms": 0.0, "batch_size": None}
        b = self._buffer.popleft()
        meta["obs_timesteps"] = [b.obs_timestep]
        meta["chunk"] = [{"index": b.index, "size": b.size}]
        return b.action, meta


def _meta(out: BatchOutcome[Any]) -> dict[str, Any]:
    return {"policy_ms": out.call_ms, "queue_ms": out.queue_ms, "batch_size": out.batch_size}


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def wait_lanes(lanes: list[Lane], *, poll_s: float = 0.2, tick: Callable[[], None] | None = None) -> None:
    """Wait until every lane has ended, calling ``tick`` (the runner's checks) every ``poll_s``."""
    while any(lane.alive for lane in lanes):
        for lane in lanes:
            if lane.alive:
                lane.join(poll_s / max(1, len(lanes)))
        if tick is not None:
            tick()

