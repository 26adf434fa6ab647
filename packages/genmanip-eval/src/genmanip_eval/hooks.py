"""Episode hooks: work that runs after an episode is completely recorded.

Hooks live in other distributions (``gmp eval --plot-on-episode-end`` uses the ``plot`` hook of
genmanip-artifacts) and are found by name through the ``genmanip.episode_hooks`` entry-point
group, so genmanip-eval never imports a package that sits above it.

A hook factory returns a callable ``hook(episode_dir: Path) -> None`` that must return quickly
(queue the work) and may have ``close(timeout) -> int`` returning how many runs failed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from genmanip_protocol.errors import ExitCode

from .errors import GenmanipEvalError
from .plugins import entry_points_of, providers

__all__ = ["EPISODE_HOOK_GROUP", "HookNotInstalledError", "load_episode_hook"]

EPISODE_HOOK_GROUP = "genmanip.episode_hooks"



class HookNotInstalledError(GenmanipEvalError):
    """No installed distribution provides the requested episode hook."""

    exit_code = ExitCode.NOT_INSTALLED


def load_episode_hook(name: str) -> Callable[[Path], Any]:
    """Create the episode hook registered under ``name`` in ``genmanip.episode_hooks``.

    Raises:
        HookNotInstalledError: nothing provides it; the message names the package to install.
    """
    for ep in entry_points_of(EPISODE_HOOK_GROUP):
        if ep.name == name:
            factory = ep.load()
            hook: Callable[[Path], Any] = factory()
            return hook
    dist = providers(EPISODE_HOOK_GROUP).get(name)
    raise HookNotInstalledError(
        f"episode hook {name!r} is not installed",
        hint=f"pip install {dist}" if dist else (
            f"install the distribution that registers it under "
            f'[project.entry-points."{EPISODE_HOOK_GROUP}"]'
        ),
    )
