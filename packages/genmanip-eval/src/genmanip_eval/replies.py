"""Folding the server's replies into each worker's state: the one place an entry becomes
recorded steps, an ended episode, a result, a new observation or a finished worker.

:class:`ReplyFolder` is what :class:`~genmanip_eval.client.EvalClient` and its
:class:`~genmanip_eval.recovery.Recovery` call once a reply is parsed; it tells the client's
listener (the recorder) and its ``on_event`` callback, and keeps the finished episodes' results.
It sends nothing: the requests are the client's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from genmanip_protocol.errors import ValidationError
from genmanip_protocol.robots import get_robot
from genmanip_protocol.schema import EpisodeResult, WorkerEntry

from .worker import Phase, WorkerState

if TYPE_CHECKING:
    from .client import StepListener

__all__ = ["ReplyFolder", "get_key", "timestep_of"]

# (the client's logger: these messages are the client's, and filters on that name keep working)
log = logging.getLogger("genmanip_eval.client")


class ReplyFolder:
    """Applies parsed server entries to the workers' states and tells the listener.

    Args:
        state: the client's per-worker states (shared, not copied).
        stats: the client's counters (``executed_steps``, ``episodes``, ``adopted`` are kept here).
        listener: a :class:`~genmanip_eval.client.StepListener` (the recorder), or None.
        on_event: ``callback(name, payload)``, or None; an exception in it is logged, never raised.
    """

    def __init__(self, state: Mapping[str, WorkerState], *, stats: dict[str, Any],
                 listener: StepListener | None,
                 on_event: Callable[[str, dict[str, Any]], None] | None) -> None:
        self.state = state
        self.stats = stats
        self.listener = listener
        self.on_event = on_event
        #: Every finished episode's result, in arrival order.
        self.episode_results: list[EpisodeResult] = []
        #: How many times the server reported ``lock_lost`` (the episode was aborted and re-queued).
        self.lock_lost_count = 0

    def executed(
        self,
        wid: str,
        executed: list[dict[str, Any]],
        m: Mapping[str, Any],
        *,
        chunked: bool,
        chunk_size: int | None = None,
    ) -> None:
        """Count ``executed`` (the actions the server ran for ``wid``) and hand them to the
        listener with ``m``, the runner's meta for the worker (``obs_timesteps``, ``chunk``)."""
        st = self.state[wid]
        st.out.executed_steps = len(executed)
        counts = self.stats["executed_steps"]
        counts[wid] = counts.get(wid, 0) + len(executed)
        if self.listener is not None and executed:
            base_ts = timestep_of(st.obs)
            obs_ts = list(m.get("obs_timesteps") or [base_ts] * len(executed))[: len(executed)]
            if chunked and not m.get("chunk"):
                size = chunk_size or len(executed)
                chunk: list[dict[str, int] | None] = [{"index": i, "size": size} for i in range(len(executed))]
            else:
                chunk = list(m.get("chunk") or [None] * len(executed))[: len(executed)]
            # (batch_size only when there is one: a listener written for the reference-style
            # loop need not take it)
            extra = {} if st.timing.batch_size is None else {"batch_size": st.timing.batch_size}
            self.listener.executed(
                wid, executed, obs_timesteps=obs_ts, chunk=chunk, latency=st.timing.as_row(), **extra
            )

    def apply(self, wid: str, entry: WorkerEntry, *, first: bool) -> None:
        """Fold one server entry into the worker's state (and tell the listener)."""
        st = self.state[wid]
        if entry.metric is not None:
            st.metric = entry.metric
        listener = self.listener
        if entry.lock_lost:
            st.out.lock_lost = True
            self.lock_lost_count += 1
            eid = get_key(st.obs, "episode_id") or st.episode_id
            log.warning(
                "worker %s: the server lost the episode lock; episode %s was aborted and re-queued", wid, eid
            )
            self.emit("lock_lost", {"worker_id": wid, "episode_id": eid})
            if listener is not None and st.episode_open:
                listener.episode_end(wid, None, lock_lost=True)
            st.close_episode()
            st.unconfirmed = None
        if entry.reset_pending:
            # Not the first reply of a reset, for an open episode whose end is not in doubt: the
            # request just reported ended the episode on the server. Everything of it is recorded
            # except its result, which the next /reset_result brings.
            if st.reset_pending(ended_here=not first and st.unconfirmed is None):
                self.notify("episode_ended", wid)
            return
        was_pending = st.phase.pending
        er = entry.episode_result
        sent, st.unconfirmed = st.unconfirmed, None
        if sent is not None and st.episode_open and er is not None \
                and er.episode_id == st.episode_id and not entry.lock_lost:
            # The failed request ended this episode, so it did run: record it now.
            if sent.chunked:
                self.abort(
                    wid,
                    f"the server finished this episode (score {er.score:g}), but the reply to its "
                    "last /step_chunk was lost: how many of that chunk's actions ran is unknown",
                )
            else:
                self.executed(wid, list(sent.actions), sent.meta, chunked=False)
        if er is not None:
            st.episode_result = er.to_dict()
            self.episode_results.append(er)
            self.stats["episodes"] += 1
            self.emit("episode_finished", {"worker_id": wid, "episode_result": st.episode_result})
        obs: Any = entry.obs  # a decoded (mutable) dict or Observation
        new_episode = obs is not None and (
            first or was_pending or er is not None or entry.lock_lost or bool(get_key(obs, "reset"))
        )
        if st.episode_open and (obs is None or new_episode):
            # The recorded episode ended: with its result, or without one (re-queued, aborted).
            if listener is not None:
                listener.episode_end(wid, er, lock_lost=False)
            st.close_episode()
        elif er is not None:
            # A result for an episode this client did not record to the end: a previous client's
            # (collected on resume) or one whose recording was aborted.
            self.stats["adopted"] += 1
            self.notify("adopt_result", wid, er)
        if obs is not None:
            # Make the flag reliable for the policy: True exactly on an episode's first obs.
            obs["reset"] = bool(new_episode)
            st.episode_id = get_key(obs, "episode_id")
            rid = get_key(obs, "robot_id")
            if rid and (st.robot is None or st.robot.robot_id != rid):
                try:
                    st.robot = get_robot(rid)
                except ValidationError:
                    log.warning("worker %s: unknown robot_id %r (validation needs robot=)", wid, rid)
            if listener is not None:
                listener.observation(wid, obs)
            st.act(obs)
        elif st.phase is not Phase.FINISHED:
            st.finish()
            self.emit("worker_finished", {"worker_id": wid, "metric": st.metric})
            if listener is not None:
                listener.worker_finished(wid, st.metric)

    def abort(self, wid: str, reason: str) -> None:
        """The worker's open episode will not be completed: tell the listener (``episode_aborted``,
        else ``episode_end`` without a result)."""
        st = self.state[wid]
        if st.episode_open and self.listener is not None:
            fn = getattr(self.listener, "episode_aborted", None)
            if fn is not None:
                fn(wid, reason)
            else:
                self.listener.episode_end(wid, None, lock_lost=False)
        st.close_episode()
        st.unconfirmed = None

    def notify(self, name: str, *args: Any) -> None:
        """Call the listener's optional method ``name`` (see :class:`StepListener`) if it has one."""
        fn = getattr(self.listener, name, None)
        if fn is not None:
            fn(*args)

    def emit(self, name: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event(name, payload)
            except Exception:  # a callback bug must not kill the evaluation
                log.exception("on_event callback failed for %s", name)


def get_key(obs: Any, key: str) -> Any:
    """``obs[key]`` of a dict or :class:`~genmanip_protocol.schema.Observation`, or None."""
    if obs is None:
        return None
    try:
        return obs.get(key)
    except AttributeError:
        return None


def timestep_of(obs: Any) -> int | None:
    """``obs["timestep"]`` as an int, or None (no observation, no or a malformed timestep)."""
    ts = get_key(obs, "timestep")
    try:
        return None if ts is None else int(ts)
    except (TypeError, ValueError):
        return None
