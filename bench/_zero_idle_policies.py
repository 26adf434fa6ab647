"""Policies of ``bench/zero_idle.py`` (imported by spec in spawned processes: keep it importable).

``gpu`` is a synthetic GPU-like batched policy: a call on a batch of n observations costs
``base_ms + per_ms * n`` (sleep, so the GIL is free, as it is while a GPU computes). The lockstep
runner calls it with batches of one. ``free`` costs nothing. ``gpu_per_worker`` is the same cost
at a batch of one behind the per-worker ``get_action(obs)``: what the issue-time runner (which
has no batched interface) calls; importable with that commit's packages (nothing newer is
imported at run time).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from genmanip_protocol.robots import get_robot

if TYPE_CHECKING:
    from genmanip_eval.inference import BatchItem


class GpuLike:
    def __init__(self, base_ms: float, per_ms: float) -> None:
        self.base_s = base_ms / 1000.0
        self.per_s = per_ms / 1000.0

    def get_actions(self, batch: Sequence[BatchItem]) -> list[dict[str, Any]]:
        if self.base_s or self.per_s:
            time.sleep(self.base_s + self.per_s * len(batch))
        return [get_robot(str(it.obs["robot_id"])).neutral_action() for it in batch]


def gpu(base_ms: str = "30", per_ms: str = "2") -> GpuLike:
    return GpuLike(float(base_ms), float(per_ms))


def free() -> GpuLike:
    return GpuLike(0.0, 0.0)


class PerWorker:
    def __init__(self, base_ms: float, per_ms: float) -> None:
        self.call_s = (base_ms + per_ms) / 1000.0

    def get_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        time.sleep(self.call_s)
        return get_robot(str(obs["robot_id"])).neutral_action()


def gpu_per_worker(base_ms: str = "30", per_ms: str = "2") -> PerWorker:
    return PerWorker(float(base_ms), float(per_ms))
