"""The tunables of one emulated evaluation server (:class:`CoreConfig`).

Owns nothing but the values. Every room of the core (the ledger, the resets, the finalizer) keeps
a reference to the one instance and reads it when it acts, not when it is built, so a test that
changes a value on a running server (``core.cfg.reset_delay``, ``core.cfg.lock_stale_s``) is heard.
"""

from __future__ import annotations

from pathlib import Path

from genmanip_protocol.robots import RobotSpec, get_robot

__all__ = ["CoreConfig"]


class CoreConfig:
    """Tunables of :class:`~genmanip_testbed.core.EvalCore` (times in seconds)."""

    def __init__(
        self,
        *,
        robot: str | RobotSpec = "manip/lift2/R5a",
        results_root: Path,
        save_process: bool = False,
        capacity: int = 8,
        reset_delay: float = 0.03,
        num_steps: int | None = None,
        is_rel_default: bool = False,
        render: bool = True,
        rescan_interval: float = 0.05,
        next_task_timeout: float = 600.0,
        lock_stale_s: float = 300.0,
        frame_cache: bool = True,
        video_fps: int = 30,
        world_seed: int = 0,
    ) -> None:
        self.robot = get_robot(robot)
        self.results_root = Path(results_root)
        self.save_process = save_process
        self.capacity = int(capacity)
        self.reset_delay = float(reset_delay)
        self.num_steps = num_steps
        self.is_rel_default = is_rel_default
        self.render = render
        self.rescan_interval = rescan_interval
        self.next_task_timeout = next_task_timeout
        self.lock_stale_s = lock_stale_s
        self.frame_cache = frame_cache
        self.video_fps = video_fps
        self.world_seed = int(world_seed)
