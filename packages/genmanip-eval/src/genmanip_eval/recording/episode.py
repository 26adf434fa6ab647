"""One episode being recorded (:class:`Episode`): the step loop's bookkeeping (which frame and
state each observation was, the ``steps.jsonl`` rows of executed actions), and what the recovery
notes keep of it (:meth:`Episode.describe`, :meth:`Episode.from_note`).

Internal to :mod:`genmanip_eval.recording`. An ``Episode`` is made and changed by the step loop
only; the writer and transcoder threads read it (its directory, ids, cameras, step count) and key
their own state by it.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["Episode", "now"]


def now() -> str:
    """The time now, as recorded (``started``, ``finished``): ISO 8601, UTC, milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _state_of(obs: Any) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for key, name in (("state.joints", "joints"), ("state.gripper", "gripper"), ("state.base", "base")):
        v = obs.get(key)
        if v is not None:
            out[name] = v
    return out or None


@dataclass
class Episode:
    """Main-thread bookkeeping of one episode being recorded."""

    episode_id: str
    directory: Path
    run_dir: Path
    task_name: str
    seed: str
    worker_id: str
    robot_id: str | None
    instruction: str | None
    started: str
    cameras: list[str] = field(default_factory=list)
    frames: int = 0
    steps: int = 0
    ts_frame: dict[int, int] = field(default_factory=dict)
    states: dict[int, Any] = field(default_factory=dict)
    state_used: set[int] = field(default_factory=set)
    last_ts: int | None = None
    #: the server ended it; its result is awaited
    awaiting: bool = False
    #: Which attempt at the episode directory this is (host, pid, a random part): written into its
    #: INCOMPLETE marker, so an abort that reaches the writer late never touches the files of a
    #: later attempt. The server re-queues an aborted seed at once; another process (or host)
    #: may already be recording it in the same directory.
    attempt: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}")

    def observed(self, ts: int, obs: Any) -> None:
        """Observation ``ts`` (frame ``frames``) arrived: keep its state for the actions that follow."""
        self.ts_frame[ts] = self.frames
        self.states[ts] = _state_of(obs)
        # Bounded: only observations a (chunk-buffered) action may still refer to are kept.
        if len(self.states) > 256:
            for old in sorted(self.states)[:-128]:
                self.states.pop(old, None)
        self.last_ts = ts

    def rows(
        self,
        worker_id: str,
        actions: list[dict[str, Any]],
        *,
        obs_timesteps: list[int | None],
        chunk: list[dict[str, int] | None],
        latency: dict[str, float | None] | None,
        batch_size: int | None,
    ) -> list[dict[str, Any]]:
        """The ``steps.jsonl`` rows of actions the server executed (``Recorder.executed``); each
        observation's state goes into the first row that refers to it."""
        rows = []
        for i, action in enumerate(actions):
            ots = obs_timesteps[i] if i < len(obs_timesteps) else self.last_ts
            if ots is None:
                ots = self.last_ts
            state = None
            if ots is not None and ots not in self.state_used:
                self.state_used.add(ots)
                state = self.states.get(ots)
            rows.append(
                {
                    "episode_id": self.episode_id,
                    "worker_id": worker_id,
                    "robot_id": self.robot_id,
                    "step": self.steps,
                    "obs_timestep": ots,
                    "frame": self.ts_frame.get(ots) if ots is not None else None,
                    "state": state,
                    "action": action,
                    "chunk": chunk[i] if i < len(chunk) else None,
                    "latency_ms": latency if i == 0 else None,
                    **({"batch_size": batch_size} if i == 0 and batch_size is not None else {}),
                }
            )
            self.steps += 1
        return rows

    def describe(self) -> dict[str, Any]:
        """What a later recorder needs to finish this episode (pending/awaiting result files)."""
        return {
            k: getattr(self, k)
            for k in ("episode_id", "task_name", "seed", "worker_id", "robot_id", "instruction", "started", "steps")
        }

    @classmethod
    def from_note(cls, note: Mapping[str, Any], directory: Path, run_dir: Path) -> Episode:
        """The inverse of :meth:`describe` (KeyError/TypeError/ValueError on a damaged note)."""
        return cls(
            episode_id=str(note["episode_id"]), directory=directory, run_dir=run_dir,
            task_name=str(note["task_name"]), seed=str(note["seed"]), worker_id=str(note["worker_id"]),
            robot_id=note.get("robot_id"), instruction=note.get("instruction"),
            started=str(note["started"]), steps=int(note["steps"]),
        )
