"""Codec cost per observation: encode + decode, side by side, against the memcpy floor.

Observations: "3cam" = three (480, 640, 3) uint8 cameras + small state (2.76 MB raw), and "lift2" =
the EBench lift2 layout, two (480, 640, 3) + two (720, 1280, 3) cameras + state (7.37 MB raw).
Each row is the median over --repeats runs, in ms; "x memcpy" divides by the cost of copying every
array once (``arr.copy()``). JPEG rows carry pre-encoded frames (the server encodes them) and decode
nothing unless the row says "+ decode_all".

Usage: python bench/codec.py [--repeats N]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec, Observation, safe_loads


def _camera(h: int, w: int, seed: int) -> np.ndarray:
    # A smooth image with mild noise: compresses like a rendered scene, not like white noise.
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    base = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], axis=-1)
    return np.clip(base + rng.integers(-6, 7, (h, w, 3)), 0, 255).astype(np.uint8)


def observation(layout: str) -> dict[str, Any]:
    if layout == "3cam":
        sizes = {
            "left_camera": (480, 640),
            "right_camera": (480, 640),
            "overlook_camera": (480, 640),
        }
    else:
        sizes = {
            "left_camera": (480, 640),
            "right_camera": (480, 640),
            "top_camera": (720, 1280),
            "overlook_camera": (720, 1280),
        }
    obs: dict[str, Any] = {
        f"video.{k}_view": _camera(h, w, i) for i, (k, (h, w)) in enumerate(sizes.items())
    }
    obs.update({
        "state.joints": np.linspace(-1, 1, 12, dtype=np.float32),
        "state.gripper": np.array([0.044, 0.044, 0.0, 0.0], dtype=np.float32),
        "state.base": np.zeros(3, dtype=np.float32),
        "instruction": "put the peg into the hole",
        "timestep": 12,
        "reset": False,
        "episode_id": "ebench/run/ebench/table_top_manip/peg_in_hole/000",
        "robot_id": "manip/lift2/R5a",
    })  # fmt: skip
    return obs


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def rows(layout: str, repeats: int) -> list[tuple[str, float, float, int]]:
    obs = observation(layout)
    arrays = [v for v in obs.values() if isinstance(v, np.ndarray)]
    jpeg_obs = {k: (JpegFrame.encode(v) if k.startswith("video.") else v) for k, v in obs.items()}
    reply_raw = {
        "0": {"obs": obs, "metric": {"*t": {"score": 0.0, "sr": 0.0}}, "episode_result": None}
    }
    reply_jpeg = {
        "0": {"obs": jpeg_obs, "metric": {"*t": {"score": 0.0, "sr": 0.0}}, "episode_result": None}
    }
    mp, legacy = MsgpackCodec(), LegacyCodec()
    out: list[tuple[str, float, float, int]] = []

    def add(name: str, enc: Callable[[], bytes], dec: Callable[[bytes], Any]) -> None:
        body = enc()
        dec(body)  # must work before it is timed
        out.append(
            (name, _median_ms(enc, repeats), _median_ms(lambda: dec(body), repeats), len(body))
        )

    floor = _median_ms(lambda: [a.copy() for a in arrays], repeats)
    out.append(("memcpy of every array (floor)", floor, 0.0, sum(a.nbytes for a in arrays)))
    add("msgpack out-of-band, raw frames", lambda: mp.encode(reply_raw), mp.decode)
    add("msgpack out-of-band, JPEG frames", lambda: mp.encode(reply_jpeg), mp.decode)

    def mp_decode_all(b: bytes) -> Any:
        r = mp.decode(b)
        r["0"]["obs"].decode_all()
        return r

    add("msgpack, JPEG frames + decode_all", lambda: mp.encode(reply_jpeg), mp_decode_all)
    add(
        "legacy: pickle, base64 arrays + JPEG (real wire)",
        lambda: legacy.encode(reply_jpeg),
        legacy.decode,
    )

    def legacy_decode_all(b: bytes) -> Any:
        r = legacy.decode(b)
        r["0"]["obs"].decode_all()
        return r

    add("legacy + decode_all", lambda: legacy.encode(reply_jpeg), legacy_decode_all)
    add("legacy, raw frames as base64 arrays", lambda: legacy.encode(reply_raw), legacy.decode)
    add(
        "plain pickle 5, arrays in-band (unsafe)",
        lambda: pickle.dumps(reply_raw, protocol=5),
        pickle.loads,
    )
    add(
        "plain pickle 5 read by safe_loads", lambda: pickle.dumps(reply_raw, protocol=5), safe_loads
    )
    obj = mp.decode(mp.encode(reply_jpeg))["0"]["obs"]
    assert isinstance(obj, Observation)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    for layout in ("3cam", "lift2"):
        table = rows(layout, args.repeats)
        floor = table[0][1]
        print(f"\n### {layout} observation ({table[0][3] / 1e6:.2f} MB of arrays)\n")
        print(
            "| codec | encode ms | decode ms | total ms | body MB | decode x memcpy | total x memcpy |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, enc, dec, size in table:
            total = enc + dec
            print(
                f"| {name} | {enc:.2f} | {dec:.2f} | {total:.2f} | {size / 1e6:.2f} | "
                f"{dec / floor:.2f} | {total / floor:.2f} |"
            )


if __name__ == "__main__":
    main()
