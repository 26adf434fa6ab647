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
