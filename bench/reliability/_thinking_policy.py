"""The testbed's expert policy with an inference time (``--policy _thinking_policy:make``).

A real policy spends tens to hundreds of milliseconds per action, so a server that dies between
two requests usually dies while the client is thinking: the client finds the connection closed
before it sends the next request (nothing sent), not a request cut short. The server-restart runs
use this policy so that moment is the common one, as it is in a real evaluation.

Args (strings, ``--policy-arg``): ``think_ms`` (default 50), plus the expert's own arguments.
"""

from __future__ import annotations

import time
from typing import Any

from genmanip_testbed.policies import expert


class ThinkingPolicy:
    """Delegates to the expert, sleeping ``think_ms`` before each action (or chunk)."""

    def __init__(self, inner: Any, think_s: float) -> None:
        self.inner = inner
        self.think_s = think_s

    def reset(self) -> None:
        self.inner.reset()

    def get_action(self, obs: Any) -> Any:
        time.sleep(self.think_s)
        return self.inner.get_action(obs)


def make(**kwargs: Any) -> ThinkingPolicy:
    """Factory: ``think_ms`` and the expert's arguments (all strings)."""
    think_ms = float(kwargs.pop("think_ms", 50))
    return ThinkingPolicy(expert(**kwargs), think_ms / 1000.0)
