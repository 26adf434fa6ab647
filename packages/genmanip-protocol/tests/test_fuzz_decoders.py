"""Fuzz every decoder: random bytes and mutated valid payloads may only raise DecodeError.

Per decoder: N random byte strings + N mutations/truncations of valid payloads, N = GMP_FUZZ_N
(default 2500, so 5,000 inputs per decoder; the reliability suite sets e.g. GMP_FUZZ_N=100000).
GMP_FUZZ_SEED changes the seed. A decoded payload's Observations are also fully decoded, so the
mutated JPEG bytes inside them are fuzzed too.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_protocol import DecodeError
from genmanip_protocol.codec import (
    JpegFrame,
    LegacyCodec,
    MsgpackCodec,
    Observation,
    decode_jpeg,
    safe_loads,
)
from genmanip_protocol.codec.msgpack_codec import MAGIC

sys.path.insert(0, str(Path(__file__).parent))

import _hostile as H

N = int(os.environ.get("GMP_FUZZ_N", "2500"))
SEED = int(os.environ.get("GMP_FUZZ_SEED", "20261130"))
TIMEOUT = max(120, N // 20)

_INTERESTING = [
    0,
    1,
    0x7F,
    0x80,
    0xFF,
    0x7FFF,
    0xFFFF,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**63 - 1,
    2**64 - 1,
]


def _rgb(seed: int, h: int = 16, w: int = 24) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


def _reply(jpeg: bool) -> dict[str, Any]:
    cams = {
        f"video.cam{i}_view": (JpegFrame.encode(_rgb(i)) if jpeg else _rgb(i)) for i in range(2)
    }
    obs = {
        **cams,
        "state.joints": np.linspace(-1, 1, 12, dtype=np.float32),
        "state.gripper": np.array([0.044, 0.044, 0, 0], dtype=np.float32),
        "state.base": [0.0, 0.0, 0.0],
        "instruction": "stack the blocks",
        "timestep": 7,
        "reset": False,
        "episode_id": "ebench/r/ebench/t/000",
    }
    return {
        "0": {
            "obs": obs,
            "metric": {"*(1/2)ebench/t": {"score": 0.5, "sr": 0.0}},
            "episode_result": None,
        },
        "1": {
            "obs": None,
            "metric": {"(2/2)ebench/t": {"score": 1.0, "sr": 1.0}},
            "episode_result": {"seed": "000", "score": 1.0},
        },
    }


def _seeds_msgpack() -> list[bytes]:
    c = MsgpackCodec()
    return [
        c.encode(_reply(jpeg=True)),
        c.encode(_reply(jpeg=False)),
        c.encode({"obs": _reply(True)["0"], "executed_steps": 4, "stopped_early": False}),
        c.encode(
            [
                np.arange(5, dtype=">i8"),
                np.zeros((0, 3)),
                np.array(1.5),
                np.ones((2, 2), dtype=np.complex64),
            ]
        ),
        c.encode({1: b"\x00" * 10, "x": [None, True, -(2**63), 2**64 - 1, 1e308]}),
    ]


def _seeds_legacy() -> list[bytes]:
    c = LegacyCodec()
    plain = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "s": np.float64(1.5),
        "t": (1, {2, 3}),
        "b": b"xy",
    }
    return [
        c.encode(_reply(jpeg=True)),
        c.encode({"obs": _reply(True)["0"], "executed_steps": 4, "stopped_early": False}),
        c.encode(
            {"0": {"action": np.zeros(16), "control_type": "joint_position"}}, tag_arrays=False
        ),
        *[pickle.dumps(plain, protocol=p) for p in (0, 2, 4, 5)],
    ]


def _seeds_jpeg() -> list[bytes]:
    return [JpegFrame.encode(_rgb(i, 16 + 8 * i, 16)).data for i in range(3)] + [
        JpegFrame.encode(_rgb(9, 9, 13), quality=30).data
    ]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        n = len(b)
        if n == 0:
            b += rng.randbytes(rng.randint(1, 8))
            continue
        pos = rng.randrange(n)
        if op == 0:  # flip a bit
            b[pos] ^= 1 << rng.randrange(8)
        elif op == 1:  # random byte
            b[pos] = rng.randrange(256)
        elif op == 2:  # interesting integer, any width and byte order
            width = rng.choice((1, 2, 4, 8))
            v = rng.choice(_INTERESTING) & ((1 << (8 * width)) - 1)
            b[pos : pos + width] = v.to_bytes(width, rng.choice(("little", "big")))
        elif op == 3:  # truncate
            del b[pos:]
        elif op == 4:  # delete a slice
            del b[pos : pos + rng.randint(1, 64)]
        elif op == 5:  # insert random bytes
            b[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 6:  # duplicate a slice
            j = rng.randrange(n)
            b[pos:pos] = b[j : j + rng.randint(1, 64)]
        else:  # zero a run
            k = rng.randint(1, 32)
            b[pos : pos + k] = bytes(min(k, n - pos))
    return bytes(b)


def _random_input(rng: random.Random, prefixes: list[bytes]) -> bytes:
    body = rng.randbytes(rng.choice((0, 1, 2, 8, 16, 40, 200, 2000)))
    # Half of them start with a valid prefix so they get past the first check.
    return (rng.choice(prefixes) + body) if rng.random() < 0.5 else body


def _touch(obj: Any, depth: int = 0) -> None:
    """Decode every lazily decoded value, so errors hiding behind laziness surface here."""
    if depth > 70:
        return
    if isinstance(obj, Observation):
        obj.decode_all()
        for v in obj.values():
            _touch(v, depth + 1)
    elif isinstance(obj, dict):
        for v in obj.values():
            _touch(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            _touch(v, depth + 1)
    elif isinstance(obj, JpegFrame):
        obj.decode()


def _fuzz(
    decode: Callable[[bytes], Any], seeds: list[bytes], prefixes: list[bytes], salt: int
) -> tuple[int, int]:
    rng = random.Random(SEED * 1000 + salt)
    ok = failed = 0
    inputs = [_random_input(rng, prefixes) for _ in range(N)]
    inputs += [_mutate(rng, rng.choice(seeds)) for _ in range(N)]
    for data in inputs:
        try:
            _touch(decode(data))
            ok += 1
        except DecodeError:
            failed += 1
        except Exception as exc:  # the property under test: nothing but DecodeError escapes
            raise AssertionError(
                f"{type(exc).__name__}: {exc} for input {data[:120]!r} (len {len(data)})"
            ) from exc
    assert ok + failed == 2 * N
    return ok, failed


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_msgpack_decoder() -> None:
    seeds = _seeds_msgpack()
    for s in seeds:  # the seeds themselves are valid
        _touch(MsgpackCodec().decode(s))
    ok, failed = _fuzz(
        MsgpackCodec().decode, seeds, [MAGIC + b"\x01", seeds[0][:16], seeds[3][:64]], 1
    )
    assert failed > 0 and ok > 0  # mutations of the buffer bytes leave valid frames


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_legacy_decoder() -> None:
    seeds = _seeds_legacy()
    for s in seeds:
        _touch(LegacyCodec().decode(s))
    ok, failed = _fuzz(LegacyCodec().decode, seeds, [b"\x80\x05", b"\x80\x02", b"(dp0\n"], 2)
    assert failed > 0 and ok > 0


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_safe_loads() -> None:
    seeds = _seeds_legacy()
    ok, failed = _fuzz(safe_loads, seeds, [b"\x80\x05\x95", b"\x80\x04", b"c"], 3)
    assert failed > 0 and ok > 0


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_jpeg_decoder() -> None:
    seeds = _seeds_jpeg()
    ok, failed = _fuzz(decode_jpeg, seeds, [b"\xff\xd8\xff\xe0", seeds[0][:200]], 4)
    assert failed > 0 and ok > 0


def _seeds_hostile() -> list[bytes]:
    """Small versions of each hostile class (deep hashables, floods, memo bombs, empty arrays,
    foreign image formats): mutating them probes the edges of every limit."""
    eps = H.HOSTILE_IMAGES["EPS"]
    return [
        H.deep_tuple_key(300),
        H.deep_tuple_set_member(120),
        H.deep_frozenset_reduce(80),
        H.deep_list_chain(100),
        H.repeated("8f", 3000),
        H.empties_in_list("5d", 3000),
        H.memo_bomb("bytearray", 4096, 40),
        H.memo_bomb("set", 500, 40),
        H.numpy_pickle([0, 2**40], 2),
        H.numpy_pickle([0, 7, 9], 5),
        H.tagged("numpy_array", dtype="float32", shape=[2**20, 0], data_b64=b""),
        H.tagged("image", data_b64=eps),
        H.tagged("image", data_b64=H.png(3, 4)),
        H.tagged("jpeg_bytes", dtype="uint8", shape=[8, 8, 3], data=b"\xff\xd8\xff" + eps),
    ]


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_hostile_seeds_legacy() -> None:
    seeds = _seeds_hostile()
    _ok, failed = _fuzz(LegacyCodec().decode, seeds, [b"\x80\x04", b"\x80\x04}N\x85\x85"], 5)
    assert failed > 0


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_hostile_seeds_msgpack() -> None:
    seeds = [
        H.frame(H.mp_array32("90", 3000)),
        H.frame(H.mp_array32("80", 3000)),
        H.frame(H.mp_deep(70)),
        H.frame(H.mp_map32_empty_values(2000)),
        H.mp_array_ref([0, 2**40]),
        H.mp_jpeg_ref(H.HOSTILE_IMAGES["EPS"], [8, 8, 3]),
        H.mp_jpeg_ref(b"\xff\xd8\xff" + H.HOSTILE_IMAGES["EPS"], [8, 8, 3]),
    ]
    _ok, failed = _fuzz(MsgpackCodec().decode, seeds, [MAGIC + b"\x01"], 6)
    assert failed > 0
