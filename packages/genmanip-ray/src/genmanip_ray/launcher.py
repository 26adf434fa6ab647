"""``gmp eval --launcher ray``: :func:`launch` runs a :class:`~genmanip_eval.runner.EvalConfig` on a
Ray cluster and returns the same :class:`~genmanip_eval.runner.RunSummary` as the local launcher.

What runs where (docs/scale-out.md has the picture):

* the **driver** (the ``gmp eval`` process): connects to Ray, starts the actors below, forwards
  their events to the one progress display, aggregates the summary, writes the ``cluster`` object
  into ``run.json``, replaces dead actors;
* a **router** actor (no CPU, on the driver's node): which policy replica serves which group;
* N **policy replicas** (``num_gpus=F``, ``num_cpus=C``, spread over the nodes): the policy
  loaded once each, batching across the groups routed to it;
* one **eval actor** per group of K worker ids (spread over the nodes): the asynchronous runner,
  recording into the results root (a path every node sees: the driver's, absolute).

Exactly-once: an eval actor's ``run`` is called once with ``max_task_retries=0``; when the actor
dies (killed, its node lost) a new actor is started on the same worker ids and the same run id,
and gmp's own recovery decides what happened to each episode (the client asks the server:
collect the finished result or restart the episode; the recorder finishes what the dead one
left on disk). The actors are named after their server and worker ids (namespace
:data:`NAMESPACE`): two live actors never drive the same group, also across drivers (a resumed
run waits for the actors of a killed driver to be gone).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from genmanip_eval.batcher import merge_batch_stats
from genmanip_eval.errors import PolicyError, WorkerProcessError
from genmanip_eval.runner import EvalConfig, RunSummary, end_segment, with_segment_id
from genmanip_protocol.errors import ExitCode
from genmanip_results.layout import RUN_JSON, RUN_JSON_LOCK
from genmanip_results.roots import resolve_results_root
from genmanip_runtime.atomic import merge_json

from .actors import EvalGroup, PolicyReplica, Router, default_max_batch

__all__ = ["NAMESPACE", "RayOptions", "launch", "split_groups"]

log = logging.getLogger("genmanip_ray.launcher")

Emit = Callable[[str, dict[str, Any]], None]

#: The Ray namespace of gmp's named eval actors.
NAMESPACE = "genmanip"
#: Default worker ids per eval actor.
DEFAULT_WORKERS_PER_ACTOR = 4
#: How many times one group's actor may die and be replaced before the run fails.
MAX_TAKEOVERS = 5
#: How long the driver waits for a named actor of the same group to be gone (a killed driver's).
NAME_WAIT_S = 120.0
#: How long a policy replica may take to load its policy.
REPLICA_LOAD_S = 900.0


@dataclass(frozen=True)
class RayOptions:
    """``EvalConfig.launcher_options`` of ``--launcher ray`` (flags ``--ray-address``,
    ``--workers-per-actor``, ``--policy-replicas``, ``--gpus-per-replica``, ``--cpus-per-replica``)."""

    address: str | None = None
    workers_per_actor: int = DEFAULT_WORKERS_PER_ACTOR
    policy_replicas: int = 1
    #: None: 1 when the cluster has a GPU, else 0.
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0
    #: CPUs reserved per eval actor (its lanes, recorder and transcodes).
    cpus_per_actor: float = 1.0

    @classmethod
    def from_config(cls, cfg: EvalConfig) -> RayOptions:
        o = dict(cfg.launcher_options or {})
        known = {"address", "workers_per_actor", "policy_replicas", "gpus_per_replica",
                 "cpus_per_replica", "cpus_per_actor"}
        unknown = sorted(set(o) - known)
        if unknown:
            raise PolicyError(f"--launcher ray: unknown option(s) {', '.join(unknown)}")
        opts = cls(
            address=o.get("address") or None,
            workers_per_actor=int(o.get("workers_per_actor") or DEFAULT_WORKERS_PER_ACTOR),
            policy_replicas=int(o.get("policy_replicas") or 1),
            gpus_per_replica=None if o.get("gpus_per_replica") is None else float(o["gpus_per_replica"]),
            cpus_per_replica=float(1.0 if o.get("cpus_per_replica") is None else o["cpus_per_replica"]),
            cpus_per_actor=float(1.0 if o.get("cpus_per_actor") is None else o["cpus_per_actor"]),
        )
        if opts.workers_per_actor < 1:
            raise PolicyError(f"--workers-per-actor {opts.workers_per_actor}: expected at least 1")
        if opts.policy_replicas < 1:
            raise PolicyError(f"--policy-replicas {opts.policy_replicas}: expected at least 1")
        if (opts.gpus_per_replica or 0) < 0 or opts.cpus_per_replica < 0:
            raise PolicyError("--gpus-per-replica / --cpus-per-replica: expected a number >= 0")
        return opts


def split_groups(worker_ids: list[str], per_actor: int) -> list[list[str]]:
    """Consecutive groups of at most ``per_actor`` worker ids, as even as possible
    (10 ids, 4 per actor: 4, 3, 3)."""
    n = max(1, math.ceil(len(worker_ids) / max(1, per_actor)))
    base, extra = divmod(len(worker_ids), n)
    out: list[list[str]] = []
    i = 0
    for g in range(n):
        size = base + (1 if g < extra else 0)
        out.append(list(worker_ids[i:i + size]))
        i += size
    return [g for g in out if g]


def _actor_name(url: str, worker_ids: list[str]) -> str:
    return f"gmp-eval|{url}|{','.join(worker_ids)}"


def launch(cfg: EvalConfig, *, emit: Emit | None = None, stop: Any = None) -> RunSummary:
    """Run ``cfg`` on Ray (the ``ray`` entry of ``genmanip.launchers``).

    Connects to ``--ray-address`` (``auto``: a cluster started with ``ray start --head``;
    ``ray://HOST:PORT``: Ray Client), or starts a local Ray instance, unless this process is
    connected already (then that connection is used and left open).

    Raises:
        WorkerProcessError: an eval actor failed, or died more than :data:`MAX_TAKEOVERS` times
            (the others are stopped first); its ``summary`` attribute holds what was done.
        PolicyError: the options are wrong, or the policy did not load on a replica.
    """
    import ray

    opts = RayOptions.from_config(cfg)
    say: Emit = emit or (lambda kind, payload: None)
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"namespace": NAMESPACE, "configure_logging": False,
                                  "include_dashboard": False}
        if opts.address:
            kwargs["address"] = opts.address
        else:
            # A local instance: its workers see what this process imports from its directory.
            paths = [os.getcwd(), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
            if not os.environ.get("RAY_ADDRESS"):
                # A private instance for this run: enough logical CPUs for every actor (they are
                # scheduling tokens; on one machine the local launcher shares the cores the same way).
                kwargs["num_cpus"] = max(os.cpu_count() or 1, math.ceil(_cpus_needed(cfg, opts)))
        ray.init(**kwargs)
        started = True
    try:
        return _Driver(cfg, opts, say, stop).run()
    finally:
        if started:
            ray.shutdown()


def _cpus_needed(cfg: EvalConfig, opts: RayOptions) -> float:
    """Logical CPUs the run's actors reserve (eval actors, replicas, one spare for a replacement)."""
    groups = len(split_groups(cfg.worker_ids, opts.workers_per_actor))
    return (groups + 1) * opts.cpus_per_actor + opts.policy_replicas * opts.cpus_per_replica


@dataclass
class _Group:
    index: int
    workers: list[str]
    actor: Any = None
    generation: int = 0
    deaths: int = 0
    done: bool = False
    result: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


class _Driver:
    def __init__(self, cfg: EvalConfig, opts: RayOptions, say: Emit, stop: Any) -> None:
        # Every actor (and every replacement) records into the invocation's one segment, which
        # the driver ends (run_eval has set the id; launch() may be called without it).
        cfg = with_segment_id(cfg)
        if cfg.record:
            # One results root for every actor: absolute (a worker's directory is not ours).
            cfg = replace(cfg, results_dir=str(resolve_results_root(cfg.results_dir)))
        if cfg.frames == "auto":
            # Every observation crosses a process (or node) boundary to its replica: JPEG frames
            # as the server sent them (lift2: ~0.26 MB instead of 7.4 MB raw), decoded lazily by
            # the policy that reads them. What a recording run uses anyway.
            cfg = replace(cfg, frames="jpeg")
        self.cfg = cfg
        self.opts = opts
        self.say = say
        self.stop = stop
        self.groups = [_Group(i, w) for i, w in enumerate(split_groups(cfg.worker_ids, opts.workers_per_actor))]
        self.replicas: dict[int, Any] = {}
        self.replica_info: dict[int, dict[str, Any]] = {}
        self.policy: dict[str, Any] = {}
        self.router: Any = None
        self.episodes: dict[str, dict[str, Any]] = {}
        self.summary = RunSummary()
        self.run_dirs: list[str] = []
        self.run_id: str | None = cfg.run_id
        self.failures: list[str] = []
        self.hints: list[str] = []
        self.fail_code = ExitCode.FAILURE
        self.announced = False
        self.stopping = False
        self.gpus = 0.0
        self.pending: dict[Any, tuple[str, int, int]] = {}
        self.router_info: dict[str, Any] | None = None
        #: The replicas' servers listen on their nodes' addresses: only this run's actors get in.
        self.api_key = secrets.token_urlsafe(24)

    # ------------------------------------------------------------------ start-up

    def _strategy_here(self) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        except Exception:  # Ray Client: the driver is on no node
            return "DEFAULT"

    def _start_replica(self, index: int) -> None:
        import ray

        gpus = self.opts.gpus_per_replica
        if gpus is None:
            resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
            gpus = 1.0 if resources.get("GPU", 0) >= 1 else 0.0
        self.gpus = gpus
        workers = len(self.cfg.worker_ids)
        per_replica = math.ceil(workers / self.opts.policy_replicas)
        cls = ray.remote(PolicyReplica).options(
            name=f"gmp-replica|{ray.get_runtime_context().get_job_id()}|{index}", namespace=NAMESPACE,
            num_cpus=self.opts.cpus_per_replica, num_gpus=gpus, scheduling_strategy="SPREAD",
            # (observations come over its server's connections: its Ray methods are the driver's
            # describe/stats and the groups' alive/last_failure)
            max_restarts=0, max_task_retries=0, max_concurrency=8,
        )
        handle = cls.remote(index, self.cfg.policy, dict(self.cfg.policy_args),
                            default_max_batch(self.cfg, per_replica), self.cfg.max_wait_ms,
                            api_key=self.api_key)
        self.replicas[index] = handle

    def _describe_replicas(self, indices: list[int]) -> None:
        import ray

        infos = ray.get([self.replicas[i].describe.remote() for i in indices], timeout=REPLICA_LOAD_S)
        for i, info in zip(indices, infos, strict=True):
            if info.get("error"):
                e = info["error"]
                err = PolicyError(f"policy replica {i}: {e['message']}", hint=e.get("hint"))
                err.exit_code = ExitCode(e.get("exit_code", int(ExitCode.FAILURE)))  # type: ignore[misc]
                raise err
            self.replica_info[i] = {**info, "num_gpus": self.gpus, "num_cpus": self.opts.cpus_per_replica,
                                    "state": "alive"}
            self.policy = info
            ray.get(self.router.add.remote(i, self.replicas[i], info["url"]))

    def _create_group(self, g: _Group) -> None:
        """Create group ``g``'s eval actor (a new generation) once its name is free."""
        import ray

        cfg = self.cfg if self.run_id is None else replace(self.cfg, run_id=self.run_id)
        cls = ray.remote(EvalGroup)
        name = _actor_name(cfg.url, g.workers)
        deadline = time.monotonic() + NAME_WAIT_S
        while True:
            try:
                g.actor = cls.options(
                    name=name, namespace=NAMESPACE, num_cpus=self.opts.cpus_per_actor,
                    scheduling_strategy="SPREAD", max_restarts=0, max_task_retries=0, max_concurrency=4,
                ).remote(g.index, cfg, g.workers, self.router, api_key=self.api_key)
                break
            except ValueError:
                # An actor of that name is alive: a previous driver's (killed, being cleaned up)
                # or a dead actor not yet reaped. Two actors must never drive the same workers.
                if time.monotonic() > deadline:
                    raise PolicyError(
                        f"workers {','.join(g.workers)} of {cfg.url} are still driven by another eval actor "
                        f"(Ray actor {name!r}) after {NAME_WAIT_S:.0f} s",
                        hint="stop the other gmp eval (or `ray stop`) and run again",
                    ) from None
                time.sleep(0.5)
        g.generation += 1

    def _placed(self, g: _Group) -> None:
        """Wait for group ``g``'s new actor to be up; record where it runs."""
        import ray

        try:
            g.info = {**ray.get(g.actor.where.remote(), timeout=REPLICA_LOAD_S), "generation": g.generation}
        except Exception as exc:  # it died at once: the run loop sees it
            g.info = {"group": g.index, "workers": g.workers, "generation": g.generation, "error": str(exc)}
        g.info["state"] = "running"
        g.history.append(g.info)

    # ------------------------------------------------------------------ the run

    def run(self) -> RunSummary:
        import ray

        t0 = time.perf_counter()
        need = _cpus_needed(self.cfg, self.opts) - self.opts.cpus_per_actor
        have = float(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
        if have < need:
            raise PolicyError(
                f"--launcher ray: the cluster offers {have:g} CPUs, the run's actors reserve {need:g} "
                f"({len(self.groups)} eval actors x {self.opts.cpus_per_actor:g}, "
                f"{self.opts.policy_replicas} replicas x {self.opts.cpus_per_replica:g})",
                hint="use fewer actors (--workers-per-actor), --cpus-per-replica 0.5, or add nodes "
                     "(ray start --address HEAD:6379)",
            )
        self.router = ray.remote(Router).options(
            num_cpus=0, scheduling_strategy=self._strategy_here(), max_restarts=0, max_task_retries=0,
        ).remote()
        pending: dict[Any, tuple[str, int, int]] = {}
        self.pending = pending
        ended = interrupted = False
        try:
            # Every actor's process starts at once (each costs a Python start and gmp's imports,
            # ~1 s on 2 cores): the eval actors come up while the replicas load the policy.
            for i in range(self.opts.policy_replicas):
                self._start_replica(i)
            for g in self.groups:
                self._create_group(g)
            self._describe_replicas(list(range(self.opts.policy_replicas)))
            for g in self.groups:
                self._placed(g)
                pending[g.actor.run.remote(self.policy)] = ("run", g.index, g.generation)
                pending[g.actor.next_events.remote()] = ("events", g.index, g.generation)
            self._record_cluster()
            self._loop(pending)
            ended = True
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            self._stop_all(grace_s=5.0)
            raise
        finally:
            self._finish(t0, ended=ended, interrupted=interrupted)
        if self.failures:
            err = WorkerProcessError("; ".join(self.failures), hint="; ".join(self.hints) or None)
            err.summary = self.summary  # type: ignore[attr-defined]
            if self.fail_code != ExitCode.FAILURE:
                err.exit_code = self.fail_code  # type: ignore[misc]
            raise err
        return self.summary

    def _loop(self, pending: dict[Any, tuple[str, int, int]]) -> None:
        import ray
        from ray.exceptions import RayActorError

        last_check = time.monotonic()
        while any(not g.done for g in self.groups):
            if self.stop is not None and self.stop.is_set():
                self._ask_stop()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in ready:
                kind, gi, gen = pending.pop(ref)
                g = self.groups[gi]
                if kind == "events":
                    try:
                        events = ray.get(ref)
                    except RayActorError:
                        continue  # its run() reports the death
                    self._handle(events)
                    if not g.done and gen == g.generation:
                        pending[g.actor.next_events.remote()] = ("events", gi, gen)
                    continue
                try:
                    result = ray.get(ref)
                except RayActorError as exc:
                    self._takeover(g, exc, pending)
                    continue
                # Its last events: everything it emitted is buffered by now.
                for other in [r for r, v in pending.items() if v[0] == "events" and v[1] == gi]:
                    pending.pop(other)
                    try:
                        self._handle(ray.get(other))
                    except RayActorError:
                        pass
                try:
                    self._handle(ray.get(g.actor.next_events.remote(0.0)))
                except RayActorError:
                    pass
                self._group_done(g, result)
            if time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                self._replace_dead_replicas()

    def _group_done(self, g: _Group, result: dict[str, Any]) -> None:
        g.done = True
        g.result = result
        g.info["state"] = "finished" if "summary" in result else "failed"
        if g.history:
            g.history[-1]["state"] = g.info["state"]
        if "error" in result:
            e = result["error"]
            if e.get("type") == "KeyboardInterrupt" and self.stopping:
                return
            self.failures.append(f"eval actor {g.index} (workers {','.join(g.workers)}) failed: {e['message']}")
            if e.get("hint") and e["hint"] not in self.hints:
                self.hints.append(e["hint"])
            if e.get("traceback"):
                log.error("%s", e["traceback"])
            try:
                self.fail_code = ExitCode(e.get("exit_code", int(ExitCode.FAILURE)))
            except ValueError:
                self.fail_code = ExitCode.FAILURE
            self._ask_stop()

    def _takeover(self, g: _Group, exc: BaseException, pending: dict[Any, tuple[str, int, int]]) -> None:
        g.deaths += 1
        g.info["state"] = "died"
        if g.history:
            g.history[-1]["state"] = "died"
        reason = type(exc).__name__
        if self.stopping:
            g.done = True
            return
        if g.deaths > MAX_TAKEOVERS:
            self.failures.append(
                f"eval actor {g.index} (workers {','.join(g.workers)}) died {g.deaths} times ({reason})")
            g.done = True
            self._ask_stop()
            return
        # Unreachable is not dead (its node may come back): make sure it is, before another actor
        # drives its workers (the name of the new one is free only once the old one is dead).
        _kill(g.actor)
        log.warning("eval actor %d (workers %s) died (%s): a new actor takes its workers over",
                    g.index, ",".join(g.workers), reason)
        self.say("takeover", {"group": g.index, "workers": list(g.workers), "reason": reason,
                              "generation": g.generation + 1})
        self._create_group(g)
        self._placed(g)
        pending[g.actor.run.remote(self.policy)] = ("run", g.index, g.generation)
        pending[g.actor.next_events.remote()] = ("events", g.index, g.generation)
        self._record_cluster()

    def _replace_dead_replicas(self) -> None:
        import ray
        from ray.exceptions import RayActorError

        dead = ray.get(self.router.take_dead.remote())
        for i in dead:
            self.replica_info.setdefault(i, {})["state"] = "died"
            _kill(self.replicas.get(i))
            for _attempt in range(MAX_TAKEOVERS):
                new = max(self.replicas) + 1
                log.warning("policy replica %d died: starting replica %d", i, new)
                self._start_replica(new)
                try:
                    self._describe_replicas([new])
                    break
                except RayActorError:
                    # placed on a node that is going away (not yet known dead): another one
                    self.replica_info[new] = {"index": new, "state": "died"}
                    _kill(self.replicas[new])
                except PolicyError as exc:
                    self.failures.append(str(exc))
                    self._ask_stop()
                    break
        if dead:
            self._record_cluster()

    # ------------------------------------------------------------------ events

    def _handle(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        cfg, s = self.cfg, self.summary
        for kind, payload in events:
            if kind == "episode":
                eid = str(payload.get("episode_id"))
                if eid in self.episodes:
                    continue  # (never counted twice)
                self.episodes[eid] = payload
                if self.run_id is None and eid.count("/") >= 2:
                    self.run_id = eid.split("/")[1]
                self.say(kind, payload)
                if cfg.max_episodes is not None and len(self.episodes) >= cfg.max_episodes:
                    self._ask_stop()
            elif kind == "steps":
                s.steps += int(payload.get("n", 0))
                self.say(kind, payload)
            elif kind == "lock_lost":
                s.lock_lost += 1
                self.say(kind, payload)
            elif kind == "restart":
                s.restarts += 1
                self.say(kind, payload)
            elif kind == "connected":
                s.codec = s.codec or payload.get("codec")
                if not self.announced:
                    self.announced = True
                    self.say(kind, payload)
            elif kind == "run_dir":
                path = str(payload["path"])
                if path not in self.run_dirs:
                    self.run_dirs.append(path)
                    if self.run_id is None:
                        self.run_id = Path(path).name
                    self._record_cluster()
                    self.say(kind, payload)
            else:
                self.say(kind, payload)

    def _ask_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for g in self.groups:
            if not g.done and g.actor is not None:
                g.actor.stop.remote()

    def _stop_all(self, grace_s: float) -> None:
        """Stop every group at its next step boundary and give their runs ``grace_s`` to end
        (recordings closed, workers released); what is still running then is killed by
        :meth:`_finish` and left to the next ``--run-id`` run, as after a SIGKILL."""
        import ray

        self._ask_stop()
        refs = self._running()
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=grace_s)

    def _running(self) -> list[Any]:
        """The ``run`` calls of the eval actors that have not returned (nor died) yet."""
        return [r for r, v in self.pending.items() if v[0] == "run"]

    # ------------------------------------------------------------------ the end

    def cluster(self) -> dict[str, Any]:
        import ray

        nodes = []
        for n in ray.nodes():  # type: ignore[no-untyped-call]
            nodes.append({"node_id": n.get("NodeID"), "ip": n.get("NodeManagerAddress"),
                          "host": n.get("NodeManagerHostname"), "alive": bool(n.get("Alive")),
                          "resources": {k: v for k, v in (n.get("Resources") or {}).items()
                                        if k in ("CPU", "GPU", "memory")}})
        try:
            routing = ray.get(self.router.table.remote(), timeout=10)
            if self.router_info is None:
                self.router_info = ray.get(self.router.where.remote(), timeout=10)
        except Exception:
            routing = None
        return {
            "launcher": "ray",
            "ray_version": ray.__version__,
            "address": self.opts.address,
            "nodes": nodes,
            "actors": [{**h, "group": g.index, "workers": g.workers} for g in self.groups for h in g.history],
            "replicas": [{"index": i, **{k: v for k, v in info.items()
                                          if k in ("node_id", "ip", "host", "pid", "num_gpus", "num_cpus",
                                                   "state", "batched", "url")}}
                         for i, info in sorted(self.replica_info.items())],
            "placement": {"eval_actors": "SPREAD", "replicas": "SPREAD", "router": "driver's node",
                          "workers_per_actor": self.opts.workers_per_actor,
                          "cpus_per_actor": self.opts.cpus_per_actor},
            "routing": routing,
            "router": self.router_info,
        }

    def _record_cluster(self) -> None:
        if not self.run_dirs:
            return
        info = self.cluster()

        def update(cur: dict[str, Any]) -> None:
            cur["cluster"] = info

        for d in self.run_dirs:
            try:
                merge_json(Path(d) / RUN_JSON, update, Path(d) / RUN_JSON_LOCK)
            except Exception as exc:  # the run goes on; the recorder reports real disk failures
                log.warning("cannot record the cluster in %s: %s", Path(d) / RUN_JSON, exc)

    def _finish(self, t0: float, *, ended: bool, interrupted: bool) -> None:
        """The run's summary and its last ``run.json`` writes; every actor killed.

        ``ended``: the run loop ended without an exception; ``interrupted``: by Ctrl-C or SIGTERM.
        """
        import ray

        s = self.summary
        s.episodes = list(self.episodes.values())
        batching: dict[str, Any] | None = None
        replica_stats = []
        for i, h in sorted(self.replicas.items()):
            if self.replica_info.get(i, {}).get("state") == "died":
                continue
            try:
                st = ray.get(h.stats.remote(), timeout=10)
            except Exception as exc:  # gone at the very end: its counters with it
                log.debug("policy replica %d: no stats (%s)", i, exc)
                continue
            replica_stats.append(st)
            if st["batching"]:  # (None: its policy never loaded)
                batching = merge_batch_stats(batching, st["batching"])
        s.batching = batching
        for g in self.groups:
            r = (g.result or {}).get("summary")
            if r:
                s.recoveries += int(r.get("recoveries", 0))
                s.codec = s.codec or r.get("codec")
                for d in r.get("run_dirs", []):
                    if d not in self.run_dirs:
                        self.run_dirs.append(d)
        s.run_dirs = list(self.run_dirs)
        s.complete = (not self.failures and all(g.result and g.result.get("summary", {}).get("complete")
                                                for g in self.groups))
        s.elapsed_s = time.perf_counter() - t0
        try:
            self._record_cluster_final(replica_stats)
        finally:
            for h in [g.actor for g in self.groups] + list(self.replicas.values()) + [self.router]:
                _kill(h)
            self._end_segment(ended=ended, interrupted=interrupted)

    def _end_segment(self, *, ended: bool, interrupted: bool) -> None:
        """End the invocation's ``run.json`` segment once, for every actor: each ran with
        ``segment_outcome=False`` (its own figures are only its group's, and a replaced actor's
        only what its generation did). The totals are the run summary's: its episodes, each once
        (keyed by episode id: one a replacement reports again is not counted twice), and the
        steps every generation of every actor reported."""
        import ray

        refs = self._running()
        if refs:
            # Actors still running when the run stopped were just killed: let them be gone first,
            # or a recorder's last merge of run.json could set the segment back to running.
            ray.wait(refs, num_returns=len(refs), timeout=10.0)
        s = self.summary
        end_segment(self.cfg, self.run_dirs, ok=ended and not self.failures, complete=s.complete,
                    interrupted=interrupted, episodes=len(self.episodes), steps=s.steps)

    def _record_cluster_final(self, replica_stats: list[dict[str, Any]]) -> None:
        if not self.run_dirs:
            return
        info = self.cluster()
        info["replica_batching"] = replica_stats

        def update(cur: dict[str, Any]) -> None:
            cur["cluster"] = info

        for d in self.run_dirs:
            try:
                merge_json(Path(d) / RUN_JSON, update, Path(d) / RUN_JSON_LOCK)
            except Exception as exc:
                log.warning("cannot record the cluster in %s: %s", Path(d) / RUN_JSON, exc)


def _kill(handle: Any) -> None:
    """``ray.kill`` an actor that may be dead already, or on a node that is gone."""
    import ray

    if handle is None:
        return
    try:
        ray.kill(handle)
    except Exception as exc:  # dead, or unreachable: nothing more to do from here
        log.debug("ray.kill: %s", exc)
