"""The reset path: taking the client's workers over (collecting what a previous client left on
them, killing the rest, ``/reset``), polling ``/reset_result`` until workers have an observation
to act on, and handing them back on ``close()``.

:class:`ResetPoller` is what :meth:`EvalClient.reset <genmanip_eval.client.EvalClient.reset>`,
:meth:`~genmanip_eval.client.EvalClient.poll`, the end of
:meth:`~genmanip_eval.client.EvalClient.step` and :meth:`~genmanip_eval.client.EvalClient.close`
call. Taking over and handing back are one room because they are two halves of one rule: a
worker whose reset holds a finished episode's result is never killed (the server hands a result
out once); ``close()`` leaves it resetting and the next client's ``reset()`` adopts it.

It owns whether ``reset()`` has run and the polling clock: the delay between ``/reset_result``
polls grows while workers stay pending and is kept across calls, so the non-blocking polls of a
runner's loop are rate-limited too. A failed poll goes to :meth:`Recovery.recover_poll
<genmanip_eval.recovery.Recovery.recover_poll>`: ``/reset_result`` hands a finished reset out
once, so it is never repeated once it may have reached the server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genmanip_protocol.errors import GenmanipError
from genmanip_protocol.schema import parse_step_response
from genmanip_runtime.errors import ConnectError, HTTPStatusError
from genmanip_runtime.retry import retry_call

from .errors import ResetTimeout
from .options import RecoveryOptions
from .recovery import Recovery
from .replies import ReplyFolder
from .wire import Wire, server_ms
from .worker import Phase, StepTiming, WorkerState

__all__ = ["ResetPoller"]

# (the client's logger: these messages are the client's, and filters on that name keep working)
log = logging.getLogger("genmanip_eval.client")


# (identity, not field, equality; no repr of every worker's observation in a traceback)
@dataclass(kw_only=True, eq=False, repr=False)
class ResetPoller:
    """Starts the client's workers, resolves those that are ``reset_pending`` and releases them.

    Args:
        state: the client's per-worker states (shared, not copied).
        worker_ids: the client's worker ids (the order they are probed, reset and polled in).
        options: the life cycle around failures (adopt/kill on start, polling, reset grace).
        wire: every request goes through it; its ``timeouts`` are the client's.
        fold: folds each entry polled into its worker's state.
        recovery: probes and ``/reset`` calls, settling a failed poll or an interrupted request.
        kill: the client's :meth:`~genmanip_eval.client.EvalClient.kill`.
    """

    state: Mapping[str, WorkerState]
    worker_ids: Sequence[str]
    options: RecoveryOptions
    wire: Wire
    fold: ReplyFolder
    recovery: Recovery
    kill: Callable[[list[str]], None]
    #: ``reset()`` has run (``step()`` needs it; ``done`` and ``close()`` ask it).
    started: bool = field(default=False, init=False)
    _poll_delay: float = field(init=False)
    _next_poll: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._poll_delay = self.options.poll_initial

    def reset(self) -> None:
        """Start (or restart) evaluation on the workers (the client is connected): collect what a
        previous client left (``adopt_on_start``), kill and ``/reset`` every other worker, then
        poll until one can act (see :meth:`EvalClient.reset
        <genmanip_eval.client.EvalClient.reset>`)."""
        opts = self.options
        for st in self.state.values():
            st.out.clear(stopped_early=False)
            st.rearm()
        self.started = True
        adopted: list[str] = []
        if opts.kill_on_start and opts.adopt_on_start:
            for wid in self.worker_ids:
                entry = self.recovery.probe(wid)
                if entry is not None:
                    # Applied at once: a finished reset was just handed out, for the last time.
                    adopted.append(wid)
                    self.fold.apply(wid, entry, first=True)
            if adopted:
                log.info(
                    "worker(s) %s: a reset from a previous client is under way or finished: "
                    "collected instead of killing the worker", ", ".join(adopted)
                )
        rest = [w for w in self.worker_ids if w not in adopted]
        if opts.kill_on_start and rest:
            if opts.adopt_on_start:
                self.fold.notify("results_not_held", list(rest))
            self.kill(rest)
        if rest:
            t0 = time.perf_counter()
            # Repeated if the connection is lost (a server restarting under a starting client):
            # /reset is safe to repeat and re-creates workers the server lost.
            data, resp = self.recovery.reset_call(rest)
            entries = parse_step_response(data, rest)
            total = (time.perf_counter() - t0) * 1000
            for wid in rest:
                self.state[wid].timing = StepTiming(total_ms=total, server_ms=server_ms(resp))
                self.fold.apply(wid, entries[wid], first=True)
        # Workers usually finish their first reset together: give the others a moment.
        self.settle(block=True, grace=opts.reset_grace)

    def poll(self, *, block: bool) -> None:
        """A ``poll()`` call: start the call's outputs, then :meth:`settle`."""
        for st in self.state.values():
            st.out.clear(stopped_early=False)
        self.settle(block=block)

    def release(self) -> None:
        """``close()``'s ``/kill`` (``kill_on_close``), the other half of ``reset()``'s adopt.

        The interrupted requests are settled first. A worker whose episode ended but whose result
        has not arrived yet is left resetting (a kill would discard the result, and the server
        will not run that seed again): the next client on its id adopts it. The rest are killed;
        a failure there is logged, never raised, so it cannot mask the error that made the caller
        close the client.
        """
        self.recovery.settle_in_flight()
        kept = [w for w, st in self.state.items() if st.phase is Phase.AWAITING_RESULT]
        doomed = [w for w, st in self.state.items()
                  if st.phase is not Phase.FINISHED and w not in kept]
        if kept:
            log.info(
                "worker(s) %s left resetting: the result of the episode each just finished "
                "is collected by the next client on the same worker id(s)", ", ".join(kept)
            )
        try:
            if doomed:
                # (bounded: cleanup must not keep a stopping run waiting for a server
                # that went away meanwhile)
                self.wire.json_call("/kill", {"data": {"worker_ids": doomed}},
                                    timeout_key="kill", retry=True, retry_deadline=5.0)
        except GenmanipError as exc:
            log.warning("close(): /kill of workers %s failed: %s", ",".join(doomed), exc)

    def pending(self) -> list[str]:
        return [w for w in self.worker_ids if self.state[w].phase.pending]

    def any_actionable(self) -> bool:
        return any(st.actionable for st in self.state.values())

    def settle(self, *, block: bool, grace: float = 0.0) -> None:
        """Poll ``/reset_result`` for pending workers.

        ``block``: keep polling (with backoff) until some worker has an observation or every
        worker finished — and, with ``grace``, up to that many more seconds for the others;
        else at most one poll, rate-limited by the backoff.
        """
        opts = self.options
        pending = self.pending()
        if not pending:
            self._poll_delay = opts.poll_initial
            return
        now = time.monotonic()
        if not block and now < self._next_poll:
            return
        deadline = self.wire.timeouts["reset_deadline"]
        started = now
        grace_start: float | None = None
        if block and not self.any_actionable():
            self.wire.wait(opts.poll_initial)
        while True:
            try:
                self._poll_once(pending)
            except GenmanipError as exc:
                self.recovery.recover_poll(exc, pending)
            pending = self.pending()
            self._poll_delay = min(opts.poll_max, self._poll_delay * 1.5) if pending else opts.poll_initial
            self._next_poll = time.monotonic() + self._poll_delay
            if not pending or not block:
                return
            if self.any_actionable():
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
            self.wire.wait(min(self._poll_delay, max(0.0, deadline - waited)))

    def _poll_once(self, ids: list[str]) -> None:
        wire = self.wire

        def poll() -> Any:
            return wire.call(wire.http, "/reset_result", {"worker_ids": ids},
                             timeout=wire.timeouts["reset_result"])[0]

        data = retry_call(
            poll,
            # Only retry what never reached the server: /reset_result is a destructive read.
            retry_on=lambda e: isinstance(e, ConnectError)
            or (isinstance(e, HTTPStatusError) and e.status == 503),
            # (the client's schedule builder: the reliability battery shortens it)
            backoff=wire.new_backoff(initial=0.2, factor=2.0, max_delay=2.0, jitter=0.2,
                                     deadline=30.0),
            interrupt=wire.interrupted,
        )
        parsed = parse_step_response(data, ids)
        for w in ids:
            self.fold.apply(w, parsed[w], first=False)
