"""Handlers of ``gmp eval``, ``gmp submit`` and ``gmp status`` (the parser is in the meta package).

Data goes to stdout (the per-task table, ``--json``, the run id of ``submit``); talk, progress and
the results path go to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from genmanip_protocol.errors import ConfigError, ExitCode, GenmanipError
from genmanip_protocol.robots import resolve_robot
from genmanip_protocol.schema import ServerStatus, parse_status
from genmanip_results.stats import wilson_interval
from genmanip_runtime.config import config_path, resolve_setting
from genmanip_runtime.console import Console, table
from genmanip_runtime.redact import scrub_secrets
from genmanip_runtime.text import safe_text
from genmanip_runtime.transport import build_base_url

from .client import EvalClient
from .errors import GenmanipEvalError, JobComplete, PolicyError
from .policy import parse_policy_args
from .runner import EvalConfig, RunSummary, finish_recordings, safe_argv
from .runner import run_eval as _run_eval
from .wire import RETRY_DEADLINE_S

__all__ = ["EvalFlags", "eval_config", "eval_exit_code", "evaluate", "per_task_rows", "resume_command", "run_eval", "status", "submit",
           "summary_json"]


class JobRefused(GenmanipEvalError):
    """``gmp submit`` would disturb a job: exit 1 like the reference client."""

    exit_code = ExitCode.FAILURE


#: The config file's table of ``gmp eval``/``submit``/``status`` (``url``, ``token``, ``token_file``).
CONFIG_SECTION = "eval"
_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 8087
#: How long `gmp status` retries its first request (connection refused, 502/503) before it says so.
_FIRST_STATUS_S = 5.0


def _url(url: str | None, host: str | None, port: int | None) -> str:
    """The server: ``--url``, else ``--host``/``--port``, else ``[eval] url`` in the config file,
    else ``http://127.0.0.1:8087`` (the precedence rule of ``genmanip_runtime.config``)."""
    if url:
        return build_base_url(url)
    if host or port:
        return build_base_url(None, host or _DEFAULT_HOST, port or _DEFAULT_PORT)
    configured = resolve_setting(None, None, CONFIG_SECTION, "url", None)
    if configured is not None:
        if not isinstance(configured, str) or not configured.strip():
            raise ConfigError(
                f"config file {config_path()}: [{CONFIG_SECTION}] url must be a URL string, "
                f"got {configured!r}"
            )
        return build_base_url(configured)
    return build_base_url(None, _DEFAULT_HOST, _DEFAULT_PORT)


def _worker_ids(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        items = [s.strip() for s in str(value or "0").split(",")]
    return [s for s in items if s]


def per_task_rows(episodes: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Rows ``[task, n, SR, CI95, mean score]`` (sorted by task) plus a final ``all`` row."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for ep in episodes:
        by_task.setdefault(str(ep["task_name"]), []).append(ep)

    def row(name: str, eps: Sequence[Mapping[str, Any]]) -> list[Any]:
        n = len(eps)
        k = sum(1 for e in eps if e["success"])
        lo, hi = wilson_interval(k, n)
        mean = sum(float(e["score"]) for e in eps) / n if n else None
        return [name, n, k / n if n else None, f"[{lo:.2f}, {hi:.2f}]", mean]

    rows = [row(t, by_task[t]) for t in sorted(by_task)]
    if len(by_task) != 1:
        rows.append(row("all", list(episodes)))
    return rows


def _live_fields(state: dict[str, Any]) -> dict[str, Any]:
    n = state["episodes"]
    k = state["successes"]
    lo, hi = wilson_interval(k, n)
    fields: dict[str, Any] = {}
    if n:
        fields["SR"] = f"{k / n:.2f} [{lo:.2f},{hi:.2f}]"
    el = max(1e-9, time.perf_counter() - state["t0"])
    fields["steps/s"] = round(state["steps"] / el, 1)
    by_task = state.get("by_task") or {}
    if len(by_task) > 1:
        # per task so far, short names (the live line is cut to the terminal's width)
        fields["tasks"] = " ".join(f"{t.rsplit('/', 1)[-1]} {ok}/{n}" for t, (n, ok) in sorted(by_task.items()))
    until = state.get("waiting_until")
    if until is not None:
        fields["server"] = f"unreachable, giving up in {max(0, round(until - time.monotonic()))} s"
    lat = state["lat"]
    if lat["n"]:
        parts = [f"net {lat['network'] / lat['n']:.1f}"]
        if lat["server_n"]:
            parts.append(f"srv {lat['server'] / lat['server_n']:.1f}")
        if lat["policy_n"]:
            parts.append(f"pol {lat['policy'] / lat['policy_n']:.1f}")
        if lat["queue_n"]:
            parts.append(f"queue {lat['queue'] / lat['queue_n']:.1f}")
        fields["ms"] = "/".join(parts)
        if lat["batch_n"]:
            fields["batch"] = round(lat["batch"] / lat["batch_n"], 1)
    return fields


@dataclass(frozen=True)
class EvalFlags:
    """The flags of ``gmp eval`` that ``gmp online run`` shares: what :func:`eval_config` reads.

    Both handlers take them as keyword arguments (named after the parser's dests, as every
    handler does) and pass them on as one value: ``EvalFlags.of(locals())``.
    """

    worker_ids: str
    processes: int
    max_episodes: int | None
    max_recoveries: int
    policy: str | None
    policy_arg: Sequence[str] | None
    chunk_size: int | None
    step_chunk: bool
    robot: str | None
    arm_type: str | None
    gripper_type: str | None
    control_type: str | None
    codec: str
    frames: str
    render_mode: str | None
    subframes: int | None
    results_dir: str | None
    record: bool
    live_every: int
    plot_on_episode_end: bool
    runner: str
    transcode: str
    max_batch: int | None
    max_wait_ms: float | None
    compare_to: str | None
    stop_when_decided: bool
    alpha: float
    delta: float | None
    launcher: str
    ray_address: str | None
    workers_per_actor: int | None
    policy_replicas: int | None
    gpus_per_replica: float | None
    cpus_per_replica: float | None
    allow_policy_change: bool

    @classmethod
    def of(cls, scope: Mapping[str, Any]) -> EvalFlags:
        """The flags out of a handler's keyword arguments (its ``locals()``)."""
        return cls(**{f.name: scope[f.name] for f in dataclasses.fields(cls)})


def eval_config(
    console: Console,
    flags: EvalFlags,
    *,
    url: str,
    token: str | None,
    ca_cert: str | None,
    run_id: str | None,
) -> EvalConfig:
    """The :class:`EvalConfig` of ``gmp eval``'s flags, for a server at ``url`` (already built).

    The one reading of those flags, shared by ``gmp eval`` and ``gmp online run``: the legacy
    ``--arm-type``/``--gripper-type`` robot selection, ``--control-type`` (warned about on
    ``console`` unless the policy is ``zero``), an empty ``--worker-ids`` (an error).
    """
    f = flags
    robot = f.robot
    if robot is None and f.arm_type:
        robot = resolve_robot(f.arm_type, f.gripper_type).robot_id
    policy_args = parse_policy_args(f.policy_arg)
    if f.control_type:
        if (f.policy or "zero") == "zero":
            policy_args.setdefault("control_type", f.control_type)
        else:
            console.warn("--control-type only applies to --policy zero: your policy chooses each action's control_type")
    cfg = EvalConfig(
        url=url,
        token=token,
        run_id=run_id or None,
        worker_ids=_worker_ids(f.worker_ids),
        processes=max(1, int(f.processes or 1)),
        policy=f.policy or "zero",
        policy_args=policy_args,
        chunk_size=f.chunk_size if f.chunk_size and f.chunk_size > 1 else None,
        step_chunk=f.step_chunk,
        render_mode=f.render_mode,
        subframes=f.subframes,
        codec=f.codec or "auto",
        frames=f.frames or "auto",
        robot=robot,
        record=f.record,
        transcode=f.transcode or "deferred",
        results_dir=f.results_dir,
        live_every=int(f.live_every or 0),
        max_episodes=f.max_episodes,
        max_recoveries=max(0, int(f.max_recoveries)),
        plot_on_episode_end=f.plot_on_episode_end,
        ca_file=ca_cert,
        runner=f.runner,
        max_batch=f.max_batch,
        max_wait_ms=f.max_wait_ms,
        compare_to=f.compare_to or None,
        stop_when_decided=f.stop_when_decided,
        alpha=f.alpha,
        delta=f.delta,
        launcher=f.launcher or "local",
        launcher_options={
            k: v for k, v in (("address", f.ray_address), ("workers_per_actor", f.workers_per_actor),
                              ("policy_replicas", f.policy_replicas),
                              ("gpus_per_replica", f.gpus_per_replica),
                              ("cpus_per_replica", f.cpus_per_replica))
            if v is not None
        },
        allow_policy_change=f.allow_policy_change,
    )
    if cfg.launcher_options and cfg.launcher == "local":
        raise GenmanipEvalError(
            f"--{next(iter(cfg.launcher_options)).replace('_', '-').replace('address', 'ray-address')} "
            "only applies with --launcher ray"
        )
    if not cfg.worker_ids:
        raise GenmanipEvalError("--worker-ids: no worker id given")
    if f.stop_when_decided and not cfg.compare_to:
        raise GenmanipEvalError("--stop-when-decided needs --compare-to RUN (the run to compare with)")
    if not 0.0 < f.alpha < 1.0:
        raise GenmanipEvalError(f"--alpha {f.alpha:g}: expected a level between 0 and 1")
    return cfg


def eval_exit_code(cfg: EvalConfig, summary: RunSummary) -> int:
    """OK when the server's job is complete (or ``--max-episodes`` bounded the run, or the run
    stopped on a decision of ``--stop-when-decided``), else FAILURE."""
    decided = cfg.stop_when_decided and bool((summary.comparison or {}).get("decision"))
    return 0 if summary.complete or cfg.max_episodes is not None or decided else int(ExitCode.FAILURE)


def run_eval(
    *,
    url: str | None,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    run_id: str | None,
    worker_ids: str,
    processes: int,
    max_episodes: int | None,
    max_recoveries: int,
    policy: str | None,
    policy_arg: list[str],
    chunk_size: int,
    step_chunk: bool,
    robot: str | None,
    arm_type: str | None,
    gripper_type: str | None,
    control_type: str | None,
    codec: str,
    frames: str,
    render_mode: str | None,
    subframes: int | None,
    results_dir: str | None,
    record: bool,
    live_every: int,
    plot_on_episode_end: bool,
    runner: str,
    max_batch: int | None,
    max_wait_ms: float | None,
    compare_to: str | None,
    stop_when_decided: bool,
    alpha: float,
    delta: float | None,
    launcher: str,
    ray_address: str | None,
    workers_per_actor: int | None,
    policy_replicas: int | None,
    gpus_per_replica: float | None,
    cpus_per_replica: float | None,
    allow_policy_change: bool,
    as_json: bool,
    transcode: str,
    console: Console,
) -> int:
    """``gmp eval``: evaluate a policy, record the episodes, print per-task results."""
    cfg = eval_config(console, EvalFlags.of(locals()), url=_url(url, host, port), token=token,
                      ca_cert=ca_cert, run_id=run_id)
    summary = evaluate(cfg, console, policy_given=policy is not None, as_json=as_json)
    return eval_exit_code(cfg, summary)


class PolicyChanged(GenmanipEvalError):
    """Resuming a run with another policy than it was recorded with (exit 9, refused)."""

    exit_code = ExitCode.REFUSED


def _check_same_policy(cfg: EvalConfig, run_id: str, benchmark_id: str | None = None) -> Any:
    """The recorded run ``run_id`` of ``benchmark_id`` (the job's, when the server says; None:
    none here), refusing another policy spec or arguments than it was recorded with unless
    ``cfg.allow_policy_change``."""
    from genmanip_results.compare import RunNotFound, resolve_run

    try:
        # (the job's benchmark: the same run id under another benchmark is another run)
        run = resolve_run(run_id, cfg.results_dir, benchmark_id=benchmark_id)
    except RunNotFound:
        return None
    recorded = (run.manifest or {}).get("policy")
    if not isinstance(recorded, dict):
        return run
    before = (str(recorded.get("spec")), dict(recorded.get("args") or {}))
    now = (cfg.policy, dict(cfg.policy_args))
    if before != now and not cfg.allow_policy_change:
        def show(p: tuple[str, dict[str, Any]]) -> str:
            return p[0] + "".join(f" {k}={v}" for k, v in p[1].items())

        raise PolicyChanged(
            f"run {run_id} ({run.path}) was evaluated with policy {safe_text(show(before), limit=200)}; "
            f"this invocation runs {safe_text(show(now), limit=200)}: its results would mix two policies",
            hint="--allow-policy-change resumes anyway (run.json keeps each invocation's policy in "
            "'segments'); or evaluate the new policy under another run id",
        )
    return run


class PolicyRequired(GenmanipEvalError):
    """``gmp eval`` against a real server without ``--policy`` (exit 2)."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class _Job:
    """What ``gmp eval`` learnt about the server before starting (None: it did not answer)."""

    status: ServerStatus | None
    server: str
    testbed: bool
    robot: str | None


def _find_job(cfg: EvalConfig, console: Console) -> _Job:
    info: dict[str, Any] | None = None
    st: ServerStatus | None = None
    with EvalClient(cfg.url, cfg.worker_ids, cfg.run_id, cfg.token, kill_on_close=False,
                    ca_file=cfg.ca_file) as probe:
        try:
            st = parse_status({"data": probe.status(retry=False)})
        except GenmanipError as exc:
            # (the run's own first request says what is wrong, after its retries)
            console.debug(f"GET /status failed ({exc}); no episode total")
        if st is not None:
            # Only once the server answered (no waiting for one that does not). A /protocol that
            # fails would fail the run the same way: its error is the one to show.
            probe.connect()
            info = probe.server_info
    name = safe_text(str((info or {}).get("server") or ""), limit=40)
    version = safe_text(str((info or {}).get("version") or ""), limit=20)
    server = f"{name} {version}".strip() if name else "a GenManip server"
    robot = cfg.robot or (info or {}).get("robot_id")
    # (the testbed says it is one: GET /protocol "testbed": true; the real server has no /protocol)
    testbed = (info or {}).get("testbed") is True
    return _Job(st, server, testbed, safe_text(str(robot), limit=40) if robot else None)


def _start_line(cfg: EvalConfig, job: _Job, label: str) -> str:
    st = job.status
    parts = [f"{label}: {cfg.url} ({job.server})"]
    if st is not None:
        parts.append(f"run {safe_text(str(st.run_id), limit=80)} (benchmark "
                     f"{safe_text(str(st.benchmark_id), limit=40)}, {st.status})")
        parts.append(f"job {st.total_episodes} episodes, {st.completed_episodes} done")
    parts.append(f"robot {job.robot or 'from the server'}")
    args = "".join(f" {k}={v}" for k, v in cfg.policy_args.items())
    parts.append(f"policy {cfg.policy}{args}")
    how = f"{cfg.runner} runner" + (f", {cfg.processes} processes" if cfg.processes > 1 else "")
    if cfg.launcher != "local":
        how += f", launcher {cfg.launcher}"
    parts.append(f"workers {','.join(cfg.worker_ids)} ({how})")
    return "; ".join(parts)


def summary_json(cfg: EvalConfig, summary: RunSummary, episodes: Sequence[Mapping[str, Any]], *,
                 run_id: str | None) -> dict[str, Any]:
    """``gmp eval --json``: the run's outcome for scripts (schema ``gmp-eval/1``).

    ``tasks``/``overall``: ``n``, ``successes``, ``sr``, ``ci95`` ([lo, hi], Wilson) and
    ``mean_score`` over ``episodes`` (the whole run's when resumed); ``invocation``: what this
    invocation did (episodes, steps, wall time in s, complete, batching, comparison)."""

    def stats(eps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        n = len(eps)
        k = sum(1 for e in eps if e["success"])
        lo, hi = wilson_interval(k, n)
        return {"n": n, "successes": k, "sr": k / n if n else None, "ci95": [lo, hi],
                "mean_score": sum(float(e["score"]) for e in eps) / n if n else None}

    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for ep in episodes:
        by_task.setdefault(str(ep["task_name"]), []).append(ep)
    return {
        "schema": "gmp-eval/1",
        "server": cfg.url,
        "run_id": run_id,
        "policy": {"spec": cfg.policy, "args": dict(cfg.policy_args)},
        "tasks": {t: stats(by_task[t]) for t in sorted(by_task)},
        "overall": stats(list(episodes)),
        "invocation": {
            "episodes": len(summary.episodes), "steps": summary.steps,
            "elapsed_s": round(summary.elapsed_s, 3), "complete": summary.complete,
            "recoveries": summary.recoveries, "restarts": summary.restarts,
            "lock_lost": summary.lock_lost, "batching": summary.batching,
            "comparison": summary.comparison, "run_dirs": list(summary.run_dirs),
        },
    }


def evaluate(cfg: EvalConfig, console: Console, *, label: str = "eval",
             policy_given: bool = True, as_json: bool = False) -> RunSummary:
    """Run ``cfg`` with a live progress line; print the per-task table and the results path.

    Shared by ``gmp eval``, ``gmp demo`` and ``gmp online run``. First one line says what it found
    and will run (server, run, job, robot, policy, workers). A finished job raises
    :class:`JobComplete` (exit 10) unless ``cfg.run_id`` names it (resuming a finished run: there
    is nothing left, exit 0). Without ``policy_given`` (no ``--policy``), only the testbed runs the
    built-in zero policy; a real server raises :class:`PolicyRequired`.

    Raises:
        JobComplete, PolicyRequired: see above.
    """
    job = _find_job(cfg, console)
    if not policy_given:
        # (a server that does not answer at all fails the run at its first request, saying so:
        # that error, not this one, is what the user needs)
        if not job.testbed and job.status is not None:
            raise PolicyRequired(
                f"--policy is required against {cfg.url} ({job.server}): without one, gmp would run "
                "the built-in zero policy (it holds the robot still) over the whole job",
                hint="--policy pkg.module:factory (or a registered name); --policy zero runs the "
                "no-op on purpose",
            )
        console.info(f"{label}: no --policy: running the built-in zero policy (holds the robot still; "
                     "the default on the testbed only)")
    console.info(_start_line(cfg, job, label))
    st = job.status
    rid_now = cfg.run_id or (st.run_id if st is not None else None)
    earlier = (_check_same_policy(cfg, str(rid_now), st.benchmark_id if st is not None else None)
               if rid_now and cfg.record else None)
    if st is not None and (st.complete or (st.total_episodes > 0 and st.completed_episodes >= st.total_episodes)):
        rid = safe_text(str(st.run_id), limit=80)
        where = f"{cfg.url} has finished its job: run {rid} (benchmark {safe_text(str(st.benchmark_id), limit=40)}, " \
                f"{st.completed_episodes}/{st.total_episodes} episodes)"
        if cfg.run_id and cfg.run_id == st.run_id:
            console.info(f"{label}: run {rid} is complete on {cfg.url}: nothing left to evaluate")
            # ... but what a stopped invocation left of its recordings (videos cut short by a
            # Ctrl-C) is finished here, as a resume with episodes left would do first.
            finished = finish_recordings(cfg)
            if finished:
                console.info(f"{label}: finished the recordings of {finished} episode(s) a stopped "
                             "invocation left")
            return RunSummary(complete=True)
        raise JobComplete(
            f"{where}: nothing to evaluate",
            hint=f"start a new job (gmp submit CONFIG... [--run-id NEW]) then gmp eval; to resume "
            f"this finished run on purpose: gmp eval --run-id {rid} (exits 0)",
        )
    done_before = st.completed_episodes if st is not None else 0
    job_total = st.total_episodes if st is not None and st.total_episodes else None
    if cfg.max_episodes is not None:
        job_total = done_before + cfg.max_episodes if job_total is None else min(
            job_total, done_before + cfg.max_episodes)
    total: int | None = st.total_episodes - st.completed_episodes if st is not None and st.total_episodes else None
    if cfg.max_episodes is not None:
        total = min(total, cfg.max_episodes) if total else cfg.max_episodes
    state: dict[str, Any] = {
        "episodes": 0,
        "successes": 0,
        "by_task": {},
        "steps": 0,
        "t0": time.perf_counter(),
        "lat": {"n": 0, "network": 0.0, "server": 0.0, "server_n": 0, "policy": 0.0, "policy_n": 0,
                "queue": 0.0, "queue_n": 0, "batch": 0.0, "batch_n": 0},
        "run_dirs": [],
    }
    with console.progress(total, label) as progress:

        def emit(kind: str, payload: dict[str, Any]) -> None:
            if kind == "steps":
                state["steps"] += payload["n"]
                lat = state["lat"]
                if payload.get("network_ms") is not None:
                    lat["n"] += 1
                    lat["network"] += payload["network_ms"]
                if payload.get("server_ms") is not None:
                    lat["server_n"] += 1
                    lat["server"] += payload["server_ms"]
                if payload.get("policy_ms") is not None:
                    lat["policy_n"] += 1
                    lat["policy"] += payload["policy_ms"]
                if payload.get("queue_ms") is not None:
                    lat["queue_n"] += 1
                    lat["queue"] += payload["queue_ms"]
                if payload.get("batch_size"):
                    lat["batch_n"] += 1
                    lat["batch"] += payload["batch_size"]
                progress.set(**_live_fields(state))
            elif kind == "episode":
                state["episodes"] += 1
                state["successes"] += 1 if payload["success"] else 0
                done_ok = state["by_task"].setdefault(str(payload["task_name"]), [0, 0])
                done_ok[0] += 1
                done_ok[1] += 1 if payload["success"] else 0
                progress.update(1, **_live_fields(state))
                if not progress.live:
                    mark = "success" if payload["success"] else "failure"
                    # numbered within the whole job: a resumed run goes on from what was done
                    console.info(
                        f"episode {done_before + state['episodes']}{'/' + str(job_total) if job_total else ''}: "
                        f"{payload['task_name']} seed {payload['seed']}: {mark} "
                        f"(score {float(payload['score']):.2f}, worker {payload['worker_id']})"
                    )
            elif kind == "lock_lost":
                console.warn(
                    f"worker {payload.get('worker_id')}: the server lost the episode lock; "
                    "the episode was aborted and re-queued"
                )
            elif kind == "restart":
                console.warn(
                    f"worker {payload.get('worker_id')}: episode {payload.get('episode_id')} restarted "
                    f"({payload.get('reason')})"
                )
            elif kind == "connected":
                console.debug(f"connected: codec={payload['codec']} frames={payload['frames']}")
            elif kind == "waiting_for_server":
                if state.get("waiting_until") is None:
                    state["waiting_until"] = float(payload["until"])
                    if not progress.live:
                        console.warn(f"the server at {cfg.url} does not answer ({payload.get('reason')}): "
                                     f"waiting up to {max(0, round(payload['until'] - time.monotonic()))} s")
                progress.set(**_live_fields(state))
            elif kind == "server_back":
                state["waiting_until"] = None
                with console.lock:
                    progress.fields.pop("server", None)
                progress.set(**_live_fields(state))
            elif kind == "decided":
                console.info(_verdict(payload, cfg))
            elif kind == "run_dir":
                if payload["path"] not in state["run_dirs"]:
                    state["run_dirs"].append(payload["path"])

        ticking = threading.Event()

        def tick() -> None:
            # The clock (and a recovery's countdown) moves even while no step does.
            while not ticking.wait(1.0):
                progress.set(**_live_fields(state))

        ticker = threading.Thread(target=tick, name="gmp-progress", daemon=True)
        if progress.live:
            ticker.start()
        try:
            summary = _run_eval(cfg, emit=emit)
        except BaseException as exc:
            stopped_rid = cfg.run_id or (st.run_id if st is not None else None)
            if stopped_rid and label == "eval" and not isinstance(exc, (PolicyError, JobComplete)):
                # Stopped by Ctrl-C, SIGTERM, a dead server or a failure: finished episodes are
                # kept, and this is how to do the rest (said after the error, by gmp's main).
                progress.close()
                console.info(f"{label}: stopped; finished episodes are kept. To resume: "
                             f"{resume_command(cfg, str(stopped_rid))}")
            raise
        finally:
            ticking.set()
    elapsed = summary.elapsed_s or 1e-9
    console.info(
        f"{label}: {len(summary.episodes)} episodes, {summary.steps} steps in {elapsed:.1f} s "
        f"({summary.steps / elapsed:.1f} steps/s)"
        + (
            f"; recordings complete after {summary.recorded_s:.1f} s ({cfg.transcode})"
            if summary.recorded_s is not None
            else ""
        )
        + (f", {summary.lock_lost} lock losses" if summary.lock_lost else "")
        + (
            f", {summary.recoveries} failed requests recovered from ({summary.restarts} episodes restarted)"
            if summary.recoveries
            else ""
        )
    )
    b = summary.batching
    if b and b.get("batches"):
        console.info(
            f"{label}: policy called {b['batches']} times for {b['items']} observations (mean batch "
            f"{b['mean_batch']:g}, {b['mean_call_ms']:.1f} ms per call, {b['mean_queue_ms']:.1f} ms "
            "waiting for a batch)"
        )
    episodes = summary.episodes
    if earlier is not None and summary.run_dirs:
        # A resumed run: the table is the whole run's, not this invocation's part of it.
        whole = _whole_run(summary.run_dirs[0])
        if whole is not None and len(whole) > len(episodes):
            console.info(f"{label}: run {rid_now}: {len(whole)} finished episodes in all; this "
                         f"invocation added {len(episodes)}")
            episodes = whole
    if as_json:
        print(json.dumps(summary_json(cfg, summary, episodes, run_id=rid_now), indent=2), flush=True)
    elif episodes:
        rows = per_task_rows(episodes)
        print(table(rows, ["task", "n", "SR", "SR 95% CI", "mean score"]), end="", flush=True)
    for d in summary.run_dirs or state["run_dirs"]:
        console.info(f"results: {d}")
    comparison = summary.comparison or {}
    if cfg.compare_to and not comparison.get("decision"):
        console.info(f"compared with {comparison.get('baseline', cfg.compare_to)}: undecided after "
                     f"{comparison.get('n', 0)} pair(s) (see gmp compare)")
    stopped_on_decision = cfg.stop_when_decided and bool(comparison.get("decision"))
    if not summary.complete and cfg.max_episodes is None and not stopped_on_decision:
        console.warn("the server's job is not complete (stopped early)")
    return summary


def _whole_run(run_dir: str) -> list[dict[str, Any]] | None:
    """Every finished episode recorded in ``run_dir`` (``per_task_rows`` form), or None."""
    from genmanip_results.discovery import load_run

    try:
        run = load_run(run_dir)
    except (OSError, GenmanipError):
        return None
    return [{"task_name": e.task_name, "seed": e.seed, "score": e.score, "success": bool(e.success)}
            for e in run.episodes if e.complete and e.score is not None]


#: gmp's own flags that may come before the subcommand (``gmp -v eval ...``): kept as given.
_GLOBAL_FLAG = re.compile(r"-v+|-q|--verbose|--quiet")


def resume_command(cfg: EvalConfig, run_id: str, argv: Sequence[str] | None = None) -> str:
    """The command that resumes ``run_id``: this invocation's ``gmp eval`` arguments (``argv``,
    default ``sys.argv``) with ``--run-id`` set and every secret left out
    (:func:`genmanip_eval.runner.safe_argv`, ``drop``: the token comes from ``$GMP_TOKEN`` or the
    config file when the command is run again). Without them (called as a library), the essential
    flags."""
    import shlex
    import sys

    args = safe_argv(list(sys.argv if argv is None else argv)[1:], drop=True)
    lead = 0
    while lead < len(args) and _GLOBAL_FLAG.fullmatch(args[lead]):
        lead += 1
    if args[lead:lead + 1] == ["eval"]:
        out: list[str] = []
        skip = False
        for a in args:
            if skip:
                skip = False
            elif a in ("--run-id", "--run_id"):
                skip = True
            elif not a.startswith(("--run-id=", "--run_id=")):
                out.append(a)
    else:
        out = ["eval", "--url", cfg.url, "--worker-ids", ",".join(cfg.worker_ids), "--policy", cfg.policy]
        for k, v in cfg.policy_args.items():
            out += ["--policy-arg", f"{k}={v}"]
    return "gmp " + shlex.join([*out, "--run-id", run_id])


def _verdict(payload: Mapping[str, Any], cfg: EvalConfig) -> str:
    """The line ``gmp eval`` prints when the sequential comparison decides."""
    what = payload.get("description") or payload.get("decision")
    decided_at = payload.get("decided_at") or payload.get("n") or 0
    tail = (f"; stopping: {max(0, int(payload.get('n') or 0) - int(decided_at))} paired episode(s) saved"
            if cfg.stop_when_decided else "; going on (no --stop-when-decided)")
    return (f"compared with {payload.get('baseline', cfg.compare_to)}: {what} "
            f"(decided after {decided_at} pair(s) at "
            f"alpha {cfg.alpha:g}){tail}")


def submit(
    *,
    configs: list[str],
    run_id: str | None,
    url: str | None,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    console: Console,
) -> int:
    """``gmp submit CONFIG...``: start a job, status-aware like the reference client."""
    configs = [str(c) for c in configs]
    run_id = run_id or None
    with EvalClient(
        _url(url, host, port), ["0"], None, token, kill_on_close=False, ca_file=ca_cert,
    ) as client:
        st = parse_status({"data": client.status()})
        if st.status == "running" and st.active_workers:
            raise JobRefused(
                f"the server is running run {st.run_id!r} with active workers "
                f"{', '.join(st.active_workers)}; not starting a new job (it would kill them)",
                hint="wait for it (gmp status --watch), or stop its clients first",
            )
        if st.status == "complete" and run_id is not None and run_id == st.run_id:
            console.success(f"run {run_id} is already complete; nothing to do")
            print(run_id)
            return int(ExitCode.OK)
        if st.status == "incomplete" and st.run_id and run_id is None:
            raise JobRefused(
                f"the server's run {st.run_id!r} is incomplete "
                f"({st.completed_episodes}/{st.total_episodes} episodes done)",
                hint=f"resume it with: gmp submit {' '.join(configs)} --run-id {st.run_id}  "
                "(or pass a new --run-id to start another run)",
            )
        if run_id is None:
            run_id = datetime.now().strftime("%Y-%m-%d_%H_%M_%S_%f")
        resuming = st.run_id == run_id and st.status == "incomplete"
        payload = client._json_call(
            "/start_new_job",
            {"data": {"config_path": configs, "run_id": run_id}},
            timeout_key="start_new_job",
            retry=False,
        )
    if not (isinstance(payload, dict) and isinstance(payload.get("data"), dict) and payload["data"].get("success")):
        raise GenmanipEvalError(
            f"/start_new_job did not confirm success: {safe_text(json.dumps(payload), limit=200)}"
        )
    console.success(("resumed" if resuming else "started") + f" run {run_id}: {', '.join(configs)}")
    print(run_id)
    return int(ExitCode.OK)


def _status_text(st: ServerStatus, console: Console) -> str:
    lines = [
        f"status:      {st.status}",
        f"benchmark:   {st.benchmark_id or '-'}",
        f"run id:      {st.run_id or '-'}",
    ]
    prog = st.progress
    bar = ""
    if prog is not None:
        width = 30
        filled = round(prog * width)
        bar = "[" + "#" * filled + "." * (width - filled) + f"] {100 * prog:.0f}%"
    lines.append(f"episodes:    {st.completed_episodes}/{st.total_episodes} done, "
                 f"{st.in_progress_episodes} in progress  {bar}".rstrip())
    lines.append(f"workers:     {', '.join(st.active_workers) or '-'}")
    # Every field but the numbers is the server's text: printed, it must not drive the terminal.
    text = "\n".join(safe_text(line) for line in lines) + "\n"
    if st.mean_scores:
        rows = [[task, score] for task, score in sorted(st.mean_scores.items())]
        text += "\n" + table(rows, ["task", "mean score"])
        text += "(the server reports mean scores per task; partial credit counts, so this is not a success rate)\n"
    return text


def status(
    *,
    as_json: bool,
    watch: bool,
    interval: float,
    run_id: str | None,
    url: str | None,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    console: Console,
) -> int:
    """``gmp status``: the server's job status and per-task mean scores."""
    want_run = run_id
    interval = max(0.2, float(interval or 2.0))
    with EvalClient(
        _url(url, host, port), ["0"], None, token, kill_on_close=False, ca_file=ca_cert,
    ) as client:
        last = None
        while True:
            # The first answer is waited for briefly (a wrong URL is said in seconds, not after
            # half a minute of silence); with --watch, a server restarting later is waited for.
            data = client.status(refresh=True, retry_deadline=RETRY_DEADLINE_S if last is not None else _FIRST_STATUS_S)
            st = parse_status({"data": data})
            if want_run and st.run_id != want_run:
                console.warn(f"the server's current run is {st.run_id!r}, not {want_run!r}")
            if as_json:
                # json.dumps escapes every control character; an echoed token is scrubbed.
                out = scrub_secrets(json.dumps(data, sort_keys=True))
                if out != last:
                    print(out, flush=True)
                last = out
            else:
                text = _status_text(st, console)
                if text != last:
                    if last is not None and console.is_tty:
                        print("", flush=True)
                    print(text, end="", flush=True)
                last = text
            # A fresh job reads "idle" too: only stop watching an idle server with no tasks.
            if not watch or st.complete or (
                st.status == "idle" and st.total_episodes == 0
            ):
                break
            time.sleep(interval)
    return int(ExitCode.OK)
