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
    core = EvalCore(
        CoreConfig(results_root=root, reset_delay=0.0, frame_cache=cache, num_steps=10_000)
    )
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
    return {
        "control_type": "joint_position",
        "action": [*arm, 0.044, 0.044, *arm, 0.044, 0.044],
        "is_rel": True,
    }


def _one(core: EvalCore, wire: _Wire, i: int, moving: bool) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    resp = core.step({"0": _action(i, moving)})
    wire.encode(wire.entries(resp))
    return (time.perf_counter() - w0) * 1000.0, (time.process_time() - c0) * 1000.0


def _obs_arrays(core: EvalCore) -> list[np.ndarray]:
    ep = core.workers["0"].episode
    assert ep is not None
    return [v for v in ep.observation().values() if isinstance(v, np.ndarray)]


def _memcpy_ms(arrays: list[np.ndarray]) -> float:
    t0 = time.perf_counter()
    for a in arrays:
        a.copy()
    return (time.perf_counter() - t0) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="steps per case (default: %(default)s)")
    args = ap.parse_args()
    pool = ThreadPoolExecutor(2)
    codecs = (
        ("legacy (pickle, JPEG q85)", LegacyCodec(), "jpeg"),
        ("msgpack (raw frames)", MsgpackCodec(), "raw"),
        ("msgpack (JPEG frames)", MsgpackCodec(), "jpeg"),
    )
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for cache in (True, False):
            for moving in (True, False):
                for name, codec, frames in codecs:
                    core = _core(Path(tmp) / f"{cache}{moving}{frames}{codec.name}", cache)
                    cases.append((name, cache, moving, core, _Wire(codec, frames, core, pool)))
        arrays = _obs_arrays(cases[0][3])
        floors: list[float] = []
        wall: list[list[float]] = [[] for _ in cases]
        cpu: list[list[float]] = [[] for _ in cases]
        # Round-robin over the cases, so background load hits every case alike.
        for i in range(args.steps + 5):
            floors.append(_memcpy_ms(arrays))
            for k, (_, _, moving, core, wire) in enumerate(cases):
                w, c = _one(core, wire, i, moving)
                if i >= 5:  # warm-up
                    wall[k].append(w)
                    cpu[k].append(c)
        for case in cases:
            case[3].close()
    pool.shutdown()
    floor = statistics.median(floors[5:])
    print(
        f"Testbed per-step cost, lift2 observation (4 cameras), {args.steps} steps per case, medians."
    )
    print("CPU = process CPU time per step (all threads, incl. parallel JPEG encoding).\n")
    print("| wire | frame cache | robot | wall ms/step | CPU ms/step | CPU x memcpy of the obs |")
    print("|---|---|---|---:|---:|---:|")
    for k, (name, cache, moving, _, _) in enumerate(cases):
        w, c = statistics.median(wall[k]), statistics.median(cpu[k])
        print(
            f"| {name} | {'on' if cache else 'off'} | {'moving' if moving else 'holding'} "
            f"| {w:.2f} | {c:.2f} | {c / floor:.1f} |"
        )
    print(f"| memcpy of the observation's arrays (floor) | | | {floor:.2f} | {floor:.2f} | 1.0 |")


if __name__ == "__main__":
    main()
