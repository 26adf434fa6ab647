"""One worker's life cycle as the client sees it: an explicit state machine.

Phases and transitions (any other move raises :class:`WorkerStateError`):

=================  =========================================  ================================
transition         from                                       to
=================  =========================================  ================================
``rearm``          any                                        IDLE
``reset_pending``  IDLE, RESETTING, ACTING, AWAITING_RESULT   RESETTING, or AWAITING_RESULT
                                                              when the reported request ended
                                                              the open episode (stays
                                                              AWAITING_RESULT once there)
``act``            IDLE, RESETTING, ACTING, AWAITING_RESULT   ACTING (opens the episode)
``finish``         IDLE, RESETTING, ACTING, AWAITING_RESULT   FINISHED
``ended_unrecorded`` ACTING                                   AWAITING_RESULT
``close_episode``  any (phase kept)                           AWAITING_RESULT becomes RESETTING
=================  =========================================  ================================

* IDLE: before ``reset()`` (and again at its start: ``rearm``).
* RESETTING: ``reset_pending``; no episode of this worker is waiting for a result.
* ACTING: has an observation; an episode is in progress.
* AWAITING_RESULT: ``reset_pending`` after the server ended the episode this client drove; its
  result comes with the reset (``close()`` leaves such a worker alone so the next client collects it).
* FINISHED: the server has no task left for the worker.

Orthogonal to the phase, ``episode_open`` says whether an episode this client saw is still open
(begun by an observation, not yet ended or aborted: what the recorder holds open). It is open in
ACTING (but for the moment a restart aborts it) and closed in FINISHED; in RESETTING it can stay open
while the client has not settled how the episode ended (a failed request's actions awaiting
confirmation, ``unconfirmed``), in AWAITING_RESULT it is closed when the recording was aborted.

Transitions are methods that check their source phase: an illegal one raises
:class:`WorkerStateError` (a bug in the client, never the server's fault). What one call reports
(``executed_steps``, ``lock_lost``, ``stopped_early``) lives apart, in :class:`CallOutput`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from genmanip_protocol.robots import RobotSpec

__all__ = ["CallOutput", "Phase", "SentActions", "StepTiming", "WorkerState", "WorkerStateError"]


@dataclass
class StepTiming:
    """Latency of the last request for one worker, in milliseconds.

    ``server_ms`` comes from the ``X-Genmanip-Server-Ms`` header (the testbed sends it, the real
    server does not: then it and ``network_ms`` are None). ``poll_ms`` is time spent polling
    ``/reset_result`` after an episode ended. The runner fills in ``policy_ms`` (the policy call
    that chose the action), ``queue_ms`` (how long the observation waited for its batch) and
    ``batch_size`` (how many observations that call served).
    """

    total_ms: float = 0.0
    server_ms: float | None = None
    network_ms: float | None = None
    poll_ms: float = 0.0
    policy_ms: float | None = None
    queue_ms: float | None = None
    batch_size: int | None = None

    def as_row(self) -> dict[str, float | None]:
        """The ``latency_ms`` object of a ``steps.jsonl`` row (ms; ``queue`` only when batched)."""
        net = self.network_ms if self.network_ms is not None else self.total_ms
        row = {
            "network": round(net, 3),
            "server": None if self.server_ms is None else round(self.server_ms, 3),
            "policy": None if self.policy_ms is None else round(self.policy_ms, 3),
        }
        if self.queue_ms is not None:
            row["queue"] = round(self.queue_ms, 3)
        return row


class Phase(Enum):
    IDLE = "idle"
    RESETTING = "resetting"
    ACTING = "acting"
    AWAITING_RESULT = "awaiting_result"
    FINISHED = "finished"

    @property
    def pending(self) -> bool:
        """``reset_pending`` on the wire: a reset is under way on the server."""
        return self in (Phase.RESETTING, Phase.AWAITING_RESULT)


class WorkerStateError(RuntimeError):
    """An illegal life-cycle transition: a bug in the client (not a ``GenmanipError``)."""


@dataclass(frozen=True)
class SentActions:
    """Actions of a request whose outcome is not applied yet: ``unconfirmed`` (a failed request
    that turned out to have ended the episode, recorded once the result confirms it) or
    ``in_flight`` (cut short by Ctrl-C / ``interrupt()``; ``close()`` asks the server about it)."""

    actions: tuple[dict[str, Any], ...]
    meta: Mapping[str, Any]
    chunked: bool


@dataclass
class CallOutput:
    """What the current ``reset``/``poll``/``step`` call reports for the worker."""

    executed_steps: int = 0
    lock_lost: bool = False
    stopped_early: bool = False

    def clear(self, *, stopped_early: bool) -> None:
        """Start a call (``stopped_early`` too for ``step``; ``reset``/``poll`` keep it)."""
        self.executed_steps = 0
        self.lock_lost = False
        if stopped_early:
            self.stopped_early = False


_ANY = frozenset(Phase)
_LIVE = frozenset({Phase.IDLE, Phase.RESETTING, Phase.ACTING, Phase.AWAITING_RESULT})


@dataclass
class WorkerState:
    worker_id: str
    obs: Any = None
    metric: Any = None
    episode_result: dict[str, Any] | None = None
    episode_id: str | None = None
    robot: RobotSpec | None = None
    timing: StepTiming = field(default_factory=StepTiming)
    #: consecutive failed requests recovered from (reset by a successful step)
    failures: int = 0
    unconfirmed: SentActions | None = None
    in_flight: SentActions | None = None
    out: CallOutput = field(default_factory=CallOutput)
    _phase: Phase = Phase.IDLE
    _episode_open: bool = False

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def episode_open(self) -> bool:
        return self._episode_open

    @property
    def actionable(self) -> bool:
        return self._phase is Phase.ACTING

    def _move(self, to: Phase, allowed: frozenset[Phase], name: str) -> None:
        if self._phase not in allowed:
            raise WorkerStateError(
                f"worker {self.worker_id}: illegal transition {name} from {self._phase.name}"
            )
        self._phase = to

    # -- transitions ------------------------------------------------------------------------

    def rearm(self) -> None:
        """``reset()`` (or a restart) starts the worker over: IDLE, nothing unconfirmed."""
        self._move(Phase.IDLE, _ANY, "rearm")
        self.unconfirmed = None

    def reset_pending(self, *, ended_here: bool) -> bool:
        """The server reports a reset under way. ``ended_here``: the request just reported ended
        the open episode (it is then AWAITING_RESULT). Returns True when that is new."""
        if self._phase is Phase.AWAITING_RESULT:
            self.obs = None
            return False
        to = Phase.AWAITING_RESULT if ended_here and self._episode_open else Phase.RESETTING
        self._move(to, _LIVE, "reset_pending")
        self.obs = None
        return to is Phase.AWAITING_RESULT

    def ended_unrecorded(self) -> None:
        """The interrupted request ended the episode (recording aborted): its result is to come."""
        self._move(Phase.AWAITING_RESULT, frozenset({Phase.ACTING}), "ended_unrecorded")

    def act(self, obs: Any) -> None:
        """An observation to act on (a new episode's first one or the next of the same)."""
        if obs is None:
            raise WorkerStateError(f"worker {self.worker_id}: act without an observation")
        self._move(Phase.ACTING, _LIVE, "act")
        self.obs = obs
        self._episode_open = True

    def finish(self) -> None:
        """No task left for the worker."""
        self._move(Phase.FINISHED, _LIVE, "finish")
        self.obs = None

    def close_episode(self) -> None:
        """The open episode ended or was aborted; a result awaited for it will not be attributed
        to it (AWAITING_RESULT falls back to RESETTING)."""
        self._episode_open = False
        if self._phase is Phase.AWAITING_RESULT:
            self._phase = Phase.RESETTING
