"""The three actor classes of ``gmp eval --launcher ray``, as plain classes (the launcher wraps them
with ``ray.remote`` and its options; tests can run them in-process).

* :class:`PolicyReplica`: loads the policy once (:meth:`genmanip_eval.inference.Inference.create`)
  and serves it with ``gmp policy serve``'s server (:class:`genmanip_serve.PolicyServer`) on its
  node's address, so observations of every worker of every group routed to it share one policy
  call. The policy itself is only ever called from that server's batcher thread.
* :class:`Router`: which replica serves which worker group (a :class:`Route`: index, URL, actor
  handle). It balances groups by their number of workers over the live replicas and moves the
  groups of a replica reported dead to the others.
* :class:`EvalGroup`: drives K worker ids through :func:`genmanip_eval.runner.run_workers` (the
  asynchronous runner: one lane per worker), its policy a :class:`RoutedPolicy`: gmp's ``ws://``
  client on the group's replica, one connection per worker. Its events are buffered and fetched
  by the driver with :meth:`EvalGroup.next_events` (a long poll).

Why the policy's data does not travel as Ray calls: on the 2-core bench machine one actor call
with an observation (~60 KB of JPEG frames) costs ~9 ms beyond the policy's own time, the
WebSocket request ~0.9 ms (docs/scale-out.md#what-runs-where). Ray places, reserves, restarts and
reports deaths; the observations go straight from a lane to its replica.

Nothing here retries a call that steps a simulator: :meth:`EvalGroup.run` is started once, with
``max_task_retries=0``. Only :meth:`RoutedPolicy.call` re-sends a *policy* request, to another
replica (or on a new connection), when the first one failed: the observation it carries has not
been stepped yet (the lane is waiting for its action), so no ``/step`` can be sent twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from genmanip_eval.batcher import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S
from genmanip_eval.errors import PolicyCodeError, PolicyError
from genmanip_eval.inference import BatchItem, Inference
from genmanip_eval.runner import EvalConfig, run_workers
from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_serve import PolicyServer, ServeOptions
from genmanip_serve import RemotePolicy as WsPolicy
from genmanip_serve.errors import (
    PolicyServerGone,
    PolicyServerRejected,
    PolicyServerTimeout,
    PolicyServerUnreachable,
    RemotePolicyError,
)

__all__ = ["EvalGroup", "PolicyReplica", "Route", "RoutedPolicy", "Router", "where"]

log = logging.getLogger("genmanip_ray.actors")

#: How long a group waits for a live replica (a replacement loading its model) before it fails.
NO_REPLICA_WAIT_S = 300.0
#: How long a replica's actor may take to answer "alive?" before it is taken for dead.
ALIVE_TIMEOUT_S = 30.0
#: Reconnections in a row to a replica that is alive before its connection's failure is the run's.
RECONNECTS = 3


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
    """One copy of the policy, served to every group routed to it by ``gmp policy serve``'s
    server (:class:`genmanip_serve.PolicyServer`) on this node's address.

    The data plane is that server's WebSocket + msgpack wire, not Ray calls: an observation
    travels once, on a connection its lane keeps open, and a policy call batches the
    observations of every connected worker of every group (each connection is one worker).
    Ray places the replica, reserves its GPU share and tells the groups when it is dead.

    Args:
        index: the replica's number (for reports).
        spec, args: ``--policy`` and its ``--policy-arg`` strings.
        max_batch: largest policy batch.
        max_wait_ms: the longest an idle policy waits for due workers (None: the runner's default,
            200 ms for a batched policy, 0 for a per-worker one).
        api_key: the run's key: the server refuses a connection without it (its port is open on
            the node's address).
    """

    def __init__(self, index: int, spec: str, args: dict[str, str], max_batch: int,
                 max_wait_ms: float | None, *, api_key: str) -> None:
        self.index = index
        self.error: dict[str, Any] | None = None
        self.server: PolicyServer | None = None
        self._failure: dict[str, Any] | None = None
        try:
            self.inference = Inference.create(spec, args)
        except Exception as exc:  # reported by describe(): the driver names the replica
            self.error = _error_payload(exc)
            self.inference = Inference.wrap(_Unloaded(), name=spec)
            return
        if max_wait_ms is not None:
            wait_s = max(0.0, max_wait_ms / 1000.0)
        else:
            wait_s = DEFAULT_MAX_WAIT_S if self.inference.batched else 0.0
        import ray

        options = ServeOptions(host=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                               port=0, max_batch=max(1, max_batch), max_wait_s=wait_s, api_key=api_key)
        self.server = PolicyServer(self.inference, options, policy=spec, on_policy_error=self._failed)
        threading.Thread(target=self.server.serve_forever, name=f"gmp-replica-{index}", daemon=True).start()

    def describe(self) -> dict[str, Any]:
        """What the policy offers, where this replica runs and its server's ``url``
        (``error``: it did not load)."""
        return {
            "error": self.error,
            "index": self.index,
            "url": self.server.url if self.server is not None else None,
            "has_action": self.inference.has_action,
            "has_chunk": self.inference.has_chunk,
            "batched": self.inference.batched,
            "max_wait_s": self.server.options.max_wait_s if self.server is not None else None,
            **where(),
        }

    def alive(self) -> bool:
        """True (a group asks after its connection dropped: a dead replica raises instead)."""
        return True

    def _failed(self, exc: BaseException) -> None:
        self._failure = _error_payload(exc)

    def last_failure(self) -> dict[str, Any] | None:
        """The last failed policy call's error (type, message, hint, exit code): the wire's
        ``policy-failed`` frame carries only the message."""
        return self._failure

    def stats(self) -> dict[str, Any]:
        """``served`` requests and the batcher's counters
        (:meth:`genmanip_eval.batcher.BatchStats.as_dict`)."""
        if self.server is None:
            return {"index": self.index, "served": 0, "batching": None}
        st = self.server.stats()
        return {"index": self.index, "served": st["requests"], "batching": st["batcher"],
                "max_batch_connections": st["max_batch_connections"]}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.inference.close()


class _Unloaded:
    """Stands in for a policy that failed to load (describe() reports the error)."""

    def get_actions(self, batch: Sequence[BatchItem]) -> list[Any]:
        raise PolicyError("the policy did not load on this replica")


# ---------------------------------------------------------------------- router


@dataclass(frozen=True)
class Route:
    """A live replica as the router hands it out.

    Attributes:
        index: the replica's number.
        url: its policy server (``ws://node-ip:port``).
        handle: its actor handle (a group asks it whether it is alive after a connection drops).
    """

    index: int
    url: str
    handle: Any


class Router:
    """Which replica serves which worker group.

    A group is routed to the live replica with the fewest workers routed to it (ties: the lowest
    index); it stays there (a stateful policy keeps its per-worker state) until that replica is
    reported dead. Replicas are added by the driver (at start, and to replace dead ones).
    """

    def __init__(self) -> None:
        self.replicas: dict[int, Route] = {}
        self.dead: set[int] = set()
        self.unreported: list[int] = []
        self.routes: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.moves = 0

    def where(self) -> dict[str, Any]:
        return where()

    def add(self, index: int, handle: Any, url: str) -> None:
        self.replicas[index] = Route(index, url, handle)

    def _load(self, index: int) -> int:
        return sum(self.sizes[g] for g, r in self.routes.items() if r == index)

    def route(self, group: int, n_workers: int) -> Route | None:
        """The replica of ``group`` (``n_workers`` workers), None while no replica is alive."""
        self.sizes[group] = n_workers
        cur = self.routes.get(group)
        if cur is not None and cur not in self.dead:
            return self.replicas[cur]
        live = [i for i in sorted(self.replicas) if i not in self.dead]
        if not live:
            self.routes.pop(group, None)
            return None
        self.routes.pop(group, None)
        best = min(live, key=lambda i: (self._load(i), i))
        if cur is not None:
            self.moves += 1
        self.routes[group] = best
        return self.replicas[best]

    def failed(self, group: int, index: int) -> Route | None:
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


class RoutedPolicy:
    """A batched policy served by the group's replica: gmp's ``ws://`` policy
    (:class:`genmanip_serve.RemotePolicy`) pointed at the replica the router names.

    Built by :meth:`create` with only the methods the replica's policy offers, so that
    :class:`~genmanip_eval.inference.Inference` plans the same mode as for the policy itself.
    Each lane calls it from its own thread on its own connection (``concurrent_workers``); the
    replica's server batches across every connection.

    When a connection drops (or times out), the replica's actor is asked whether it is alive.
    Dead (or not answering): the router marks it so, routes the group to another replica (the
    driver starts a replacement) and the request is sent there. Alive: the connection is opened
    anew, up to :data:`RECONNECTS` times in a row. Either way the observation has not been
    stepped (its lane waits for the action), so no ``/step`` is sent twice.
    """

    #: Calls for different workers may run at once: each worker has its own connection.
    concurrent_workers = True

    def __init__(self, group: int, n_workers: int, router: Any, api_key: str) -> None:
        self.group = group
        self.n_workers = n_workers
        self.router = router
        self.reroutes = 0
        self._api_key = api_key
        self._lock = threading.Lock()  # the route and its client (lanes call concurrently)
        self._route: Route | None = None
        self._ws: WsPolicy | None = None
        self._generation = 0  # bumped at every failure handled: one lane handles each
        self._reconnects = 0

    @classmethod
    def create(cls, group: int, n_workers: int, router: Any, api_key: str, *, has_action: bool,
               has_chunk: bool) -> RoutedPolicy:
        if has_action and has_chunk:
            return _Both(group, n_workers, router, api_key)
        if has_chunk:
            return _ChunksOnly(group, n_workers, router, api_key)
        return _ActionsOnly(group, n_workers, router, api_key)

    def replica(self) -> Route:
        """The group's replica, asking the router (waits while none is alive)."""
        import ray

        deadline = time.monotonic() + NO_REPLICA_WAIT_S
        with self._lock:
            while self._route is None:
                self._route = ray.get(self.router.route.remote(self.group, self.n_workers))
                if self._route is None:
                    if time.monotonic() > deadline:
                        raise PolicyError(f"no policy replica alive for {NO_REPLICA_WAIT_S:.0f} s")
                    time.sleep(0.2)
            return self._route

    def _client(self, route: Route) -> WsPolicy | None:
        """The client of ``route``, opened if need be; None if the group was re-routed meanwhile.
        Opening it may raise like a call does (a dead replica's probe connection fails)."""
        with self._lock:
            if self._route is not route:
                return None
            if self._ws is None:
                self._ws = WsPolicy(route.url, api_key=self._api_key, trusted_network=True)
            return self._ws

    def _alive(self, route: Route) -> bool:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return bool(ray.get(route.handle.alive.remote(), timeout=ALIVE_TIMEOUT_S))
        except (RayActorError, GetTimeoutError):
            return False

    def _lost(self, generation: int, route: Route, exc: RemotePolicyError) -> None:
        """The connection to ``route`` failed with ``exc``: re-route or reconnect, or raise
        ``exc``. Once per failure (the first lane to see it; the others wait for the lock and
        then use what it set up)."""
        import ray

        with self._lock:
            if generation != self._generation:
                return
            self._generation += 1
            old, self._ws = self._ws, None
            if old is not None:
                old.close()
            if self._alive(route):
                self._reconnects += 1
                if self._reconnects > RECONNECTS:
                    raise exc
                log.warning("policy replica %d is alive but its connection failed (%s): reconnecting",
                            route.index, exc)
                return
            log.warning("policy replica %d died: re-routing worker group %d", route.index, self.group)
            self.reroutes += 1
            self._route = ray.get(self.router.failed.remote(self.group, route.index))

    def call(self, mode: str, batch: Sequence[BatchItem]) -> list[Any]:
        while True:
            route = self.replica()
            generation = self._generation  # the failure below, if any, is this generation's
            try:
                client = self._client(route)
                if client is None:
                    continue  # re-routed meanwhile
                out = client.get_actions(batch) if mode == "single" else client.get_action_chunks(batch)
            except PolicyServerRejected as exc:
                if exc.kind == "policy-failed":
                    raise self._policy_error(route, exc) from None
                raise
            except (PolicyServerGone, PolicyServerUnreachable, PolicyServerTimeout) as exc:
                if isinstance(exc, PolicyServerGone) and exc.code == 1009:
                    raise  # too big for any replica: sending it again changes nothing
                self._lost(generation, route, exc)
                continue
            self._reconnects = 0
            return out

    def _policy_error(self, route: Route, exc: PolicyServerRejected) -> PolicyError:
        """The user's policy failed on the replica: its own error (message, hint, exit code)."""
        import ray

        e: dict[str, Any] | None = None
        try:
            e = ray.get(route.handle.last_failure.remote(), timeout=ALIVE_TIMEOUT_S)
        except Exception as fetch_exc:  # the frame's message is still the user's
            log.debug("policy replica %d: no failure details (%s)", route.index, fetch_exc)
        if not e:
            return PolicyError(exc.detail or str(exc))
        cls = PolicyCodeError if e.get("type") == "PolicyCodeError" else PolicyError
        err = cls(e["message"], hint=e.get("hint"))
        err.exit_code = ExitCode(e.get("exit_code", int(ExitCode.FAILURE)))  # type: ignore[misc]
        return err

    def batch_size_of(self, worker_id: str) -> int | None:
        """The size of the replica's batch that served ``worker_id``'s last call."""
        ws = self._ws
        return ws.batch_size_of(worker_id) if ws is not None else None

    @property
    def prefers_jpeg(self) -> bool:
        """JPEG frames travel to the replica undecoded (the run asks the server for them)."""
        return True

    def close(self) -> None:
        with self._lock:
            old, self._ws = self._ws, None
        if old is not None:
            old.close()


class _ActionsOnly(RoutedPolicy):
    def get_actions(self, batch: Sequence[BatchItem]) -> list[Any]:
        return self.call("single", batch)


class _ChunksOnly(RoutedPolicy):
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
        api_key: the run's key of the replicas' servers.

    Created while the replicas load the policy; :meth:`run` gets their description.
    """

    def __init__(self, index: int, cfg: EvalConfig, worker_ids: list[str], router: Any, *,
                 api_key: str) -> None:
        self.index = index
        self.worker_ids = list(worker_ids)
        self.cfg = cfg
        self._router = router
        self._api_key = api_key
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

    def run(self, policy: dict[str, Any]) -> dict[str, Any]:
        """Run the group to the end: ``{"summary": RunSummary fields, "reroutes"}`` or
        ``{"error": ...}``. Started once (never retried: it steps the simulator).

        ``policy``: the replicas' :meth:`PolicyReplica.describe` (which calls the policy offers).
        """
        cfg = self.cfg
        if cfg.max_wait_ms is None and not policy.get("batched"):
            # A per-worker policy: the replica serves items one by one, waiting only idles it.
            cfg = replace(cfg, max_wait_ms=0.0)
        remote = RoutedPolicy.create(
            self.index, len(self.worker_ids), self._router, self._api_key,
            has_action=bool(policy.get("has_action")), has_chunk=bool(policy.get("has_chunk")))
        inference = Inference.wrap(remote, name=cfg.policy)
        try:
            remote.replica()  # routed now: the router's table names every group
            # (the driver ends the run.json segment once, for every actor and generation: this
            # group's summary is only its share)
            summary = run_workers(cfg, self.worker_ids, emit=self._emit, stop=self._stop,
                                  inference=inference, segment_outcome=False)
        except KeyboardInterrupt:
            return {"error": {"type": "KeyboardInterrupt", "message": "interrupted", "hint": None,
                              "exit_code": 130}, "reroutes": remote.reroutes}
        except BaseException as exc:  # reported to the driver, which names the group
            import traceback

            payload = _error_payload(exc)
            if not isinstance(exc, GenmanipError):
                payload["traceback"] = traceback.format_exc()
            return {"error": payload, "reroutes": remote.reroutes}
        return {"summary": asdict(summary), "reroutes": remote.reroutes}


def default_max_batch(cfg: EvalConfig, workers: int) -> int:
    """The replicas' largest batch: ``--max-batch``, else every worker routed to it, at most 32."""
    return cfg.max_batch or min(DEFAULT_MAX_BATCH, max(1, workers))
