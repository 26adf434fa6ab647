"""The three actor classes of ``gmp eval --launcher ray``, as plain classes (the launcher wraps them
with ``ray.remote`` and its options; tests can run them in-process).

* :class:`PolicyReplica`: loads the policy once (:meth:`genmanip_eval.inference.Inference.create`)
  and serves every request routed to it through one :class:`~genmanip_eval.batcher.Batcher`, so
  observations of several worker groups share one policy call. Its methods run on the actor's
  threads (a threaded actor); the policy itself is only ever called from the batcher's thread.
* :class:`Router`: which replica serves which worker group. It balances groups by their number of
  workers over the live replicas and moves the groups of a replica reported dead to the others.
* :class:`EvalGroup`: drives K worker ids through :func:`genmanip_eval.runner.run_workers` (the
  asynchronous runner: one lane per worker, one batcher), its policy a :class:`RemotePolicy` that
  sends each batch to the group's replica. Its events are buffered and fetched by the driver with
  :meth:`EvalGroup.next_events` (a long poll).

Nothing here retries a call that steps a simulator: :meth:`EvalGroup.run` is started once, with
``max_task_retries=0``. Only :meth:`RemotePolicy` re-sends a *policy* request, to another
replica, when the first one died: the observation it carries has not been stepped yet (the lane
is waiting for its action), so no ``/step`` can be sent twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from genmanip_eval.batcher import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S, Batcher
from genmanip_eval.errors import PolicyError
from genmanip_eval.inference import BatchItem, Inference
from genmanip_eval.runner import EvalConfig, run_workers
from genmanip_protocol.errors import ExitCode, GenmanipError

__all__ = ["EvalGroup", "PolicyReplica", "RemotePolicy", "Router", "where"]

log = logging.getLogger("genmanip_ray.actors")

#: How long a group waits for a live replica (a replacement loading its model) before it fails.
NO_REPLICA_WAIT_S = 300.0


def where() -> dict[str, Any]:
    """Where the calling code runs: Ray node id, node IP, host name, pid."""
    import ray

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _error_payload(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, GenmanipError):
        return {"type": type(exc).__name__, "message": str(exc), "hint": exc.hint,
                "exit_code": int(exc.exit_code)}
    return {"type": type(exc).__name__, "message": f"{type(exc).__name__}: {exc}", "hint": None,
            "exit_code": int(ExitCode.INTERNAL)}


# ---------------------------------------------------------------------- policy replicas


class PolicyReplica:
    """One copy of the policy, batching the requests of every group routed to it.

    Args:
        index: the replica's number (for reports).
        spec, args: ``--policy`` and its ``--policy-arg`` strings.
        max_batch: largest policy batch.
        max_wait_ms: the longest an idle policy waits for due workers (None: the runner's default,
            200 ms for a batched policy, 0 for a per-worker one).
    """

    def __init__(self, index: int, spec: str, args: dict[str, str], max_batch: int,
                 max_wait_ms: float | None) -> None:
        self.index = index
        self.error: dict[str, Any] | None = None
        try:
            self.inference = Inference.create(spec, args)
        except Exception as exc:  # reported by describe(): the driver names the replica
            self.error = _error_payload(exc)
            self.inference = Inference.wrap(_Unloaded(), name=spec)
        if max_wait_ms is not None:
            wait_s = max(0.0, max_wait_ms / 1000.0)
        else:
            wait_s = DEFAULT_MAX_WAIT_S if self.inference.batched else 0.0
        self._known: set[str] = set()
        self._known_lock = threading.Lock()
        self.batcher: Batcher[Any] = Batcher(self._serve, max_batch=max(1, max_batch), max_wait_s=wait_s,
                                             name=f"gmp-replica-{index}")
        self.served = 0

    def describe(self) -> dict[str, Any]:
        """What the policy offers, and where this replica runs (``error``: it did not load)."""
        return {
            "error": self.error,
            "index": self.index,
            "has_action": self.inference.has_action,
            "has_chunk": self.inference.has_chunk,
            "batched": self.inference.batched,
            "max_wait_s": self.batcher.max_wait_s,
            **where(),
        }

    def _serve(self, items: list[tuple[str, BatchItem]]) -> list[Any]:
        # The batcher's thread: the only one that calls the policy. A batch normally holds one
        # mode (a run uses one); a mixed one is served as two calls, in order.
        out: list[Any] = [None] * len(items)
        for mode in ("single", "chunk"):
            idx = [i for i, (m, _) in enumerate(items) if m == mode]
            if not idx:
                continue
            batch = [items[i][1] for i in idx]
            values = self.inference.actions(batch) if mode == "single" else self.inference.chunks(batch)
            for i, v in zip(idx, values, strict=True):
                out[i] = v
        return out

    def infer(self, mode: str, items: list[tuple[str, str | None, Any, bool]], group: int) -> dict[str, Any]:
        """Actions (``mode`` ``"single"``) or chunks (``"chunk"``) for ``items`` of one group:
        ``(worker_id, episode_id, obs, new_episode)``. Returns ``{"values", "call_ms",
        "queue_ms", "batch_size"}`` or ``{"error": ...}`` (the policy failed: not retried).

        The batcher's participants are the *workers* (``group/worker``): each group's lanes
        call on their own (:attr:`RemotePolicy.concurrent_workers`), so this batcher sees every
        worker's own pace, as the in-process one does, and batches and pipelines them across
        the groups of every actor."""
        keys = [f"{group}/{wid}" for wid, _, _, _ in items]
        with self._known_lock:
            for key in keys:
                if key not in self._known:
                    self._known.add(key)
                    self.batcher.attach(key)
        futures = [self.batcher.submit((mode, BatchItem(wid, eid, obs, new_episode=new)), key)
                   for (wid, eid, obs, new), key in zip(items, keys, strict=True)]
        try:
            outcomes = [f.result() for f in futures]
        except Exception as exc:
            return {"error": _error_payload(exc)}
        self.served += len(items)
        return {
            "values": [o.value for o in outcomes],
            "call_ms": [o.call_ms for o in outcomes],
            "queue_ms": [o.queue_ms for o in outcomes],
            "batch_size": [o.batch_size for o in outcomes],
        }

    def stats(self) -> dict[str, Any]:
        """The batcher's counters (:meth:`genmanip_eval.batcher.BatchStats.as_dict`)."""
        return {"index": self.index, "served": self.served, "batching": self.batcher.snapshot().as_dict()}

    def close(self) -> None:
        self.batcher.close()
        self.inference.close()


class _Unloaded:
    """Stands in for a policy that failed to load (describe() reports the error)."""

    def get_actions(self, batch: Sequence[BatchItem]) -> list[Any]:
        raise PolicyError("the policy did not load on this replica")


# ---------------------------------------------------------------------- router


class Router:
    """Which replica serves which worker group.

    A group is routed to the live replica with the fewest workers routed to it (ties: the lowest
    index); it stays there (a stateful policy keeps its per-worker state) until that replica is
    reported dead. Replicas are added by the driver (at start, and to replace dead ones).
    """

    def __init__(self) -> None:
        self.replicas: dict[int, Any] = {}
        self.dead: set[int] = set()
        self.unreported: list[int] = []
        self.routes: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.moves = 0

    def where(self) -> dict[str, Any]:
        return where()

    def add(self, index: int, handle: Any) -> None:
        self.replicas[index] = handle

    def _load(self, index: int) -> int:
        return sum(self.sizes[g] for g, r in self.routes.items() if r == index)

    def route(self, group: int, n_workers: int) -> tuple[int, Any] | None:
        """The replica of ``group`` (``n_workers`` workers): ``(index, handle)``, None while no
        replica is alive."""
        self.sizes[group] = n_workers
        cur = self.routes.get(group)
        if cur is not None and cur not in self.dead:
            return cur, self.replicas[cur]
        live = [i for i in sorted(self.replicas) if i not in self.dead]
        if not live:
            self.routes.pop(group, None)
            return None
        self.routes.pop(group, None)
        best = min(live, key=lambda i: (self._load(i), i))
        if cur is not None:
            self.moves += 1
        self.routes[group] = best
        return best, self.replicas[best]

    def failed(self, group: int, index: int) -> tuple[int, Any] | None:
        """Replica ``index`` died under ``group``: mark it dead and route the group anew."""
        if index in self.replicas and index not in self.dead:
            self.dead.add(index)
            self.unreported.append(index)
        return self.route(group, self.sizes.get(group, 1))

    def take_dead(self) -> list[int]:
        """Replicas reported dead since the last call (the driver replaces them)."""
        out, self.unreported = self.unreported, []
        return out

    def table(self) -> dict[str, Any]:
        return {
            "routes": {str(g): r for g, r in sorted(self.routes.items())},
            "dead": sorted(self.dead),
            "moves": self.moves,
            "load": {str(i): self._load(i) for i in sorted(self.replicas) if i not in self.dead},
        }


# ---------------------------------------------------------------------- eval groups


class RemotePolicy:
    """A batched policy whose calls go to the group's replica (through the router).

    Built by :meth:`create` with only the methods the replica's policy offers, so that
    :class:`~genmanip_eval.inference.Inference` plans the same mode as for the policy itself.
    Each lane calls it from its own thread (``concurrent_workers``): the replica batches.
    """

    #: Calls for different workers may run at once (a Ray handle is thread-safe): the async
    #: runner lets every lane send its own observation, and the replica's batcher batches them.
    concurrent_workers = True

    def __init__(self, group: int, n_workers: int, router: Any) -> None:
        self.group = group
        self.n_workers = n_workers
        self.router = router
        self.route: tuple[int, Any] | None = None
        self.reroutes = 0
        self._sizes: dict[str, int] = {}  # worker id -> the replica batch of its last call

    @classmethod
    def create(cls, group: int, n_workers: int, router: Any, *, has_action: bool, has_chunk: bool) -> Any:
        if has_action and has_chunk:
            return _Both(group, n_workers, router)
        if has_chunk:
            return _ChunksOnly(group, n_workers, router)
        return _ActionsOnly(group, n_workers, router)

    def replica(self) -> tuple[int, Any]:
        """The group's replica ``(index, handle)``, asking the router (waits while none is alive)."""
        import ray

        deadline = time.monotonic() + NO_REPLICA_WAIT_S
        while self.route is None:
            self.route = ray.get(self.router.route.remote(self.group, self.n_workers))
            if self.route is None:
                if time.monotonic() > deadline:
                    raise PolicyError(f"no policy replica alive for {NO_REPLICA_WAIT_S:.0f} s")
                time.sleep(0.2)
        return self.route

    def call(self, mode: str, batch: Sequence[BatchItem]) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError

        items = [(it.worker_id, it.episode_id, it.obs, it.new_episode) for it in batch]
        while True:
            index, handle = self.replica()
            try:
                reply: dict[str, Any] = ray.get(handle.infer.remote(mode, items, self.group))
            except RayActorError:
                # The replica died. These observations have not been stepped (their lanes wait
                # for the actions), so asking another replica sends no /step twice.
                log.warning("policy replica %d died: re-routing worker group %d", index, self.group)
                self.reroutes += 1
                self.route = ray.get(self.router.failed.remote(self.group, index))
                continue
            if "error" in reply:
                e = reply["error"]
                err = PolicyError(e["message"], hint=e.get("hint"))
                err.exit_code = ExitCode(e.get("exit_code", int(ExitCode.FAILURE)))  # type: ignore[misc]
                raise err
            for it, size in zip(batch, reply.get("batch_size") or (), strict=False):
                self._sizes[str(it.worker_id)] = int(size)
            return list(reply["values"])

    def batch_size_of(self, worker_id: str) -> int | None:
        """The size of the replica's batch that served ``worker_id``'s last call."""
        return self._sizes.get(str(worker_id))


class _ActionsOnly(RemotePolicy):
    def get_actions(self, batch: Sequence[BatchItem]) -> list[Any]:
        return self.call("single", batch)


class _ChunksOnly(RemotePolicy):
    def get_action_chunks(self, batch: Sequence[BatchItem]) -> list[Any]:
        return self.call("chunk", batch)


class _Both(_ActionsOnly):
    def get_action_chunks(self, batch: Sequence[BatchItem]) -> list[Any]:
        return self.call("chunk", batch)


class EvalGroup:
    """K worker ids driven by the asynchronous runner, the policy on the replicas.

    Args:
        index: the group's number (its route key).
        cfg: the run's config (results root absolute; ``run_id`` set when resuming or taking over).
        worker_ids: this group's worker ids.
        router: the router actor's handle.
        policy: the replicas' :meth:`PolicyReplica.describe` (which calls the policy offers).
    """

    def __init__(self, index: int, cfg: EvalConfig, worker_ids: list[str], router: Any,
                 policy: dict[str, Any]) -> None:
        self.index = index
        self.worker_ids = list(worker_ids)
        self.cfg = cfg
        if cfg.max_wait_ms is None and not policy.get("batched"):
            # A per-worker policy: the replica serves items one by one, waiting only idles it.
            self.cfg = replace(cfg, max_wait_ms=0.0)
        self.remote = RemotePolicy.create(index, len(worker_ids), router,
                                          has_action=bool(policy.get("has_action")),
                                          has_chunk=bool(policy.get("has_chunk")))
        self._events: deque[tuple[str, dict[str, Any]]] = deque()
        self._cv = threading.Condition()
        self._stop = threading.Event()

    def where(self) -> dict[str, Any]:
        return {**where(), "group": self.index, "workers": self.worker_ids}

    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        with self._cv:
            self._events.append((kind, payload))
            self._cv.notify_all()

    def next_events(self, timeout_s: float = 0.25) -> list[tuple[str, dict[str, Any]]]:
        """The events buffered since the last call; waits up to ``timeout_s`` for one."""
        with self._cv:
            if not self._events and timeout_s > 0:
                self._cv.wait(timeout_s)
            out = list(self._events)
            self._events.clear()
        return out

    def stop(self) -> None:
        """End the run at the lanes' next step boundary (the driver's Ctrl-C, --max-episodes)."""
        self._stop.set()

    def run(self) -> dict[str, Any]:
        """Run the group to the end: ``{"summary": RunSummary fields, "reroutes"}`` or
        ``{"error": ...}``. Started once (never retried: it steps the simulator)."""
        inference = Inference.wrap(self.remote, name=self.cfg.policy)
        try:
            self.remote.replica()  # routed now: the router's table names every group
            # (the driver ends the run.json segment once, for every actor and generation: this
            # group's summary is only its share)
            summary = run_workers(self.cfg, self.worker_ids, emit=self._emit, stop=self._stop,
                                  inference=inference, segment_outcome=False)
        except KeyboardInterrupt:
            return {"error": {"type": "KeyboardInterrupt", "message": "interrupted", "hint": None,
                              "exit_code": 130}, "reroutes": self.remote.reroutes}
        except BaseException as exc:  # reported to the driver, which names the group
            import traceback

            payload = _error_payload(exc)
            if not isinstance(exc, GenmanipError):
                payload["traceback"] = traceback.format_exc()
            return {"error": payload, "reroutes": self.remote.reroutes}
        return {"summary": asdict(summary), "reroutes": self.remote.reroutes}


def default_max_batch(cfg: EvalConfig, workers: int) -> int:
    """The replicas' largest batch: ``--max-batch``, else every worker routed to it, at most 32."""
    return cfg.max_batch or min(DEFAULT_MAX_BATCH, max(1, workers))
