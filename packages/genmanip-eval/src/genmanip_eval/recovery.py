"""Recovery: finding out what became of a failed request, and never resending it.

For each worker of a transient failure the client asks ``/reset_result`` (:meth:`Recovery.probe`):
a reset under way or finished means the request ended the episode, so it ran (its result is
collected); nothing pending means the worker is mid-episode in a state nobody can know, so the
episode is restarted (``/kill``: the server re-queues the seed, then ``/reset``). A server that is
unreachable is waited for; one that restarted (it no longer knows the workers, or has no job) is
re-attached to. See docs/eval.md, "Failures and resuming".
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from genmanip_protocol.errors import DecodeError, ExitCode, GenmanipError, ResponseError
from genmanip_protocol.schema import WorkerEntry, parse_step_response
from genmanip_runtime.errors import ConnectError, HTTPStatusError, RequestTimeout, TransportError
from genmanip_runtime.retry import retry_call

from .errors import GenmanipEvalError, StepError, StepTimeout
from .worker import SentActions

if TYPE_CHECKING:
    from .client import EvalClient

__all__ = ["Recovery", "step_error", "transient"]

log = logging.getLogger("genmanip_eval.client")

#: How long a client waits for an unreachable server before it gives up (a restart takes seconds).
SERVER_WAIT_S = 60.0
#: Restart reason of an episode the server lost with its worker (the event, the log, INCOMPLETE).
#: (If the failed request was the episode's last, the dead server may have scored it first: then
#: the restarted one keeps that score and does not serve the seed again.)
RESTARTED = (
    "the server lost the worker (it restarted?): the episode died with it, unless the failed "
    "request ended it and the server kept its result"
)
#: INCOMPLETE reason of an ended episode whose result the restarted server cannot hand out.
RESULT_DIED = (
    "the server restarted before handing out this episode's result (the reply carrying its result "
    "was lost with the old server process)"
)


class Recovery:
    """The recovery procedures of one :class:`~genmanip_eval.client.EvalClient` (its state, its
    wire, its recording notifications)."""

    def __init__(self, client: EvalClient) -> None:
        self.c = client
        self.wire = client._wire

    def _backoff(self, *, initial: float = 0.2, max_delay: float = 2.0,
                 deadline: float | None = None) -> Any:
        return self.wire.new_backoff(initial=initial, factor=2.0, max_delay=max_delay, jitter=0.2,
                                     deadline=self.server_wait if deadline is None else deadline)

    @property
    def server_wait(self) -> float:
        """How long an unreachable server is waited for (s): ``timeouts["server_wait"]``."""
        return float(self.c.timeouts.get("server_wait", SERVER_WAIT_S))

    # -- the failure budget -------------------------------------------------------------------

    def can_recover(self, wids: Iterable[str]) -> bool:
        limit = self.c.recovery_options.max_recoveries
        return limit > 0 and all(self.c._state[w].failures < limit for w in wids)

    def give_up(self, exc: GenmanipError, wids: list[str]) -> NoReturn:
        """Raise ``exc``, a transient failure the client will not recover from, saying why."""
        limit = self.c.recovery_options.max_recoveries
        if limit > 0:
            worst = [w for w in wids if self.c._state[w].failures >= limit]
            exc.hint = (
                f"worker(s) {', '.join(worst)} failed {limit} "
                f"time{'s' if limit != 1 else ''} in a row without "
                "a successful step (max_recoveries); the server looks unwell. Finished episodes "
                "are kept: run again with the same run id to do the rest"
            )
        raise exc

    def count_failure(self, exc: GenmanipError, wids: list[str]) -> None:
        self.c.stats["recoveries"] += 1
        for w in wids:
            self.c._state[w].failures += 1
        worst = max(self.c._state[w].failures for w in wids)
        log.warning("%s; recovering (failure %d of at most %d in a row)", exc, worst,
                    self.c.recovery_options.max_recoveries)

    # -- asking the server --------------------------------------------------------------------

    def probe(self, wid: str, *, quick: bool = False) -> WorkerEntry | None:
        """``/reset_result`` for one worker: its entry if a reset is under way or finished (a
        finished one is consumed and returned), None if it has nothing pending (it is mid-episode,
        unknown to the server, or the server has no job). Transient failures are retried, unless
        ``quick`` (one attempt of at most 3 s: the process is stopping)."""
        timeouts = self.wire.timeouts
        limit = min(3.0, timeouts["reset_result"]) if quick else timeouts["reset_result"]

        def call() -> Any:
            return self.wire.call(self.wire.http, "/reset_result", {"worker_ids": [wid]},
                                  timeout=limit)[0]

        try:
            data = call() if quick else retry_call(
                call,
                # (the real "no pending" answer is a 500 naming ValueError: not transient). An
                # unreachable server is waited for as long as await_server does: a restarted
                # server takes seconds to come back, longer on a loaded machine.
                retry_on=transient,
                backoff=self._backoff(),
                interrupt=self.wire.interrupted,
            )
        except HTTPStatusError as exc:
            if exc.status == 500:
                # "worker <id> has no pending reset result", an unknown worker, no job: the same
                # answer for us -- there is nothing to collect.
                log.debug("worker %s: nothing pending (%s)", wid, exc.detail or exc)
                return None
            raise
        return parse_step_response(data, [wid])[wid]

    def reset_call(
        self, wids: list[str], *, any_5xx: bool = False, await_job: bool = False
    ) -> tuple[Any, Any]:
        """``/reset`` of ``wids``: (decoded reply, response). Repeated while it fails in a way that
        may pass: ``/reset`` is safe to repeat (a worker whose reset is under way or finished gets
        that one back; nothing new is taken) and it creates the workers the server does not know.

        ``any_5xx``: every 5xx is repeated (a recovery: the server is known to be flaky), else only
        lost connections and 502/503/504. ``await_job``: a server without a job (restarted: idle
        until the job is submitted again) is waited for (:meth:`await_job`), then asked again.
        """

        def call() -> tuple[Any, Any]:
            return self.wire.call(self.wire.http, "/reset", {"worker_ids": wids},
                                  timeout=self.wire.timeouts["reset"])

        def again(e: BaseException) -> bool:
            if not isinstance(e, TransportError):
                return False
            if not isinstance(e, HTTPStatusError):
                return True
            if no_job(e):
                return False
            return e.status >= 500 if any_5xx else e.status in (502, 503, 504)

        def told(n: int, e: BaseException, delay: float) -> None:
            if n == 1:
                log.warning("%s; repeating /reset for worker(s) %s (safe to repeat; waiting up to "
                            "%.0f s for the server)", e, ", ".join(wids), self.server_wait)

        def attempt() -> tuple[Any, Any]:
            result: tuple[Any, Any] = retry_call(
                call, retry_on=again, backoff=self._backoff(), on_retry=told,
                interrupt=self.wire.interrupted,
            )
            return result

        try:
            return attempt()
        except HTTPStatusError as exc:
            if not (await_job and no_job(exc)):
                raise
            self.await_job(exc)
            return attempt()

    def restart(self, wid: str, reason: str, *, detail: str = "") -> None:
        """Discard the worker's episode: ``/kill`` (the server re-queues the seed), ``/reset``.

        ``reason`` is short (the ``episode_restarted`` event, the log); ``detail`` (the failed
        call) is added in the recording's ``INCOMPLETE`` marker.
        """
        c = self.c
        st = c._state[wid]
        eid = st.episode_id
        c._fold.abort(wid, f"restarted: {reason}" + (f" ({detail})" if detail else ""))
        c.kill([wid])
        # (/reset re-creates a worker the server does not know: a restarted server's)
        data, _ = self.reset_call([wid], any_5xx=True, await_job=True)
        entry = parse_step_response(data, [wid])[wid]
        st.rearm()
        st.out.executed_steps = 0
        c._fold.apply(wid, entry, first=True)
        if eid is None:
            # No episode had started on this worker (its first reset was lost): nothing restarted.
            log.info("worker %s: reset again (%s)", wid, reason)
            return
        c.stats["restarts"] += 1
        log.info("worker %s: episode %s restarted (%s)", wid, eid, reason)
        c._fold.emit("episode_restarted", {"worker_id": wid, "episode_id": eid, "reason": reason})

    # -- settling failed requests -------------------------------------------------------------

    def settle_in_flight(self) -> None:
        """Before ``close()`` kills anything: a worker whose request was cut short by Ctrl-C,
        SIGTERM or ``interrupt()`` may have had its episode ended by that request. Ask the server
        (one quick ``/reset_result``); if it did, record the episode (its result now, or by the
        next client on that worker id) instead of killing the worker, which would discard the
        result."""
        c = self.c
        for wid, st in c._state.items():
            sent = st.in_flight
            if sent is None:
                continue
            st.in_flight = None
            try:
                entry = self.probe(wid, quick=True)
                if entry is None:
                    continue  # still mid-episode: the kill re-queues it
                if not entry.reset_pending:
                    st.unconfirmed = sent
                elif sent.chunked:
                    # Ended within the chunk, result to come: how many of the chunk's actions ran
                    # is unknown. The next client collects the result into the INCOMPLETE marker.
                    c._fold.abort(
                        wid,
                        "stopped during this episode's last /step_chunk, which ended it on the "
                        "server: how many of that chunk's actions ran is unknown",
                    )
                    st.ended_unrecorded()
                else:
                    # The single action ran and ended the episode: it is recorded; the result
                    # comes with the next client's /reset_result (the worker is left resetting).
                    c._fold.executed(wid, list(sent.actions), sent.meta, chunked=False)
                c._fold.apply(wid, entry, first=False)
                log.info("worker %s: the interrupted request ended episode %s", wid, st.episode_id)
            except GenmanipError as exc:
                log.warning("worker %s: cannot settle its interrupted request: %s", wid, exc)

    def recover_step(
        self,
        exc: StepError,
        per_worker: Mapping[str, list[dict[str, Any]]],
        meta: Mapping[str, Mapping[str, Any]],
        *,
        chunked: bool,
    ) -> None:
        c = self.c
        failed = [w for w in exc.workers if w in per_worker]
        for w in failed:
            c._state[w].in_flight = None  # (settled below, or the error stands)
        # "I do not know this worker" (KeyError, no job) is not the request's fault: the server
        # lost the worker (restarted). Settled like any uncertain failure, below: nothing is ever
        # resent, the probe finds nothing pending, the episode restarts on a re-created worker.
        unknown = unknown_workers(exc, failed, polled=False)
        if not (exc.transient or unknown) or not failed:
            raise exc
        if not self.can_recover(failed):
            self.give_up(exc, failed)
        self.count_failure(exc, failed)
        if not exc.sent:
            # Nothing reached the server. Wait until it answers; the workers are as they were --
            # unless it is a new process (a restart while this client was between requests):
            # then they are gone, and the next request would meet KeyError.
            self.await_server(exc)
            self.reattach_after_outage(exc)
            return
        view = ServerView(self, exc)
        for wid in failed:
            entry = self.resolve(exc, wid, "the failed request may have run", view=view)
            if entry is not None:
                # The worker is resetting: the failed request ended its episode.
                c._state[wid].unconfirmed = SentActions(tuple(per_worker[wid]), meta.get(wid) or {},
                                                        chunked)
                c._fold.apply(wid, entry, first=False)

    def recover_poll(self, exc: GenmanipError, ids: list[str]) -> None:
        # These workers are resetting as far as this client knows: "no pending reset result"
        # (or KeyError, no job) means the server lost their resets -- it restarted.
        if not (transient(exc) or unknown_workers(exc, ids, polled=True)):
            raise exc
        if not self.can_recover(ids):
            self.give_up(exc, ids)
        self.count_failure(exc, ids)
        view = ServerView(self, exc)
        for wid in ids:
            # Nothing pending means the lost reply consumed the finished reset: the previous
            # episode's result and the next one's first observation are gone, and the worker is
            # already stepping an episode we never saw.
            entry = self.resolve(
                exc,
                wid,
                "its first observation was lost with a reply",
                lost="the server finished this episode, but the reply carrying its result was lost",
                view=view,
            )
            if entry is not None:
                self.c._fold.apply(wid, entry, first=False)

    def resolve(
        self, exc: GenmanipError, wid: str, reason: str, *, lost: str | None = None,
        view: ServerView | None = None,
    ) -> WorkerEntry | None:
        """Settle one worker after ``exc``, a transient failure that may or may not have run.

        Returns the worker's entry if a reset is under way or finished (the failed request ended
        its episode). Otherwise the worker is mid-episode in a state nobody can know: its
        recording is aborted (with ``lost`` as the reason if given) and the episode restarted
        (``reason``), and None is returned. Never resends. A failure while settling re-raises
        ``exc``, chained to its cause.

        With ``view``, a worker with nothing pending is looked up in ``/status``: one the server
        does not know (it restarted, see :meth:`reattach_after_outage` for why nothing counts
        twice) is re-created by the restart, and its reasons say so.
        """
        short = str(exc).split(";")[0]
        try:
            entry = self.probe(wid)
        except GenmanipError as err:
            self._mark_gone(exc, err)
            raise exc from err
        if entry is None:
            # (a job that is gone for good or changed raises its own, clear error here)
            if view is not None and not view.knows(wid):
                reason = RESTARTED
                if lost is not None:
                    lost = RESULT_DIED
            if lost is not None:
                # (outside the try: a recording failure is its own error, not a network one)
                self.c._fold.abort(wid, f"{lost} ({short})")
            try:
                self.restart(wid, reason, detail=short)
            except TransportError as err:
                raise exc from err  # (a job that never came back raises its own, clear error)
        return entry

    # -- a server that went away --------------------------------------------------------------

    def await_server(self, exc: GenmanipError) -> None:
        """Wait (up to :attr:`server_wait`) until the server answers again; else raise ``exc``,
        marked unreachable (exit 6) and saying how long it was waited for. The wait is announced
        (``waiting_for_server`` event: ``until`` is a ``time.monotonic()`` deadline) so a progress
        line can count it down, and its end too (``server_back``)."""
        c = self.c
        c._fold.emit("waiting_for_server", {"worker_ids": list(c.worker_ids),
                                       "until": time.monotonic() + self.server_wait,
                                       "reason": str(exc).split(";")[0]})
        try:
            retry_call(
                self.wire.docs,
                retry_on=lambda e: isinstance(e, TransportError),
                backoff=self._backoff(initial=0.5, max_delay=5.0),
                interrupt=self.wire.interrupted,
            )
        except GenmanipError as derr:
            self._mark_gone(exc, derr)
            raise exc from derr
        c._fold.emit("server_back", {"worker_ids": list(c.worker_ids)})

    def _mark_gone(self, exc: GenmanipError, cause: BaseException) -> None:
        """``cause`` (what waiting for the server ended with) says it is unreachable: ``exc``
        (about to be raised) exits 6, says for how long, and close() will not call the server."""
        if isinstance(cause, TransportError) and not isinstance(cause, HTTPStatusError):
            self.c.unreachable = True
            exc.exit_code = ExitCode.UNREACHABLE  # type: ignore[misc]
            exc.hint = exc.hint or (
                f"the server at {self.c.base_url} did not answer for {self.server_wait:.0f} s; "
                "finished episodes are kept: run again with the same run id once it is back"
            )

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
    # that recording is marked INCOMPLETE with the reason (RESULT_DIED), never waited for.

    def reattach_after_outage(self, exc: GenmanipError) -> None:
        """The server answers again after being unreachable: if it lost this client's workers (a
        new process), re-create each unfinished one and restart its episode (see above)."""
        from .worker import Phase

        view = ServerView(self, exc)
        short = str(exc).split(";")[0]
        for wid in self.c.worker_ids:
            st = self.c._state[wid]
            if st.phase is Phase.FINISHED or view.knows(wid):
                continue
            if st.phase is Phase.AWAITING_RESULT:
                self.c._fold.abort(wid, f"{RESULT_DIED} ({short})")
            try:
                self.restart(wid, RESTARTED, detail=short)
            except TransportError as err:
                raise exc from err

    def known_workers(self, exc: GenmanipError) -> set[str] | None:
        """The worker ids the server has (``/status`` ``active_workers``; None when it does not
        say), once it has this client's job: a server without one is waited for
        (:meth:`await_job`), one running another run is an error."""
        status = self.c.status()
        if status.get("benchmark_id") is None or status.get("run_id") is None:
            status = self.await_job(exc)
        self.check_same_run(status, exc)
        active = status.get("active_workers")
        return {str(w) for w in active} if isinstance(active, list) else None

    def run_label(self) -> str:
        """This client's run, for messages: its run id, else that of its last episode id."""
        if self.c.run_id:
            return f"run {self.c.run_id}"
        eid = next((st.episode_id for st in self.c._state.values() if st.episode_id), None)
        return f"the run of episode {eid}" if eid else "this client's run"

    def check_same_run(self, status: Mapping[str, Any], exc: GenmanipError) -> None:
        """Refuse to re-attach to a job of another run (the server restarted with another job,
        or someone started one): its episodes would be recorded as this run's."""
        bench, run = status.get("benchmark_id"), status.get("run_id")
        eids = [st.episode_id for st in self.c._state.values() if st.episode_id]
        if eids:
            same = any(str(e).startswith(f"{bench}/{run}/") for e in eids)
        else:
            same = not self.c.run_id or run == self.c.run_id
        if not same:
            rid = self.c.run_id or "RUN_ID"
            raise GenmanipEvalError(
                f"the server's job is now run {run!r} of {bench!r}, not {self.run_label()}: it "
                "restarted with another job or someone started one; not mixing runs",
                hint=f"resume the run: gmp submit CONFIG... --run-id {rid}, then gmp eval --run-id "
                f"{rid} again (finished episodes are kept)",
            ) from exc

    def await_job(self, exc: GenmanipError) -> dict[str, Any]:
        """Wait (up to ``reset_deadline``) until the server has a job again; return its status.

        A restarted server is idle: the job was in the dead process's memory. The protocol brings
        it back only by ``/start_new_job`` with the job's config paths (facts §9.2), which a client
        does not have -- and that call kills every worker of every client of the server, so a
        client sending it would kill its siblings' re-created workers. Whoever submitted the job
        submits it again with the same run id (the server keeps every seed finished on disk); the
        client waits for it, saying so, then re-creates its workers.
        """
        deadline = self.wire.timeouts["reset_deadline"]
        rid = self.c.run_id or "RUN_ID"
        base_url = self.c.base_url
        t0 = time.monotonic()
        note_at = 0.0
        while True:
            status = self.c.status()
            if status.get("benchmark_id") is not None and status.get("run_id") is not None:
                log.warning("the server has a job again (run %s): re-attaching", status.get("run_id"))
                return status
            waited = time.monotonic() - t0
            if waited >= deadline:
                raise GenmanipEvalError(
                    f"the server at {base_url} has had no job for {waited:.0f} s (it restarted "
                    f"and {self.run_label()} was not submitted again)",
                    hint=f"submit it again: gmp submit CONFIG... --run-id {rid}; then gmp eval "
                    f"--run-id {rid} (finished episodes are kept)",
                ) from exc
            if waited >= note_at:
                log.warning(
                    "the server at %s has no job (it restarted?): waiting up to %.0f s for %s to be "
                    "submitted again (gmp submit CONFIG... --run-id %s)",
                    base_url, deadline - waited, self.run_label(), rid,
                )
                note_at = waited + 30.0
            self.wire.wait(min(1.0, max(0.0, deadline - waited)))


class ServerView:
    """What the server knows, from one ``GET /status`` per recovery, fetched only when needed."""

    def __init__(self, recovery: Recovery, exc: GenmanipError) -> None:
        self._recovery = recovery
        self._exc = exc
        self._fetched = False
        self._known: set[str] | None = None
        self._told = False

    def knows(self, wid: str) -> bool:
        """False when the server does not have worker ``wid`` (a restarted server's case)."""
        from .worker import Phase

        if not self._fetched:
            self._fetched = True
            try:
                self._known = self._recovery.known_workers(self._exc)
            except (TransportError, ResponseError) as err:
                # /status unusable: assume known. A lost worker is re-created all the same (the
                # restart's /reset creates it), or met at the next request (KeyError).
                log.debug("GET /status failed (%s): cannot tell whether the server restarted", err)
        known = self._known
        if known is None or wid in known:
            return True
        if not self._told:
            self._told = True
            c = self._recovery.c
            lost = [w for w in c.worker_ids
                    if c._state[w].phase is not Phase.FINISHED and w not in known]
            log.warning(
                "the server at %s no longer knows worker(s) %s (it restarted, or they were killed): "
                "re-creating them and restarting their episodes from the first step (nothing is resent)",
                c.base_url, ", ".join(lost),
            )
        return False


# ---------------------------------------------------------------------- classifiers

#: A 500 naming one of these was raised by the request's content (a wrong action shape, an unknown
#: worker, ...): sending it again would fail again, so it is not recovered from.
_REQUEST_FAULT = re.compile(
    r"\b(ValueError|TypeError|KeyError|IndexError|AttributeError|AssertionError|NotImplementedError)\b"
)


def transient(exc: BaseException) -> bool:
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


def no_job(exc: BaseException) -> bool:
    """Does ``exc`` say the server has no job (a 500 naming ``No job started``)?"""
    detail = getattr(exc, "detail", None) or ""
    return getattr(exc, "status", None) == 500 and _NO_JOB in detail


def unknown_workers(exc: BaseException, wids: Iterable[str], *, polled: bool) -> list[str]:
    """The workers of ``wids`` that the reply ``exc`` says the server does not know (all of them
    when it has no job). ``polled``: the request was a ``/reset_result`` poll of workers this
    client holds as resetting, so "no pending reset result" means the server lost their reset."""
    ids = list(wids)
    if getattr(exc, "status", None) != 500:
        return []
    if no_job(exc):
        return ids
    detail = (getattr(exc, "detail", None) or "").strip()
    m = _UNKNOWN_WORKER.match(detail) or (_NO_PENDING.search(detail) if polled else None)
    return [m.group("wid")] if m and m.group("wid") in ids else []
def step_error(exc: GenmanipError, route: str, workers: list[str], timeout: float) -> StepError:
    """The :class:`StepError` of a failed ``/step`` or ``/step_chunk``: whether it was sent, may
    have run, and is transient (recovered from)."""
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
            transient=transient(exc),
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
