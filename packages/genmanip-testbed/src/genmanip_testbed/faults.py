"""Fault injection for reliability tests: latency, error replies, connection resets, stalls, deaths.

Spec syntax (``--fault``): comma-separated ``key=value`` pairs, e.g.
``latency=20ms,error_rate=0.1,errors=500|503|504,reset_before=0.05,reset_after=0.05,stall_reset=1,
die_worker=1@30,seed=7``.

=================  ==========================================================================
key                meaning
=================  ==========================================================================
``latency``        the server's time per faulted request, its own work included: the work is done
                   on arrival, the reply (or the failure) leaves that long after (``20ms``,
                   ``0.02s``, ``0.02``)
``error_rate``     probability of replying with an error status instead of doing the work
``errors``         the statuses to pick from (``500|503|504``; default ``500|503``)
``reset_before``   probability of dropping the connection (TCP RST, no reply) before the work
``reset_after``    probability of doing the work, then dropping the connection without a reply
``stall_reset``    the first N background resets never finish (until ``/kill`` or a new job)
``die_worker``     ``W@N``: worker W dies instead of executing its N-th action (a ``RayActorError``
                   500; the seed is re-queued); several as ``1@30|2@5``
``slow_reset``     ``W@DURATION``: worker W's background resets take that long (``3@2s``): one slow
                   worker among fast ones; several as ``1@2s|4@500ms``
``routes``         which eval routes are faulted (``step|step_chunk|reset|reset_result``, default)
``max_faults``     at most N requests get an error or a reset, then every request passes (0: no
                   limit); with a rate of 1 it faults exactly the next N requests to ``routes``
``seed``           makes every decision deterministic
=================  ==========================================================================

Decisions are a pure function of ``(seed, route, n)`` where n counts the requests to that route, so
a given request sequence always meets the same faults, whatever the thread interleaving.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import FaultSpecError

__all__ = ["DEFAULT_FAULT_ROUTES", "FaultSpec", "FaultState", "parse_fault_spec"]

DEFAULT_FAULT_ROUTES = ("step", "step_chunk", "reset", "reset_result")
_ALLOWED_ERRORS = (500, 502, 503, 504)


@dataclass(frozen=True)
class FaultSpec:
    """What to inject. Rates are probabilities in [0, 1]; ``latency_s`` in seconds."""

    latency_s: float = 0.0
    error_rate: float = 0.0
    errors: tuple[int, ...] = (500, 503)
    reset_before: float = 0.0
    reset_after: float = 0.0
    stall_reset: int = 0
    die_worker: tuple[tuple[str, int], ...] = field(default=())
    slow_reset: tuple[tuple[str, float], ...] = field(default=())
    routes: tuple[str, ...] = DEFAULT_FAULT_ROUTES
    seed: int = 0
    max_faults: int = 0

    def __post_init__(self) -> None:
        for name in ("error_rate", "reset_before", "reset_after"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise FaultSpecError(f"fault {name}: expected a probability in [0, 1], got {v}")
        if self.latency_s < 0:
            raise FaultSpecError(f"fault latency: expected >= 0, got {self.latency_s}")
        if self.max_faults < 0:
            raise FaultSpecError(f"fault max_faults: expected a count >= 0, got {self.max_faults}")
        if self.stall_reset < 0:
            raise FaultSpecError(
                f"fault stall_reset: expected a count >= 0, got {self.stall_reset}"
            )
        for code in self.errors:
            if code not in _ALLOWED_ERRORS:
                raise FaultSpecError(
                    f"fault errors: {code} is not one of {'|'.join(map(str, _ALLOWED_ERRORS))}"
                )
        if not self.errors:
            raise FaultSpecError("fault errors: at least one status is needed")

    @property
    def active(self) -> bool:
        return bool(
            self.latency_s
            or self.error_rate
            or self.reset_before
            or self.reset_after
            or self.stall_reset
            or self.die_worker
            or self.slow_reset
        )

    @classmethod
    def coerce(cls, value: FaultSpec | Mapping[str, Any] | str | None) -> FaultSpec:
        """Accept a FaultSpec, a spec string, a dict (spec keys or field names) or None."""
        if value is None:
            return cls()
        if isinstance(value, FaultSpec):
            return value
        if isinstance(value, str):
            return parse_fault_spec(value)
        if isinstance(value, Mapping):
            names = {f.name for f in fields(cls)}
            direct = {k: v for k, v in value.items() if k in names and not isinstance(v, str)}
            rest = ",".join(f"{k}={v}" for k, v in value.items() if k not in direct)
            spec = parse_fault_spec(rest) if rest else cls()
            kw = {f.name: getattr(spec, f.name) for f in fields(cls)}
            for k, v in direct.items():
                if k == "errors":
                    kw[k] = tuple(int(x) for x in v)
                elif k == "die_worker":
                    kw[k] = tuple((str(w), int(n)) for w, n in v)
                elif k == "slow_reset":
                    kw[k] = tuple((str(w), float(d)) for w, d in v)
                elif k == "routes":
                    kw[k] = tuple(str(r) for r in v)
                else:
                    kw[k] = v
            return cls(**kw)
        raise FaultSpecError(
            f"faults: expected a FaultSpec, a dict or a spec string, got {type(value).__name__}"
        )


def _duration(key: str, text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", text)
    if not m:
        raise FaultSpecError(f"fault {key}: expected a duration like 20ms or 0.5s, got {text!r}")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) == "ms" else v


def _prob(key: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise FaultSpecError(f"fault {key}: expected a probability, got {text!r}") from None
    return v


def parse_fault_spec(text: str) -> FaultSpec:
    """Parse ``key=value,...`` (see the module doc). Raises :class:`FaultSpecError` naming the key."""
    kw: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise FaultSpecError(f"fault spec: expected key=value, got {part!r}")
        key, _, val = (s.strip() for s in part.partition("="))
        if key == "latency":
            kw["latency_s"] = _duration(key, val)
        elif key in ("error_rate", "reset_before", "reset_after"):
            kw[key] = _prob(key, val)
        elif key == "errors":
            try:
                kw["errors"] = tuple(int(x) for x in val.split("|") if x)
            except ValueError:
                raise FaultSpecError(
                    f"fault errors: expected codes like 500|503, got {val!r}"
                ) from None
        elif key == "max_faults":
            if not val.isdigit():
                raise FaultSpecError(f"fault max_faults: expected a count, got {val!r}")
            kw["max_faults"] = int(val)
        elif key == "stall_reset":
            if not val.isdigit():
                raise FaultSpecError(f"fault stall_reset: expected a count, got {val!r}")
            kw["stall_reset"] = int(val)
        elif key == "die_worker":
            items = []
            for item in val.split("|"):
                w, at, n = item.partition("@")
                if not at or not w or not n.isdigit() or int(n) < 1:
                    raise FaultSpecError(
                        f"fault die_worker: expected WORKER@STEP (e.g. 1@30), got {item!r}"
                    )
                items.append((w, int(n)))
            kw["die_worker"] = tuple(items)
        elif key == "slow_reset":
            slow = []
            for item in val.split("|"):
                w, at, d = item.partition("@")
                if not at or not w:
                    raise FaultSpecError(
                        f"fault slow_reset: expected WORKER@DURATION (e.g. 3@2s), got {item!r}"
                    )
                slow.append((w, _duration(key, d)))
            kw["slow_reset"] = tuple(slow)
        elif key == "routes":
            routes = tuple(r.strip().lstrip("/") for r in val.split("|") if r.strip())
            kw["routes"] = routes
        elif key == "seed":
            try:
                kw["seed"] = int(val)
            except ValueError:
                raise FaultSpecError(f"fault seed: expected an integer, got {val!r}") from None
        else:
            raise FaultSpecError(
                f"fault spec: unknown key {key!r} (known: latency, error_rate, errors, reset_before, "
                "reset_after, stall_reset, die_worker, slow_reset, routes, max_faults, seed)"
            )
    return FaultSpec(**kw)


def _uniform(seed: int, route: str, n: int, kind: str) -> float:
    h = hashlib.blake2b(f"{seed}/{route}/{n}/{kind}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


@dataclass(frozen=True)
class Decision:
    """What to do with one request."""

    latency_s: float = 0.0
    error: int | None = None
    reset_before: bool = False
    reset_after: bool = False


class FaultState:
    """The live fault configuration plus its counters (replaced atomically by ``set``)."""

    def __init__(self, spec: FaultSpec | None = None) -> None:
        self._lock = threading.Lock()
        self.spec = spec or FaultSpec()
        self._route_n: Counter[str] = Counter()
        self._stalls_left = self.spec.stall_reset
        self._deaths_done: set[tuple[str, int]] = set()
        self._faulted = 0

    def set(self, spec: FaultSpec) -> None:
        with self._lock:
            self.spec = spec
            self._route_n.clear()
            self._stalls_left = spec.stall_reset
            self._deaths_done.clear()
            self._faulted = 0

    def decide(self, route: str) -> Decision:
        """The decision for the next request to ``route`` (a route name without the slash)."""
        with self._lock:
            spec = self.spec
            if not spec.active or route not in spec.routes:
                return Decision()
            n = self._route_n[route]
            self._route_n[route] += 1
            if spec.max_faults and self._faulted >= spec.max_faults:
                return Decision(latency_s=spec.latency_s)
            err = None
            if spec.error_rate and _uniform(spec.seed, route, n, "error") < spec.error_rate:
                err = spec.errors[int(_uniform(spec.seed, route, n, "which") * len(spec.errors))]
            d = Decision(
                latency_s=spec.latency_s,
                error=err,
                reset_before=err is None
                and bool(spec.reset_before)
                and _uniform(spec.seed, route, n, "rst_before") < spec.reset_before,
                reset_after=err is None
                and bool(spec.reset_after)
                and _uniform(spec.seed, route, n, "rst_after") < spec.reset_after,
            )
            if d.error is not None or d.reset_before or d.reset_after:
                self._faulted += 1
            return d

    def reset_delay(self, worker_id: str, default: float) -> float:
        """How long a background reset of ``worker_id`` takes (``slow_reset``, else ``default``)."""
        for w, d in self.spec.slow_reset:
            if w == worker_id:
                return d
        return default

    def take_stall(self) -> bool:
        """True for the next ``stall_reset`` background resets."""
        with self._lock:
            if self._stalls_left > 0:
                self._stalls_left -= 1
                return True
            return False

    def should_die(self, worker_id: str, executed: int) -> bool:
        """True when ``worker_id`` is due to die instead of executing action number ``executed + 1``."""
        with self._lock:
            for w, n in self.spec.die_worker:
                if w == worker_id and executed + 1 >= n and (w, n) not in self._deaths_done:
                    self._deaths_done.add((w, n))
                    return True
            return False
