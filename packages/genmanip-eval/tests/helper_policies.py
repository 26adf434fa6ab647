"""Policies used by the tests (importable by spawned worker processes)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from genmanip_eval.policy import ZeroPolicy


class CountingChunkPolicy:
    """Zero actions in chunks of ``size``; counts calls."""

    def __init__(self, size: str = "3") -> None:
        self.size = int(size)
        self.zero = ZeroPolicy()
        self.resets = 0
        self.calls = 0

    def reset(self) -> None:
        self.resets += 1

    def get_action_chunk(self, obs: Any) -> list[dict[str, Any]]:
        self.calls += 1
        return [self.zero.get_action(obs) for _ in range(self.size)]


def chunky(**kw: str) -> CountingChunkPolicy:
    return CountingChunkPolicy(**kw)


class Killer:
    """Zero actions; SIGKILLs its own process at the ``at``-th action (after ``wait`` s)."""

    def __init__(self, at: str = "10", wait: str = "0") -> None:
        self.at = int(at)
        self.wait = float(wait)
        self.n = 0
        self.zero = ZeroPolicy()

    def reset(self) -> None:
        pass

    def get_action(self, obs: Any) -> dict[str, Any]:
        self.n += 1
        if self.n >= self.at:
            time.sleep(self.wait)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.zero.get_action(obs)


def killer(**kw: str) -> Killer:
    return Killer(**kw)


class Raiser:
    def get_action(self, obs: Any) -> dict[str, Any]:
        raise RuntimeError("policy exploded")


def raiser(**kw: str) -> Raiser:
    return Raiser()


class BatchedRecorder:
    """A batched policy (one instance for every worker): zero actions; records what it was given.

    ``sleep_ms`` is the cost of a call (a sleep, as a GPU forward pass leaves the GIL free).
    """

    instances: list[BatchedRecorder] = []

    def __init__(self, sleep_ms: str = "0", chunk: str = "0") -> None:
        self.sleep_s = float(sleep_ms) / 1000.0
        self.chunk = int(chunk)
        self.zero = ZeroPolicy()
        self.batches: list[list[tuple[str, Any, bool]]] = []
        self.resets: list[str] = []
        BatchedRecorder.instances.append(self)

    def reset(self, worker_id: str) -> None:
        self.resets.append(worker_id)

    def get_actions(self, batch: Any) -> list[dict[str, Any]]:
        self.batches.append([(it.worker_id, it.episode_id, it.new_episode) for it in batch])
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [self.zero.get_action(it.obs) for it in batch]

    def get_action_chunks(self, batch: Any) -> list[list[dict[str, Any]]]:
        acts = self.get_actions(batch)
        return [[a] * max(1, self.chunk) for a in acts]


def batched(**kw: str) -> BatchedRecorder:
    return BatchedRecorder(**kw)


class WrongBatch:
    """A batched policy that returns one action too few."""

    def get_actions(self, batch: Any) -> list[dict[str, Any]]:
        return [ZeroPolicy().get_action(it.obs) for it in batch][1:]


def wrong_batch(**kw: str) -> WrongBatch:
    return WrongBatch()
