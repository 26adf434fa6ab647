"""The step path: validating actions, sending them (one ``/step``, or one ``/step_chunk`` per
worker), and handing each answered worker's reply to the :class:`~genmanip_eval.replies.ReplyFolder`.

:class:`Stepper` is what :meth:`EvalClient.step <genmanip_eval.client.EvalClient.step>` does
between its checks and its ``/reset_result`` polling (the
:class:`~genmanip_eval.resets.ResetPoller`'s). It owns no state of its own: what a request leaves
behind (``in_flight`` while it is unanswered, timing, the failure count, the reported outputs)
lives in each worker's :class:`~genmanip_eval.worker.WorkerState`, and a failed request goes to
:meth:`Recovery.recover_step <genmanip_eval.recovery.Recovery.recover_step>`, never resent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genmanip_protocol.errors import GenmanipError
from genmanip_protocol.schema import (
    WorkerEntry,
    parse_chunk_response,
    parse_step_response,
    validate_action,
)

from .actions import normalize_step_input
from .chunks import ChunkFanOut, raise_failures
from .errors import GenmanipEvalError, StepError
from .options import StepOptions
from .recovery import Recovery, step_error
from .replies import ReplyFolder, timestep_of
from .wire import Wire, server_ms
from .worker import SentActions, StepTiming, WorkerState

__all__ = ["Stepper"]

# (the client's logger: these messages are the client's, and filters on that name keep working)
log = logging.getLogger("genmanip_eval.client")


# (identity, not field, equality; no repr of every worker's observation in a traceback)
@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class Stepper:
    """Sends one ``step()`` call's actions and folds the replies in.

    Args:
        state: the client's per-worker states (shared, not copied).
        worker_ids: the client's worker ids (the order actions are normalized in).
        options: how actions are sent (validation, robot, ``/step_chunk`` query).
        wire: every request goes through it; its ``timeouts`` are the client's.
        chunks: the per-worker ``/step_chunk`` fan-out.
        fold: folds each answered worker's entry into its state.
        recovery: settles a failed request (:meth:`~genmanip_eval.recovery.Recovery.recover_step`).
    """

    state: Mapping[str, WorkerState]
    worker_ids: Sequence[str]
    options: StepOptions
    wire: Wire
    chunks: ChunkFanOut
    fold: ReplyFolder
    recovery: Recovery

    def step(self, actions: Any, *, meta: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Validate ``actions`` (any form of :mod:`genmanip_eval.actions`), send those of the
        workers that can act and apply the replies; a failed request is recovered from.

        Workers that cannot act are skipped (logged at debug). A worker whose request goes
        unanswered because of Ctrl-C / ``interrupt()`` keeps ``in_flight`` for ``close()``.
        """
        norm = normalize_step_input(actions, self.worker_ids)
        per_worker: dict[str, list[dict[str, Any]]] = {}
        for wid, acts in norm.per_worker.items():
            if not self.state[wid].actionable:
                log.debug("worker %s has no observation to act on: ignoring its action(s)", wid)
                continue
            per_worker[wid] = [self._check_action(wid, a, i) for i, a in enumerate(acts)]
        for st in self.state.values():
            st.out.clear(stopped_early=True)
        meta = meta or {}
        if per_worker:
            for wid, sent in per_worker.items():
                self.state[wid].in_flight = SentActions(tuple(sent), meta.get(wid) or {}, norm.chunk)
            try:
                if norm.chunk:
                    self._step_chunks(per_worker, meta)
                else:
                    self._step_single(per_worker, meta)
            except StepError as exc:
                self.recovery.recover_step(exc, per_worker, meta, chunked=norm.chunk)
            except KeyboardInterrupt:
                raise  # the unanswered workers keep in_flight: close() asks what became of them
            except BaseException:
                self._clear_in_flight()
                raise
            self._clear_in_flight()

    def _check_action(self, wid: str, action: Mapping[str, Any], index: int) -> dict[str, Any]:
        if not self.options.validate:
            return dict(action)
        st = self.state[wid]
        robot = self.options.robot or st.robot
        ts = timestep_of(st.obs)
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
        limit = self.wire.timeouts["step"]
        t0 = time.perf_counter()
        try:
            data, resp = self.wire.call(self.wire.http, "/step", body, timeout=limit)
            entries = parse_step_response(data, wids)
        except GenmanipError as exc:
            raise step_error(exc, "/step", wids, limit) from exc
        timing = _timing(t0, resp, meta)
        for wid in wids:
            self._finish_worker_step(wid, per_worker[wid], entries[wid], timing(wid), meta,
                                     chunked=False)

    def _one_chunk(self, wid: str, acts: list[dict[str, Any]]) -> tuple[WorkerEntry, Any, int, float]:
        """One worker's ``/step_chunk`` (on its own connection when chunks go in parallel)."""
        wire = self.wire
        http = wire.transport_for(wid) if self.chunks.parallel else wire.http
        body = [{wid: a} for a in acts]
        timeout = wire.timeouts["step_chunk"] * max(1, len(acts))
        t0 = time.perf_counter()
        try:
            data, resp = wire.call(http, "/step_chunk", body, timeout=timeout,
                                   query=self.options.chunk_query())
            parsed = parse_chunk_response(data, [wid])
        except GenmanipError as exc:
            raise step_error(exc, "/step_chunk", [wid], timeout) from exc
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
        self.state[wid].out.stopped_early = parsed.stopped_early
        return parsed.entries[wid], resp, executed, total

    def _step_chunks(
        self, per_worker: dict[str, list[dict[str, Any]]], meta: Mapping[str, Mapping[str, Any]]
    ) -> None:
        results, errors = self.chunks.run(per_worker, lambda w: self._one_chunk(w, per_worker[w]))
        # Workers whose chunk succeeded are applied (and recorded) even if another one failed.
        for wid, acts in per_worker.items():
            if wid not in results:
                continue
            entry, resp, executed, total = results[wid]
            srv = server_ms(resp)
            timing = StepTiming(total_ms=total, server_ms=srv,
                                network_ms=None if srv is None else max(0.0, total - srv),
                                **_meta_timing(meta, wid))
            self._finish_worker_step(wid, acts[:executed], entry, timing, meta,
                                     chunked=True, chunk_size=len(acts))
        raise_failures(errors)

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
        st = self.state[wid]
        st.timing = timing
        st.failures = 0
        st.in_flight = None
        self.fold.executed(wid, executed, meta.get(wid) or {}, chunked=chunked, chunk_size=chunk_size)
        self.fold.apply(wid, entry, first=False)

    def _clear_in_flight(self) -> None:
        for st in self.state.values():
            st.in_flight = None


def _meta_timing(meta: Mapping[str, Mapping[str, Any]], wid: str) -> dict[str, Any]:
    """The runner's part of a worker's :class:`StepTiming` (policy and queue ms, batch size)."""
    m = meta.get(wid) or {}
    out: dict[str, Any] = {}
    for key in ("policy_ms", "queue_ms"):
        if m.get(key) is not None:
            out[key] = float(m[key])
    if m.get("batch_size") is not None:
        out["batch_size"] = int(m["batch_size"])
    return out


def _timing(t0: float, resp: Any, meta: Mapping[str, Mapping[str, Any]]) -> Callable[[str], StepTiming]:
    """Per worker, the latency split of one request started at ``t0`` (perf_counter)."""
    total = (time.perf_counter() - t0) * 1000
    srv = server_ms(resp)

    def of(wid: str) -> StepTiming:
        return StepTiming(total_ms=total, server_ms=srv,
                          network_ms=None if srv is None else max(0.0, total - srv),
                          **_meta_timing(meta, wid))

    return of
