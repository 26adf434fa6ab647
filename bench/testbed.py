"""The testbed's own per-step cost: world step + render + reply encoding, no HTTP.

For a lift2 observation (4 cameras: 2x 480x640 + 2x 720x1280) in both wires (legacy = pickle with
JPEG frames and base64 arrays; msgpack with raw frames), with the frame cache on and off, for a
moving robot (every frame new) and a robot holding still (every frame repeats). Server-side saving
is off. Prints a markdown table of ms/step (median) and the ratio to one memcpy of the observation.

Usage: python bench/testbed.py [--steps N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from genmanip_protocol.codec import LegacyCodec, MsgpackCodec
from genmanip_testbed.app import _Wire
from genmanip_testbed.core import CoreConfig, EvalCore


def _core(root: Path, cache: bool) -> EvalCore:
    core = EvalCore(CoreConfig(results_root=root, reset_delay=0.0, frame_cache=cache, num_steps=10_000))
    core.start_new_job(["testbed/reach/red_block_easy"], "bench")
    core.reset(["0"])
    while core.workers["0"].pending is not None and not core.workers["0"].pending.done():
        time.sleep(0.001)
    core.reset_result(["0"])
    return core


def _action(i: int, moving: bool) -> dict[str, Any]:
    # A small steady drift: every step is a new state (no cache hits); holding repeats one state.
    d = 0.002 if moving else 0.0
    arm = [d, 0.0, 0.0, 0.0, 0.0, 0.0]
    return {"control_type": "joint_position", "action": arm + [0.044, 0.044] + arm + [0.044, 0.044], "is_rel": True}


def _measure(core: EvalCore, wire: _Wire, steps: int, moving: bool) -> float:
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        resp = core.step({"0": _action(i, moving)})
        wire.encode(wire.entries(resp))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def _memcpy_ms(core: EvalCore, repeats: int = 50) -> float:
    ep = core.workers["0"].episode
    assert ep is not None
    obs = ep.observation()
    arrays = [v for v in obs.values() if isinstance(v, np.ndarray)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a in arrays:
            a.copy()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="steps per case (default: %(default)s)")
    args = ap.parse_args()
    pool = ThreadPoolExecutor(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        floor = None
        for cache in (True, False):
            for moving in (True, False):
                for name, codec, frames in (("legacy (pickle, JPEG q85)", LegacyCodec(), "jpeg"),
                                            ("msgpack (raw frames)", MsgpackCodec(), "raw"),
                                            ("msgpack (JPEG frames)", MsgpackCodec(), "jpeg")):
                    core = _core(Path(tmp) / f"{cache}{moving}{frames}{codec.name}", cache)
                    if floor is None:
                        floor = _memcpy_ms(core)
                    wire = _Wire(codec, frames, core, pool)
                    _measure(core, wire, 5, moving)  # warm-up
                    ms = _measure(core, wire, args.steps, moving)
                    rows.append((name, "on" if cache else "off", "moving" if moving else "holding", ms))
                    core.close()
    pool.shutdown()
    assert floor is not None
    print(f"Testbed per-step cost, lift2 observation (4 cameras), {args.steps} steps per case, medians.\n")
    print("| wire | frame cache | robot | ms/step | x memcpy of the obs |")
    print("|---|---|---|---:|---:|")
    for name, cache, moving, ms in rows:
        print(f"| {name} | {cache} | {moving} | {ms:.2f} | {ms / floor:.1f} |")
    print(f"| memcpy of the observation's arrays (floor) | | | {floor:.2f} | 1.0 |")


if __name__ == "__main__":
    main()
