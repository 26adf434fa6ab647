"""Helpers of genmanip-serve's tests: test policies, and a server process entry point.

``python -m serve_helpers '<json kwargs>'`` runs :func:`genmanip_serve.cli.serve` (the handler of
``gmp policy serve``) with those keyword arguments, as ``gmp`` would, and exits 130 on Ctrl-C:
the package's own tests cannot use the ``gmp`` command (it belongs to the meta package).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from genmanip_protocol.robots import get_robot

ROBOT = "manip/lift2/R5a"


def make_obs(i: int = 0, *, robot: str = ROBOT, cameras: bool = True, episode: str = "b/r/t/0") -> dict[str, Any]:
    """A GenManip observation of ``robot`` (frames all ``i % 256``)."""
    spec = get_robot(robot)
    obs: dict[str, Any] = {
        "instruction": "pick up the red block",
        "state.joints": np.linspace(0.0, 1.0, spec.joints_dim),
        "state.gripper": np.full(spec.gripper_dim, 0.044),
        "state.base": np.zeros(3),
        "timestep": i,
        "reset": i == 0,
        "episode_id": episode,
        "robot_id": spec.robot_id,
    }
    if cameras:
        for key, shape in spec.cameras.items():
            obs[f"video.{key}"] = np.full(shape, i % 256, dtype=np.uint8)
    return obs


class Echo:
    """Per-worker: the no-op action, with the observation's timestep in ``base_motion[0]``."""

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        a = get_robot(str(obs["robot_id"])).neutral_action()
        a["base_motion"] = [float(obs.get("timestep", 0)), 0.0, 0.0]
        return a

    def get_action_chunk(self, obs: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [self.get_action(obs) for _ in range(3)]


def echo(**kwargs: str) -> Echo:
    return Echo()


class Costly(Echo):
    """Every call costs ``ms`` milliseconds (a GPU's fixed cost: worth a batch, and worth waiting
    for the other connections' requests; a free call is not)."""

    def __init__(self, ms: float) -> None:
        self.delay = ms / 1000.0

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        time.sleep(self.delay)
        return super().get_action(obs)


def costly(ms: str = "20") -> Costly:
    return Costly(float(ms))


class Dying(Echo):
    """Kills its own process (no reply, no close frame) when the instruction is ``die``."""

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        if obs.get("instruction") == "die":
            os._exit(3)
        return super().get_action(obs)


def dying(**kwargs: str) -> Dying:
    return Dying()


class Slow(Echo):
    """Sleeps ``delay`` seconds per call when the instruction is ``slow``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        if obs.get("instruction") == "slow":
            time.sleep(self.delay)
        return super().get_action(obs)


def slow(delay: str = "3") -> Slow:
    return Slow(float(delay))


class Failing(Echo):
    """Raises when the instruction is ``fail``."""

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        if obs.get("instruction") == "fail":
            raise RuntimeError("the model is out of cheese")
        return super().get_action(obs)


def failing(**kwargs: str) -> Failing:
    return Failing()


def jpeg_obs(i: int = 0, **kwargs: Any) -> Any:
    """:func:`make_obs` as the GenManip server's JPEG frames arrive: an ``Observation`` whose
    cameras are undecoded ``JpegFrame`` values (a gradient, so decoding is not trivial)."""
    from genmanip_protocol import Observation
    from genmanip_protocol.codec import JpegFrame

    obs = make_obs(i, **kwargs)
    for k in [k for k in obs if k.startswith("video.")]:
        h, w, _ = obs[k].shape
        grad = (np.add.outer(np.arange(h), np.arange(w)) + 7 * i) % 256
        obs[k] = JpegFrame.encode(np.repeat(grad[:, :, None], 3, axis=2).astype(np.uint8))
    return Observation(obs)


#: What :class:`Looking` saw, in the serving process: (worker id, camera, arrived encoded,
#: JPEG bytes it arrived as or None, the decoded frame).
SEEN: list[tuple[str, str, bool, bytes | None, np.ndarray]] = []


class Looking:
    """Batched: reads every camera (``base_motion`` = the mean of each of the first three)."""

    def get_actions(self, batch: Any) -> list[dict[str, Any]]:
        out = []
        for it in batch:
            obs = it.obs
            cams = sorted(k for k in obs.keys() if k.startswith("video."))
            means = []
            for k in cams:
                encoded = obs.is_encoded(k)
                frame = obs[k]
                SEEN.append((it.worker_id, k, encoded, obs.frame_bytes(k), frame))
                means.append(float(np.asarray(frame, dtype=np.float64).mean()))
            a = get_robot(str(obs["robot_id"])).neutral_action()
            a["base_motion"] = [*means, 0.0, 0.0, 0.0][:3]
            out.append(a)
        return out


def looking(**kwargs: str) -> Looking:
    SEEN.clear()
    return Looking()


#: Instances of :class:`Counted` alive (made, not yet closed), and how many were made / closed.
LIVE: set[int] = set()
COUNTS = {"made": 0, "closed": 0}


class Counted(Echo):
    """Per-worker, counting its live instances (``close()`` ends one)."""

    def __init__(self) -> None:
        COUNTS["made"] += 1
        LIVE.add(id(self))

    def close(self) -> None:
        COUNTS["closed"] += 1
        LIVE.discard(id(self))


def counted(**kwargs: str) -> Counted:
    return Counted()


#: Worker ids :class:`Dropping` was told to forget.
DROPPED: list[str] = []


class Dropping:
    """Batched, with the optional ``drop(worker_id)``."""

    def get_actions(self, batch: Any) -> list[dict[str, Any]]:
        return [get_robot(str(it.obs["robot_id"])).neutral_action() for it in batch]

    def drop(self, worker_id: str) -> None:
        DROPPED.append(worker_id)


def dropping(**kwargs: str) -> Dropping:
    DROPPED.clear()
    return Dropping()


def main() -> int:
    from genmanip_runtime.console import Console
    from genmanip_serve.cli import serve

    kwargs: dict[str, Any] = {
        "policy": "serve_helpers:echo", "policy_arg": [], "host": "127.0.0.1", "port": 0,
        "max_batch": None, "max_wait_ms": None, "api_key": None, "max_message_mb": None,
    }
    kwargs.update(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    try:
        return serve(**kwargs, console=Console())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Ctrl-C as in a terminal's foreground job: a CI script's background job starts its children
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
