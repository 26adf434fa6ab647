"""Part 1 of ``gmp doctor``: what the link, the codecs, the server and the policy cost here.

* :func:`round_trips`: wall time of small ``GET /status`` requests (the round-trip time).
* :func:`wire_modes`: request and reply bytes of one step for every codec and frame mode the
  server offers, and what encoding and decoding them costs on this machine, from a real
  observation (the reply is re-encoded locally exactly as the server's codec would).
* :func:`synthetic_observation`: a spec-shaped observation for ``--no-steps`` (link-only) runs.
* :func:`time_policy`: the policy's latency on a batch of observations.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec
from genmanip_protocol.robots import RobotSpec

from ..client import EvalClient
from ..inference import BatchItem, Inference

__all__ = ["median", "observation_tree", "round_trips", "synthetic_observation", "time_policy", "wire_modes"]


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return float(statistics.median(values)) if values else None


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """Median wall time of ``reps`` calls (ms) and the last result."""
    times: list[float] = []
    out: Any = fn()  # warm-up (thread pools, caches), not counted
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(statistics.median(times)), out


def round_trips(client: EvalClient, n: int = 5) -> list[float]:
    """Wall times (ms) of ``n`` ``GET /status`` requests on the client's keep-alive connection.

    The first request (which may open the connection) is not counted.
    """
    client.status(retry=False)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.status(retry=False)
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def observation_tree(obs: Mapping[str, Any], *, frames: str) -> dict[str, Any]:
    """``obs`` as the server's reply holds it: cameras as raw arrays or as JPEG frames (quality 85)."""
    out: dict[str, Any] = {}
    for key in list(obs.keys()):
        value = obs[key]
        if key.startswith("video.") and isinstance(value, np.ndarray) and value.ndim == 3:
            out[key] = JpegFrame.encode(np.ascontiguousarray(value), quality=85) if frames == "jpeg" else value
        else:
            out[key] = value
    return out


def wire_modes(
    obs: Mapping[str, Any],
    action: Mapping[str, Any],
    *,
    worker_id: str,
    codecs: Sequence[str],
    frames: Sequence[str],
    reps: int = 3,
) -> list[dict[str, Any]]:
    """One row per (codec, frames) mode: bytes of a one-worker step and the codec cost here.

    Rows: ``codec``, ``frames``, ``request_bytes``, ``reply_bytes``, ``client_encode_ms`` (the
    request), ``client_decode_ms`` (the reply), ``server_encode_ms`` (the reply, on this machine:
    JPEG encoding included). The legacy wire always carries JPEG frames.
    """
    modes: list[tuple[str, str]] = []
    if "msgpack" in codecs:
        modes += [("msgpack", f) for f in ("raw", "jpeg") if f in frames]
    if "legacy" in codecs:
        modes.append(("legacy", "jpeg"))
    rows = []
    trees: dict[str, dict[str, Any]] = {}
    for codec_name, fr in modes:
        codec = MsgpackCodec() if codec_name == "msgpack" else LegacyCodec()

        def tree(fr: str = fr) -> dict[str, Any]:
            return {worker_id: {"obs": observation_tree(obs, frames=fr), "metric": {}, "episode_result": None}}

        server_ms, reply_tree = _timed(tree, reps)
        trees[fr] = reply_tree
        def encode_reply(c: Any = codec, t: Any = reply_tree) -> bytes:
            return bytes(c.encode(t))

        def encode_request(c: Any = codec, legacy: bool = codec_name == "legacy") -> bytes:
            body = {worker_id: action}
            return bytes(c.encode(body, tag_arrays=False) if legacy else c.encode(body))

        enc_ms, reply = _timed(encode_reply, reps)
        req_ms, request = _timed(encode_request, reps)

        def decode(c: Any = codec, body: bytes = reply) -> Any:
            got = c.decode(body)
            o = got[worker_id]["obs"]
            for k in list(o.keys()):
                if k.startswith("video."):
                    _ = o[k]  # a policy reads the cameras: JPEG frames decode here
            return got

        dec_ms, _ = _timed(decode, reps)
        rows.append({
            "codec": codec_name,
            "frames": fr,
            "request_bytes": len(request),
            "reply_bytes": len(reply),
            "client_encode_ms": round(req_ms, 3),
            "client_decode_ms": round(dec_ms, 3),
            "server_encode_ms": round(enc_ms + (server_ms if fr == "jpeg" else 0.0), 3),
        })
    return rows


def synthetic_observation(robot: RobotSpec) -> Any:
    """A spec-shaped observation (smooth synthetic images, zero joints, open grippers).

    Decoded through the msgpack codec, so it is an :class:`~genmanip_protocol.codec.Observation`
    like the real ones. JPEG sizes of synthetic images are not those of a real scene.
    """
    obs: dict[str, Any] = {
        "instruction": "doctor: synthetic observation",
        "state.joints": np.zeros(robot.joints_dim, dtype=np.float32),
        "state.gripper": np.asarray(list(robot.gripper_open) * robot.n_arms, dtype=np.float32),
        "state.base": np.zeros(3, dtype=np.float32),
        "timestep": 0,
        "reset": True,
        "episode_id": None,
        "robot_id": robot.robot_id,
    }
    for cam, (h, w, _c) in robot.cameras.items():
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([(xx * 255 // max(1, w - 1)), (yy * 255 // max(1, h - 1)),
                        ((xx + yy) % 256)], axis=-1).astype(np.uint8)
        obs[f"video.{cam}"] = img
    codec = MsgpackCodec()
    return codec.decode(codec.encode({"0": {"obs": obs}}))["0"]["obs"]


def time_policy(
    inference: Inference,
    observations: Sequence[Any],
    worker_ids: Sequence[str],
    *,
    chunks: bool,
    reps: int = 3,
) -> float:
    """Median wall time (ms) of one policy call on a batch: one item per worker id.

    Worker ``i`` gets observation ``i mod len(observations)``. The first call (each worker's
    episode start: ``reset``, lazy model loading) is a warm-up and is not counted.
    """
    items = [
        BatchItem(str(w), _episode(observations[i % len(observations)]), observations[i % len(observations)], True)
        for i, w in enumerate(worker_ids)
    ]
    call = inference.chunks if chunks else inference.actions
    call(items)
    later = [BatchItem(it.worker_id, it.episode_id, it.obs, False) for it in items]
    ms, _ = _timed(lambda: call(later), reps)
    return ms


def _episode(obs: Any) -> str | None:
    try:
        eid = obs.get("episode_id")
    except AttributeError:
        return None
    return None if eid is None else str(eid)
