"""Policies of ``bench/zero_idle.py`` (imported by spec in spawned processes: keep it importable).

``gpu`` is a synthetic GPU-like batched policy: a call on a batch of n observations costs
``base_ms + per_ms * n`` (sleep, so the GIL is free, as it is while a GPU computes). The lockstep
runner calls it with batches of one. ``free`` costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from genmanip_eval.inference import BatchItem
from genmanip_protocol.robots import get_robot


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
