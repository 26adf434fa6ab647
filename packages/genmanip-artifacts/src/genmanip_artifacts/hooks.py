"""Episode hooks that ``gmp eval`` discovers through the ``genmanip.episode_hooks`` entry point.

genmanip-eval must not import this package (dependencies flow one way), so it looks hooks up by
name: ``gmp eval --plot-on-episode-end`` loads the ``plot`` hook registered in this package's
``pyproject.toml``. The hook keeps plotting off the evaluation's hot path: each finished episode
is plotted in a separate, niced Python process, one at a time, in the order episodes finish.
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["PlotHook", "plot_hook"]

log = logging.getLogger(__name__)


class PlotHook:
    """Plot finished episodes in the background (``action_plot.png``, ``state_plot.png``,
    ``merged_with_plot.mp4``).

    Call the hook with a complete episode directory; :meth:`close` waits for the queued plots and
    returns how many failed. A failing plot is logged with its one-line reason and never stops the
    evaluation.
    """

    def __init__(self, *, video: bool = True, nice: int = 10) -> None:
        self.video = video
        self.nice = nice
        self.failed: list[tuple[Path, str]] = []
        self.done: list[Path] = []
        self._q: queue.Queue[Path | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="gmp-plot-hook", daemon=True)
        self._thread.start()

    def __call__(self, episode_dir: Path) -> None:
        self._q.put(Path(episode_dir))

    def close(self, timeout: float | None = None) -> int:
        """Wait for every queued plot (at most ``timeout`` seconds); return the number that failed."""
        self._q.put(None)
        self._thread.join(timeout)
        return len(self.failed)

    def _lower_priority(self) -> None:
        os.nice(self.nice)

    def _loop(self) -> None:
        while True:
            ep = self._q.get()
            if ep is None:
                return
            cmd = [sys.executable, "-m", "genmanip_artifacts.hooks", str(ep)]
            if not self.video:
                cmd.append("--no-video")
            proc = subprocess.run(  # noqa: PLW1510 - the return code is inspected below
                cmd,
                capture_output=True,
                text=True,
                preexec_fn=self._lower_priority if self.nice and hasattr(os, "nice") else None,
            )
            if proc.returncode == 0:
                self.done.append(ep)
                log.info("plotted %s", ep)
            else:
                reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                self.failed.append((ep, reason))
                log.warning("plot of %s failed: %s", ep, reason)


def plot_hook() -> PlotHook:
    """Entry point ``genmanip.episode_hooks:plot``: a :class:`PlotHook` with the overlay video."""
    return PlotHook()


def _main(argv: list[str]) -> int:
    from .errors import GenmanipArtifactsError
    from .plot import plot_episode

    video = "--no-video" not in argv
    paths = [a for a in argv if a != "--no-video"]
    if len(paths) != 1:
        print("usage: python -m genmanip_artifacts.hooks EPISODE_DIR [--no-video]", file=sys.stderr)
        return 2
    try:
        plot_episode(paths[0], video=video)
    except GenmanipArtifactsError as exc:
        print(f"{paths[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
