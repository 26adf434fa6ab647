"""The advice of ``gmp doctor``: settings and expected throughput, derived from the measurements.

The model (docs/doctor.md explains it): the runner drives its W workers in lock-step, one request
for all of them per step; the server steps its workers in parallel (one simulator each). A
step of all W workers therefore costs

    C(W, K) = S + N(W) + P(W) / K

where S is the server's time per step (one worker; parallel workers take about as long), N(W)
the link time per request (round trip + bytes of W workers + codec: N(W) = RTT + W * (N(1) -
RTT)), P(W) the policy's time for a batch of W observations (a per-worker policy: W calls one
after another, P(W) ~= W * P(1); a batched one: one call) and K the chunk size (the policy is
called once per K steps; the actions in between are replayed). Then

    steps/s ~= W / C(W, K)
    episodes/h ~= 3600 * W / (E * C(W, K) + R)

with E the steps per episode and R the time of one reset. The bottleneck is the largest of the
three terms of C.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["FORMULA", "MAX_WORKERS", "Inputs", "advise"]

#: Shown with the advice.
FORMULA = "steps/s ~= W / (S + N(W) + P(W)/K);  episodes/h ~= 3600*W / (E*(S + N(W) + P(W)/K) + R)"
#: Workers considered (EBench documents at most 32 concurrent workers per run).
MAX_WORKERS = 32
#: Chunk sizes considered.
_CHUNKS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Inputs:
    """What the advice is computed from (milliseconds unless said).

    Attributes:
        workers: W asked for (``--worker-ids``).
        chunk_size: K asked for (``--chunk-size``).
        server_ms: S, the server's time per step on one worker.
        link_ms: N(1), the link time of one worker's step with the chosen codec and frames.
        rtt_ms: the round-trip time of a small request.
        reset_ms: R, one reset (``/reset`` and polling until the first observation).
        policy_ms: batch size -> P(batch) measured; empty without a policy.
        batched: the policy takes batches (one call per step for all workers).
        served: the policy runs behind a policy server (``--policy ws://...``).
        chunk_horizon: actions per ``get_action_chunk`` call (None: no chunks).
        episode_steps: E.
        modes: the wire table (codec, frames, est_link_ms) to pick the codec from.
    """

    workers: int
    chunk_size: int
    server_ms: float
    link_ms: float
    rtt_ms: float
    reset_ms: float | None
    policy_ms: Mapping[int, float]
    batched: bool
    served: bool
    chunk_horizon: int | None
    episode_steps: int
    modes: Sequence[Mapping[str, Any]]


def _policy_at(inp: Inputs, w: int) -> float:
    """P(w) by linear interpolation/extrapolation of the measured batch sizes."""
    pts = sorted(inp.policy_ms.items())
    if not pts:
        return 0.0
    if len(pts) == 1:
        b, p = pts[0]
        return p if inp.batched else p * w / b
    (b0, p0), (b1, p1) = pts[0], pts[-1]
    slope = max(0.0, (p1 - p0) / (b1 - b0))
    return max(0.0, p0 + (w - b0) * slope)


def _link_at(inp: Inputs, w: int) -> float:
    return inp.rtt_ms + w * max(0.0, inp.link_ms - inp.rtt_ms)


def _terms(inp: Inputs, w: int, k: int) -> dict[str, float]:
    return {"server": inp.server_ms, "link": _link_at(inp, w), "policy": _policy_at(inp, w) / k}


def _rate(inp: Inputs, w: int, k: int) -> float:
    cost = sum(_terms(inp, w, k).values())
    return 1000.0 * w / cost if cost > 0 else float("inf")


def _per_hour(inp: Inputs, w: int, k: int) -> float:
    cost_s = sum(_terms(inp, w, k).values()) / 1000.0
    reset_s = (inp.reset_ms or 0.0) / 1000.0
    denom = inp.episode_steps * cost_s + reset_s
    return 3600.0 * w / denom if denom > 0 else float("inf")


def _summary(inp: Inputs, w: int, k: int) -> dict[str, Any]:
    terms = _terms(inp, w, k)
    return {
        "workers": w,
        "chunk_size": k,
        "terms_ms": {name: round(v, 3) for name, v in terms.items()},
        "step_cost_ms": round(sum(terms.values()), 3),
        "steps_per_s": round(_rate(inp, w, k), 2),
        "episodes_per_hour": round(_per_hour(inp, w, k), 1),
        "bottleneck": max(terms, key=lambda t: terms[t]),
    }


def _pick_chunk(inp: Inputs, w: int) -> int:
    if not inp.chunk_horizon or inp.chunk_horizon <= 1 or not inp.policy_ms:
        return 1
    rest = inp.server_ms + _link_at(inp, w)
    pol = _policy_at(inp, w)
    for k in _CHUNKS:
        if k > inp.chunk_horizon:
            break
        if pol / k <= 0.1 * rest:
            return k
    return min(inp.chunk_horizon, _CHUNKS[-1])


def _pick_workers(inp: Inputs, k_of: Any) -> int:
    rates = {w: _rate(inp, w, k_of(w)) for w in range(1, MAX_WORKERS + 1)}
    best = max(rates.values())
    return min(w for w, r in rates.items() if r >= 0.9 * best)


def advise(inp: Inputs) -> dict[str, Any]:
    """The advice: settings, expected throughput now and with them, the bottleneck, the reasons."""
    reasons: list[str] = []
    measured = inp
    now = _summary(inp, inp.workers, max(1, inp.chunk_size))

    # Codec and frames: the mode with the smallest estimated link time; the recommended
    # throughput is computed with that mode's N(1).
    modes = [m for m in inp.modes if m.get("est_link_ms") is not None]
    codec = frames = None
    if modes:
        pick = min(modes, key=lambda m: float(m["est_link_ms"]))
        codec, frames = pick["codec"], pick["frames"]
        flag = f"--codec {codec}" + (f" --frames {frames}" if codec == "msgpack" else "")
        reasons.append(
            f"{flag}: the smallest estimated link time per step "
            f"({pick['est_link_ms']:.1f} ms; bytes and codec cost of each mode above)"
        )
        inp = replace(inp, link_ms=min(inp.link_ms, float(pick["est_link_ms"])))
    workers = _pick_workers(inp, lambda w: _pick_chunk(inp, w))
    chunk = _pick_chunk(inp, workers)
    best = _summary(inp, workers, chunk)

    # Batch, serve or leave as is.
    p1 = _policy_at(inp, 1)
    inference = "none"
    if inp.policy_ms:
        if inp.served:
            inference = "served"
            reasons.append("the policy is served (--policy URL): P(W) includes the policy server's link")
        elif inp.batched:
            inference = "batched"
            reasons.append(f"the policy is batched: one call per step for all workers "
                           f"(P(1) = {p1:.1f} ms, P({workers}) = {_policy_at(inp, workers):.1f} ms)")
        elif workers > 1 and (_policy_at(inp, workers) - p1) > 0.25 * (inp.server_ms + _link_at(inp, workers)):
            inference = "batch"
            reasons.append(
                f"per-worker policy: {workers} workers call it {workers} times per step "
                f"(P({workers}) ~= {_policy_at(inp, workers):.1f} ms): implement "
                "get_actions(batch) so one forward pass serves every worker, or serve it "
                "(gmp policy serve) so one copy of the model serves several client processes"
            )
        else:
            inference = "as is"
            reasons.append(f"the policy is not the bottleneck in-process (P(1) = {p1:.1f} ms)")

    if chunk > 1:
        reasons.append(f"--chunk-size {chunk}: the policy term P(W)/K falls under 10% of S + N(W) "
                       f"(the model's horizon is {inp.chunk_horizon})")
    elif inp.policy_ms and inp.chunk_horizon is None and best["bottleneck"] == "policy":
        reasons.append("the policy is the bottleneck and has no get_action_chunk: a chunking "
                       "policy would call the model once per K steps")
    reasons.append(
        f"{workers} worker(s): within 90% of the best throughput for up to {MAX_WORKERS} workers "
        "(the server's worker slots bound it: the real server has 4 per 80 GiB GPU)"
    )
    reasons.append(f"bottleneck: {best['bottleneck']} "
                   f"({best['terms_ms'][best['bottleneck']]:.1f} ms of {best['step_cost_ms']:.1f} ms per step)")
    return {
        "formula": FORMULA,
        "inputs": {
            "S_server_ms": round(inp.server_ms, 3),
            "N1_link_ms": round(measured.link_ms, 3),
            "N1_link_recommended_ms": round(inp.link_ms, 3),
            "rtt_ms": round(inp.rtt_ms, 3),
            "R_reset_ms": None if inp.reset_ms is None else round(inp.reset_ms, 3),
            "P_policy_ms": {str(b): round(v, 3) for b, v in sorted(inp.policy_ms.items())},
            "E_episode_steps": inp.episode_steps,
        },
        "current": now,
        "recommended": best,
        "workers": workers,
        "chunk_size": chunk,
        "codec": codec,
        "frames": frames,
        "inference": inference,
        "steps_per_s": best["steps_per_s"],
        "episodes_per_hour": best["episodes_per_hour"],
        "bottleneck": best["bottleneck"],
        "reasons": reasons,
    }
