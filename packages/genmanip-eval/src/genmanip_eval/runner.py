"""The policy runner behind ``gmp eval``: policies per worker, chunking, recording, processes.

:func:`run_workers` drives one :class:`~genmanip_eval.client.EvalClient` (one request per step for
all of its workers) in the calling process. :func:`run_eval` spreads the worker ids over N
processes (``multiprocessing`` spawn; each loads the policy once) and gathers their events; a
process that dies is reported with its exit reason and ends the run with a failure — it never hangs.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import platform
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.text import SafeFormatter

from .client import DEFAULT_URL, EvalClient
from .errors import PolicyError, WorkerProcessError
from .hooks import load_episode_hook
from .policy import PolicyHandle
from .recording import Recorder, resolve_results_root

__all__ = ["EvalConfig", "RunSummary", "package_versions", "run_eval", "run_workers"]

log = logging.getLogger("genmanip_eval.runner")

Emit = Callable[[str, dict[str, Any]], None]


@dataclass
class EvalConfig:
    """Everything ``gmp eval`` needs (picklable: it is sent to worker processes).

    ``chunk_size`` None/1 with a ``get_action`` policy means one action per step; otherwise the
    policy's chunk (truncated to ``chunk_size``) is replayed step by step (client-side buffering)
    or, with ``step_chunk``, sent whole through ``/step_chunk``.
    """

    url: str = DEFAULT_URL
    token: str | None = field(default=None, repr=False)
    run_id: str | None = None
    worker_ids: list[str] = field(default_factory=lambda: ["0"])
    processes: int = 1
    policy: str = "zero"
    policy_args: dict[str, str] = field(default_factory=dict)
    chunk_size: int | None = None
    step_chunk: bool = False
    render_mode: str | None = None
    subframes: int | None = None
    codec: str = "auto"
    frames: str = "auto"
    robot: str | None = None
    record: bool = True
    results_dir: str | None = None
    live_every: int = 0
    max_episodes: int | None = None
    #: consecutive failed requests per worker recovered from before giving up (0: stop at once)
    max_recoveries: int = 5
    timeouts: dict[str, float] | None = None
    ca_file: str | None = None
    #: Plot each episode once it is recorded (the ``plot`` hook of genmanip-artifacts).
    plot_on_episode_end: bool = False

    def manifest(self) -> dict[str, Any]:
        """The ``run.json`` fields (never the token)."""
        return {
            "server_url": self.url,
            "run_id": self.run_id,
            "workers": list(self.worker_ids),
            "processes": self.processes,
            "codec": self.codec,
            "frames": self.frames,
            "chunk": {
                "chunk_size": self.chunk_size,
                "step_chunk": self.step_chunk,
                "render_mode": self.render_mode,
                "subframes": self.subframes,
            },
            "policy": {"spec": self.policy, "args": dict(self.policy_args)},
            "robot": self.robot,
            "max_episodes": self.max_episodes,
            "max_recoveries": self.max_recoveries,
            "plot_on_episode_end": self.plot_on_episode_end,
            "host": socket.gethostname(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": package_versions(),
            "argv": _safe_argv(),
        }


@dataclass
class RunSummary:
    """What a run produced."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    steps: int = 0
    elapsed_s: float = 0.0
    lock_lost: int = 0
    #: failed requests recovered from, and episodes restarted because of one
    recoveries: int = 0
    restarts: int = 0
    codec: str | None = None
    complete: bool = False


def package_versions() -> dict[str, str]:
    """Installed versions of every ``genmanip*`` distribution (importlib.metadata)."""
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        if name.lower().replace("_", "-").startswith("genmanip"):
            out[name] = dist.version
    if "genmanip-eval" not in out:
        from .__about__ import __version__

        out["genmanip-eval"] = f"{__version__} (source)"
    return dict(sorted(out.items()))


def _safe_argv() -> list[str]:
    # The command line minus any token value (--token X or --token=X).
    out: list[str] = []
    skip = False
    for a in sys.argv:
        if skip:
            out.append("***")
            skip = False
        elif a in ("--token",):
            out.append(a)
            skip = True
        elif a.startswith("--token="):
            out.append("--token=***")
        else:
            out.append(a)
    return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def run_workers(
    cfg: EvalConfig,
    worker_ids: list[str] | None = None,
    *,
    emit: Emit | None = None,
    stop: Any = None,
) -> RunSummary:
    """Evaluate ``cfg.policy`` on ``worker_ids`` (default ``cfg.worker_ids``) in this process.

    ``emit(kind, payload)`` receives ``"connected"``, ``"episode"`` (a finished episode),
    ``"steps"`` (after every request: executed steps and the latency split in ms),
    ``"lock_lost"`` and ``"run_dir"`` events. ``stop`` (an Event) ends the loop early.
    """
    wids = list(worker_ids or cfg.worker_ids)
    say: Emit = emit or (lambda kind, payload: None)
    policies = {w: PolicyHandle.create(cfg.policy, cfg.policy_args) for w in wids}
    first = policies[wids[0]]
    n = cfg.chunk_size if cfg.chunk_size and cfg.chunk_size > 0 else None
    if cfg.step_chunk:
        if not first.has_chunk:
            raise PolicyError(
                f"--step-chunk needs a policy with get_action_chunk(obs); {cfg.policy} has only get_action"
            )
        mode = "step_chunk"
    elif first.has_chunk and (not first.has_action or (n is not None and n > 1)):
        mode = "buffered"
    elif n is not None and n > 1:
        raise PolicyError(f"--chunk-size {n} needs a policy with get_action_chunk(obs); {cfg.policy} has only get_action")
    else:
        mode = "single"

    summary = RunSummary()
    recorder: Recorder | None = None
    plot_hook: Any = None
    frames = cfg.frames
    if cfg.record:
        if frames == "auto":
            frames = "jpeg"  # the recorder stores JPEG bytes as received: no encoding on the hot path
        manifest = cfg.manifest()
        manifest["workers"] = wids
        manifest["started"] = _now()
        manifest["mode"] = mode
        if cfg.plot_on_episode_end:
            # Loaded by name: genmanip-eval never imports genmanip-artifacts.
            plot_hook = load_episode_hook("plot")
        recorder = Recorder(
            resolve_results_root(cfg.results_dir),
            manifest=manifest,
            live_every=cfg.live_every,
            on_episode_complete=plot_hook,
        )
        if cfg.run_id:
            # A resumed run: finish episodes a killed predecessor recorded but did not transcode.
            recorder.recover_run_id(cfg.run_id)
    elif cfg.plot_on_episode_end:
        raise PolicyError("--plot-on-episode-end plots recorded episodes: it cannot be used with --no-record")

    stop_flag = threading.Event()

    def on_event(name: str, payload: dict[str, Any]) -> None:
        if name == "episode_finished":
            er = payload["episode_result"]
            ep = {
                "worker_id": payload["worker_id"],
                "episode_id": er["episode_id"],
                "task_name": er["task_name"],
                "seed": er["seed"],
                "score": er["score"],
                "sr": er["sr"],
                "success": abs(float(er["score"]) - 1.0) <= 1e-6,
            }
            summary.episodes.append(ep)
            say("episode", ep)
            if cfg.max_episodes is not None and len(summary.episodes) >= cfg.max_episodes:
                stop_flag.set()
        elif name == "lock_lost":
            summary.lock_lost += 1
            say("lock_lost", payload)
        elif name == "episode_restarted":
            summary.restarts += 1
            say("restart", payload)

    client = EvalClient(
        cfg.url,
        wids,
        cfg.run_id,
        cfg.token,
        codec=cfg.codec,
        frames=frames,
        robot=cfg.robot,
        timeouts=cfg.timeouts,
        render_mode=cfg.render_mode,
        subframes=cfg.subframes,
        on_event=on_event,
        listener=recorder,
        ca_file=cfg.ca_file,
        max_recoveries=cfg.max_recoveries,
    )
    buffers: dict[str, deque[tuple[Any, int | None, int, int]]] = {w: deque() for w in wids}
    t_start = time.perf_counter()
    ok = False
    try:
        if recorder is not None:
            try:
                total = client.status(retry=False).get("total_episodes")
                if isinstance(total, int) and total > 0:
                    recorder.manifest["total_episodes"] = total
            except GenmanipError as exc:
                log.debug("GET /status failed (%s): run.json without total_episodes", exc)
        entries = client.reset()
        summary.codec = client.codec_name
        say("connected", {"codec": client.codec_name, "frames": client.frames, "workers": wids})
        reported_dirs: set[str] = set()
        while not client.done:
            if stop_flag.is_set() or (stop is not None and stop.is_set()):
                break
            if recorder is not None:
                recorder.check()
                for d in recorder.run_dirs:
                    if str(d) not in reported_dirs:
                        reported_dirs.add(str(d))
                        say("run_dir", {"path": str(d)})
            actions: dict[str, Any] = {}
            meta: dict[str, dict[str, Any]] = {}
            for wid in wids:
                obs = entries[wid]["obs"]
                if obs is None:
                    continue
                pol = policies[wid]
                if obs.get("reset"):
                    pol.reset()
                    buffers[wid].clear()
                t0 = time.perf_counter()
                if mode == "single":
                    actions[wid] = pol.action(obs)
                    meta[wid] = {"policy_ms": (time.perf_counter() - t0) * 1000}
                elif mode == "step_chunk":
                    chunk = pol.chunk(obs)
                    actions[wid] = chunk[:n] if n else chunk
                    meta[wid] = {"policy_ms": (time.perf_counter() - t0) * 1000}
                else:
                    buf = buffers[wid]
                    if not buf:
                        chunk = pol.chunk(obs)
                        chunk = chunk[:n] if n else chunk
                        ts = obs.get("timestep")
                        buf.extend((a, None if ts is None else int(ts), i, len(chunk)) for i, a in enumerate(chunk))
                    action, ots, idx, size = buf.popleft()
                    actions[wid] = action
                    meta[wid] = {
                        "policy_ms": (time.perf_counter() - t0) * 1000,
                        "obs_timesteps": [ots],
                        "chunk": [{"index": idx, "size": size}],
                    }
            if not actions:
                # Every worker that is not finished is still resetting: wait for one.
                entries = client.poll()
                continue
            entries, _done = client.step(actions, meta=meta)
            executed = sum(e["executed_steps"] for e in entries.values())
            summary.steps += executed
            timing = [client.timing(w) for w in actions]
            say(
                "steps",
                {
                    "n": executed,
                    "network_ms": _mean([t.network_ms if t.network_ms is not None else t.total_ms for t in timing]),
                    "server_ms": _mean([t.server_ms for t in timing]),
                    "policy_ms": _mean([t.policy_ms for t in timing]),
                },
            )
        summary.complete = client.done
        ok = True
    finally:
        summary.elapsed_s = time.perf_counter() - t_start
        summary.recoveries = int(client.stats.get("recoveries", 0))
        try:
            client.close()
        finally:
            if recorder is not None:
                try:
                    try:
                        extra = {"metric": dict(recorder.final_metric)} if recorder.final_metric else {}
                        recorder.update_manifest(
                            finished=_now(), codec=client.codec_name, frames=client.frames, **extra
                        )
                    finally:
                        recorder.close()
                except GenmanipError as exc:
                    if ok:
                        raise
                    # the first error is what the user needs; a traceback for this one only with -vv
                    log.error("recording also failed while stopping: %s", exc,
                              exc_info=log.isEnabledFor(logging.DEBUG))
                summary.run_dirs = [str(d) for d in recorder.run_dirs]
            if plot_hook is not None and hasattr(plot_hook, "close"):
                failed = plot_hook.close()
                if failed:
                    log.warning("%d episode plot(s) failed; rerun them with 'gmp plot'", failed)
    return summary


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


# ---------------------------------------------------------------------- processes


def _interrupt_on_sigterm(signum: int, frame: Any) -> None:
    # The parent's SIGTERM (or a scheduler's, sent to the whole process group) is this process's
    # Ctrl-C: unwind like one (recordings closed, workers released), not die mid-write. Later
    # ones are ignored so the unwinding can finish; the parent's SIGKILL, 5 s on, is the backstop.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _child_logging() -> None:
    """A spawned child has no logging set up: its warnings would reach stderr through logging's
    last-resort handler as sent (a server's text with escape sequences in it). Format them as
    ``gmp``'s own handler does instead: made safe (SafeFormatter), ``gmp: warning: ...``."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)

    def lower(record: logging.LogRecord) -> bool:
        record.level = record.levelname.lower()
        return True

    handler.addFilter(lower)
    handler.setFormatter(SafeFormatter("gmp: %(level)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


def _child_main(cfg: EvalConfig, wids: list[str], events: Any, stop: Any, index: int) -> None:
    """Entry point of a worker process (spawn): run, stream events, report the outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sets ``stop``
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    _child_logging()

    def emit(kind: str, payload: dict[str, Any]) -> None:
        events.put((index, kind, payload))

    try:
        summary = run_workers(cfg, wids, emit=emit, stop=stop)
    except GenmanipError as exc:
        events.put((index, "error", {"message": str(exc), "hint": exc.hint, "exit_code": int(exc.exit_code)}))
        return
    except KeyboardInterrupt:
        return  # stopped by the parent, which is no longer listening
    except BaseException as exc:
        events.put(
            (
                index,
                "error",
                {
                    "message": f"{type(exc).__name__}: {exc}",
                    "hint": None,
                    "exit_code": int(ExitCode.INTERNAL),
                    "traceback": traceback.format_exc(),
                },
            )
        )
        return
    events.put((index, "done", asdict(summary)))


def split_workers(worker_ids: list[str], processes: int) -> list[list[str]]:
    """Round-robin ``worker_ids`` over at most ``processes`` non-empty groups."""
    n = max(1, min(processes, len(worker_ids)))
    groups: list[list[str]] = [[] for _ in range(n)]
    for i, w in enumerate(worker_ids):
        groups[i % n].append(w)
    return groups


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def run_eval(
    cfg: EvalConfig,
    *,
    emit: Emit | None = None,
    stop: threading.Event | None = None,
    grace_s: float = 15.0,
) -> RunSummary:
    """Run ``cfg`` in this process (``processes == 1``) or over worker processes.

    Raises:
        WorkerProcessError: a worker process died or failed (the others are stopped first).
    """
    say: Emit = emit or (lambda kind, payload: None)
    groups = split_workers(cfg.worker_ids, cfg.processes)
    if len(groups) == 1:
        return run_workers(cfg, groups[0], emit=say, stop=stop)

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    child_stop = ctx.Event()
    procs = []
    results: dict[int, dict[str, Any]] = {}
    failures: list[str] = []
    hints: list[str] = []
    fail_code = ExitCode.FAILURE
    reported: set[int] = set()
    dead_since: dict[int, float] = {}
    n_episodes = 0
    interrupted = False
    t0 = time.perf_counter()
    try:
        # Started inside the try: a Ctrl-C while children start must still stop the ones already
        # running (they ignore SIGINT), or they go on stepping the server with no parent
        # (found by tests/reliability/test_slow_server.py).
        for i, g in enumerate(groups):
            p = ctx.Process(target=_child_main, args=(cfg, g, events, child_stop, i), name=f"gmp-eval-{i}", daemon=False)
            p.start()
            procs.append(p)
        while len(reported) < len(procs):
            if stop is not None and stop.is_set():
                child_stop.set()
            try:
                index, kind, payload = events.get(timeout=0.2)
            except queue.Empty:
                for i, p in enumerate(procs):
                    if i in reported or p.is_alive():
                        continue
                    # Dead without a final report: its last events had a moment to arrive.
                    if time.monotonic() - dead_since.setdefault(i, time.monotonic()) > 1.0:
                        failures.append(
                            f"worker process {i} (workers {','.join(groups[i])}) "
                            f"{_exit_reason(p.exitcode)} before finishing"
                        )
                        reported.add(i)
                        child_stop.set()
                continue
            if kind == "done":
                results[index] = payload
                reported.add(index)
            elif kind == "error":
                failures.append(
                    f"worker process {index} (workers {','.join(groups[index])}) failed: {payload['message']}"
                )
                if payload.get("hint") and payload["hint"] not in hints:
                    hints.append(payload["hint"])
                if payload.get("traceback"):
                    log.error("%s", payload["traceback"])
                fail_code = ExitCode(payload.get("exit_code", int(ExitCode.FAILURE)))
                reported.add(index)
                child_stop.set()
            else:
                if kind == "episode":
                    n_episodes += 1
                    if cfg.max_episodes is not None and n_episodes >= cfg.max_episodes:
                        child_stop.set()
                say(kind, payload)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        child_stop.set()
        # Ctrl-C must exit promptly: a child blocked in a long wait (a stalled reset, a slow step)
        # only sees child_stop after it, so it gets a short grace, then SIGTERM, which it turns
        # into its own Ctrl-C (found by tests/reliability/test_slow_server.py: 15 s, then 2 s).
        deadline = time.monotonic() + (min(grace_s, 0.25) if interrupted else grace_s)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        events.close()
        events.join_thread()
    summary = RunSummary(codec=None)
    for i in sorted(results):
        r = results[i]
        summary.episodes.extend(r["episodes"])
        summary.steps += r["steps"]
        summary.lock_lost += r["lock_lost"]
        summary.recoveries += r.get("recoveries", 0)
        summary.restarts += r.get("restarts", 0)
        summary.codec = summary.codec or r["codec"]
        for d in r["run_dirs"]:
            if d not in summary.run_dirs:
                summary.run_dirs.append(d)
    summary.complete = len(results) == len(procs) and all(r["complete"] for r in results.values())
    summary.elapsed_s = time.perf_counter() - t0
    if failures:
        err = WorkerProcessError("; ".join(failures), hint="; ".join(hints) or None)
        err.summary = summary  # type: ignore[attr-defined]
        if fail_code != ExitCode.FAILURE:
            err.exit_code = fail_code  # type: ignore[misc]
        raise err
    return summary
