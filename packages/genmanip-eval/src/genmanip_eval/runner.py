"""The policy runner behind ``gmp eval``: policies per worker, chunking, recording, processes.

:func:`run_workers` drives one :class:`~genmanip_eval.client.EvalClient` (one request per step for
all of its workers) in the calling process. :func:`run_eval` spreads the worker ids over N
processes (``multiprocessing`` spawn; each loads the policy once) and gathers their events; a
process that dies is reported with its exit reason and ends the run with a failure — it never hangs.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import platform
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.text import SafeFormatter

from .batcher import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S, Batcher, Unbatched, merge_batch_stats
from .client import DEFAULT_URL, EvalClient
from .errors import PolicyError, WorkerProcessError
from .hooks import load_episode_hook
from .inference import BatchItem, Inference
from .lanes import Lane, LaneSettings, SerializedListener, wait_lanes
from .recording import Recorder, finish_segment, resolve_results_root

__all__ = [
    "LAUNCHER_GROUP",
    "RUNNERS",
    "SECRET_FLAGS",
    "EvalConfig",
    "RunSummary",
    "end_segment",
    "finish_recordings",
    "load_launcher",
    "package_versions",
    "plan_mode",
    "run_eval",
    "run_workers",
    "safe_argv",
    "with_segment_id",
]

log = logging.getLogger("genmanip_eval.runner")

Emit = Callable[[str, dict[str, Any]], None]

#: The loops of ``gmp eval --runner``: ``async`` (the default) and ``lockstep`` (the reference's).
RUNNERS = ("async", "lockstep")
#: Entry-point group of ``gmp eval --launcher`` names other than ``local`` (``ray``: genmanip-ray).
LAUNCHER_GROUP = "genmanip.launchers"


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
    #: When the H.264 videos are made: ``"deferred"`` (JPEG frame stores now, mp4 on demand or by
    #: ``gmp transcode``) or ``"inline"`` (after each episode, in the recorder). docs/eval.md.
    transcode: str = "deferred"
    results_dir: str | None = None
    live_every: int = 0
    max_episodes: int | None = None
    #: consecutive failed requests per worker recovered from before giving up (0: stop at once)
    max_recoveries: int = 5
    timeouts: dict[str, float] | None = None
    ca_file: str | None = None
    #: Plot each episode once it is recorded (the ``plot`` hook of genmanip-artifacts).
    plot_on_episode_end: bool = False
    #: The loop: ``"async"`` (lanes + batched policy calls) or ``"lockstep"`` (see :data:`RUNNERS`).
    runner: str = "async"
    #: Largest policy batch (async runner; None: the number of workers, at most 32).
    max_batch: int | None = None
    #: The longest an idle policy waits for more observations (ms; None: 200 for a batched policy,
    #: 0 for a per-worker one).
    max_wait_ms: float | None = None
    #: Where the worker groups run: ``"local"`` (this machine's processes), or a name of the
    #: ``genmanip.launchers`` entry points (``"ray"``), which reads the ``launcher_options``.
    launcher: str = "local"
    #: The launcher's own settings (for ``ray``: address, workers_per_actor, policy_replicas,
    #: gpus_per_replica, cpus_per_replica).
    launcher_options: dict[str, Any] = field(default_factory=dict)
    #: Names this invocation in ``run.json``'s ``segments`` (shared by its processes; None: made
    #: from the host, the process id and the start time).
    segment_id: str | None = None
    #: Resume a run with another policy (spec or arguments) than it was run with: refused unless set.
    allow_policy_change: bool = False
    #: A recorded run (directory or run id) to compare with, episode by episode (paired on seeds).
    compare_to: str | None = None
    #: End the run once the sequential test against ``compare_to`` has decided.
    stop_when_decided: bool = False
    #: Level of that test.
    alpha: float = 0.05
    #: The "no difference larger than delta" margin (None: the stats module's default, 0.10).
    delta: float | None = None

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
            "runner": self.runner,
            "launcher": self.launcher,
            "compare_to": self.compare_to,
            "batching_limits": {"max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms},
            "plot_on_episode_end": self.plot_on_episode_end,
            "transcode": self.transcode,
            "host": socket.gethostname(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": package_versions(),
            "argv": safe_argv(),
        }


@dataclass
class RunSummary:
    """What a run produced."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    steps: int = 0
    #: the step loop's wall time
    elapsed_s: float = 0.0
    #: wall time until the run's recordings were complete (the loop plus finishing the last
    #: episodes' recordings: frame stores, or x264 with ``transcode="inline"``); None: not recorded
    recorded_s: float | None = None
    lock_lost: int = 0
    #: failed requests recovered from, and episodes restarted because of one
    recoveries: int = 0
    restarts: int = 0
    codec: str | None = None
    complete: bool = False
    #: the async runner's batch statistics (:meth:`genmanip_eval.batcher.BatchStats.as_dict`)
    batching: dict[str, Any] | None = None
    #: the sequential comparison with ``compare_to`` (decision, evidence, episodes saved)
    comparison: dict[str, Any] | None = None


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


#: Flags of ``gmp eval`` (and ``gmp online run``) whose value is a secret: :func:`safe_argv` masks
#: or drops it wherever a command line is written down (``run.json``, the resume command).
SECRET_FLAGS = ("--token",)


def safe_argv(argv: Sequence[str] | None = None, *, drop: bool = False) -> list[str]:
    """``argv`` (default: ``sys.argv``) with the value of every :data:`SECRET_FLAGS` flag taken out.

    The one place that knows which arguments are secrets. By default a value is masked
    (``--token ***``, ``--token=***``: ``run.json`` shows that a token was given); with ``drop``
    the flag goes too (``--token X`` and ``--token=X`` leave nothing), for a command meant to be
    run again, which takes its token from ``$GMP_TOKEN`` or the config file instead.
    """
    out: list[str] = []
    skip = False
    for a in sys.argv if argv is None else argv:
        if skip:
            skip = False
            if not drop:
                out.append("***")
        elif a in SECRET_FLAGS:
            skip = True
            if not drop:
                out.append(a)
        elif a.startswith(tuple(f"{flag}=" for flag in SECRET_FLAGS)):
            if not drop:
                out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(a)
    return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _segment_id(started: str) -> str:
    """A ``run.json`` segment id, ``<host>:<pid>:<ISO start time>``: this process on this host
    (``genmanip_results.discovery`` reads the pid back to tell whether the invocation is alive)."""
    return f"{socket.gethostname()}:{os.getpid()}:{started}"


def with_segment_id(cfg: EvalConfig) -> EvalConfig:
    """``cfg`` with its invocation's ``segment_id``: ``cfg`` itself when it has one, else a copy
    with one naming this process and now.

    A launcher that runs the workers in several processes or actors calls it once, before it
    starts them: they then share one ``run.json`` segment (each would make its own otherwise),
    which the launcher ends with :func:`end_segment`.
    """
    if cfg.segment_id is not None:
        return cfg
    return dataclasses.replace(cfg, segment_id=_segment_id(_now()))


def _outcome(*, complete: bool, ok: bool, interrupted: bool) -> str:
    """A ``run.json`` segment's ``outcome`` once its invocation has ended: ``complete`` (the job
    has nothing left), ``stopped`` (ended early without an error: a stop, --max-episodes),
    ``interrupted`` (Ctrl-C, SIGTERM) or ``failed``."""
    return "complete" if complete else "stopped" if ok else "interrupted" if interrupted else "failed"


def _client_kwargs(cfg: EvalConfig, frames: str) -> dict[str, Any]:
    """The :class:`EvalClient` arguments of ``cfg`` (every client of a run is made with these)."""
    return {
        "base_url": cfg.url, "run_id": cfg.run_id, "token": cfg.token, "codec": cfg.codec,
        "frames": frames, "robot": cfg.robot, "timeouts": cfg.timeouts,
        "render_mode": cfg.render_mode, "subframes": cfg.subframes, "ca_file": cfg.ca_file,
        "max_recoveries": cfg.max_recoveries,
    }


def finish_recordings(cfg: EvalConfig) -> int:
    """Finish what stopped invocations of run ``cfg.run_id`` left of its recordings, for a run
    whose job has nothing left to evaluate (a resume with episodes left does the same as it
    starts, in :func:`run_workers`). Returns how many episodes were finished.

    Two things can be left: episodes whose result was saved but whose frames or videos were not
    finished (a Ctrl-C during an inline transcode, a kill: :meth:`Recorder.recover_run_id`), and
    results the server still holds for the client a stop cut short (the episode's last step
    ended it just before the stop; :meth:`Recorder.awaiting_workers`): one client on those
    workers, without a policy, collects them as any resuming client does (``EvalClient.reset``,
    ``adopt_on_start``), and with no seed left its workers finish at once. Only those workers:
    a real server starts a simulator for a worker it resets. Videos are made as ``cfg.transcode``
    says.
    """
    if not cfg.record or not cfg.run_id:
        return 0
    recorder = Recorder(resolve_results_root(cfg.results_dir), transcode=cfg.transcode)
    interrupted = True
    try:
        found = recorder.recover_run_id(cfg.run_id)
        awaiting = [w for w in recorder.awaiting_workers(cfg.run_id) if w in cfg.worker_ids]
        if awaiting:
            with EvalClient(worker_ids=awaiting, listener=recorder, **_client_kwargs(cfg, "jpeg")) as client:
                client.reset()
            found += len(recorder.finished)  # (the episodes finished with a collected result)
        interrupted = False
    finally:
        recorder.close(interrupted=interrupted)
    return found


def plan_mode(cfg: EvalConfig, inference: Inference) -> str:
    """How actions reach the server: ``"single"``, ``"buffered"`` (client-side chunk replay) or
    ``"step_chunk"``; a combination the policy cannot serve raises :class:`PolicyError`."""
    n = cfg.chunk_size if cfg.chunk_size and cfg.chunk_size > 0 else None
    if cfg.step_chunk:
        if not inference.has_chunk:
            raise PolicyError(
                f"--step-chunk needs a policy with get_action_chunk(obs) or get_action_chunks(batch); "
                f"{cfg.policy} has neither"
            )
        return "step_chunk"
    if inference.has_chunk and (not inference.has_action or (n is not None and n > 1)):
        return "buffered"
    if n is not None and n > 1:
        raise PolicyError(
            f"--chunk-size {n} needs a policy with get_action_chunk(obs) or get_action_chunks(batch); "
            f"{cfg.policy} has only get_action"
        )
    return "single"


def run_workers(
    cfg: EvalConfig,
    worker_ids: list[str] | None = None,
    *,
    emit: Emit | None = None,
    stop: Any = None,
    inference: Inference | None = None,
    segment_outcome: bool = True,
) -> RunSummary:
    """Evaluate ``cfg.policy`` on ``worker_ids`` (default ``cfg.worker_ids``) in this process.

    ``inference``: an already loaded policy to use instead of loading ``cfg.policy`` (a launcher
    that routes to remote replicas passes its own); it is not closed here.

    ``segment_outcome``: False when this is one process of an invocation that runs several
    (``--processes``, the eval actors of ``--launcher ray``): its ``run.json`` segment stays
    ``running``, and the invocation writes the outcome, episodes and steps once, for all of them
    (:func:`end_segment`; a process's own are only its share).

    ``cfg.runner`` picks the loop: ``"async"`` (default: one lane per worker on its own
    connection, the policy called once per batch of ready observations, see
    :mod:`genmanip_eval.lanes`) or ``"lockstep"`` (the reference client's loop: every worker's
    policy call in turn, then one ``/step`` for all).

    ``emit(kind, payload)`` receives ``"connected"``, ``"episode"`` (a finished episode),
    ``"steps"`` (after every request: executed steps and the latency split in ms),
    ``"lock_lost"``, ``"restart"`` and ``"run_dir"`` events. ``stop`` (an Event) ends the run early.
    """
    wids = list(worker_ids or cfg.worker_ids)
    say: Emit = emit or (lambda kind, payload: None)
    if cfg.runner not in RUNNERS:
        raise PolicyError(f"--runner {cfg.runner!r}: expected one of {', '.join(RUNNERS)}")
    owned = inference is None
    if inference is None:
        inference = Inference.create(cfg.policy, cfg.policy_args)
    try:
        mode = plan_mode(cfg, inference)
        session = _Session(cfg, wids, mode, say, prefers_jpeg=inference.prefers_jpeg,
                           segment_outcome=segment_outcome)
        try:
            if cfg.runner == "lockstep":
                _run_lockstep(session, inference, stop)
            else:
                _run_lanes(session, inference, stop)
            session.ok = True
        finally:
            session.finish()
        return session.summary
    finally:
        if owned:
            inference.close()


class _Session:
    """What both loops share: the recorder, the plot hook, the event handler and the summary."""

    def __init__(self, cfg: EvalConfig, wids: list[str], mode: str, say: Emit, *,
                 prefers_jpeg: bool = False, segment_outcome: bool = True) -> None:
        self.cfg = cfg
        #: False in one process of several: the invocation ends the segment (see run_workers).
        self.segment_outcome = segment_outcome
        self.wids = wids
        self.mode = mode
        self._say = say
        self._say_lock = threading.Lock()
        self.summary = RunSummary()
        self.recorder: Recorder | None = None
        self.plot_hook: Any = None
        self.stop_flag = threading.Event()
        self.ok = False
        self.codec: str | None = None
        self.frames: str | None = None
        self.batching: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        self.t_start = time.perf_counter()
        self.wire_frames = cfg.frames
        if self.wire_frames == "auto" and prefers_jpeg:
            self.wire_frames = "jpeg"  # a ws:// policy forwards JPEG frames undecoded
        if cfg.record:
            if self.wire_frames == "auto":
                self.wire_frames = "jpeg"  # stored as received: no encoding on the hot path
            manifest = cfg.manifest()
            manifest["workers"] = wids
            manifest["started"] = _now()
            manifest["mode"] = mode
            manifest["runner"] = cfg.runner
            manifest["segment"] = {
                "id": cfg.segment_id or _segment_id(manifest["started"]),
                "started": manifest["started"], "finished": None, "outcome": "running",
                "policy": {"spec": cfg.policy, "args": dict(cfg.policy_args)},
                "versions": manifest.get("versions"), "host": socket.gethostname(),
                "argv": manifest.get("argv"), "workers": list(wids),
            }
            if cfg.plot_on_episode_end:
                # Loaded by name: genmanip-eval never imports genmanip-artifacts.
                self.plot_hook = load_episode_hook("plot")
            self.recorder = Recorder(
                resolve_results_root(cfg.results_dir),
                manifest=manifest,
                live_every=cfg.live_every,
                on_episode_complete=self.plot_hook,
                transcode=cfg.transcode,
            )
            if cfg.run_id:
                # A resumed run: finish episodes a killed predecessor recorded but did not transcode.
                self.recorder.recover_run_id(cfg.run_id)
        elif cfg.plot_on_episode_end:
            raise PolicyError("--plot-on-episode-end plots recorded episodes: it cannot be used with --no-record")

    def say(self, kind: str, payload: dict[str, Any]) -> None:
        """The caller's ``emit``, one event at a time (lanes report from their own threads)."""
        with self._say_lock:
            self._say(kind, payload)

    def client_kwargs(self) -> dict[str, Any]:
        return _client_kwargs(self.cfg, self.wire_frames)

    def on_event(self, name: str, payload: dict[str, Any]) -> None:
        """The clients' ``on_event`` (from any lane's thread)."""
        cfg, summary = self.cfg, self.summary
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
            with self._lock:
                summary.episodes.append(ep)
                enough = cfg.max_episodes is not None and len(summary.episodes) >= cfg.max_episodes
            self.say("episode", ep)
            if enough:
                self.stop_flag.set()
        elif name == "lock_lost":
            with self._lock:
                summary.lock_lost += 1
            self.say("lock_lost", payload)
        elif name == "episode_restarted":
            with self._lock:
                summary.restarts += 1
            self.say("restart", payload)
        elif name in ("waiting_for_server", "server_back"):
            self.say(name, payload)

    def stopped(self, stop: Any) -> bool:
        return self.stop_flag.is_set() or (stop is not None and stop.is_set())

    def total_episodes(self, client: EvalClient) -> None:
        if self.recorder is None:
            return
        try:
            total = client.status(retry=False).get("total_episodes")
            if isinstance(total, int) and total > 0:
                self.recorder.manifest["total_episodes"] = total
        except GenmanipError as exc:
            log.debug("GET /status failed (%s): run.json without total_episodes", exc)

    def connected(self, client: EvalClient) -> None:
        self.codec, self.frames = client.codec_name, client.frames
        self.summary.codec = client.codec_name
        self.say("connected", {"codec": client.codec_name, "frames": client.frames, "workers": self.wids})

    def check(self) -> None:
        """Raise the recorder's failure; report new run directories."""
        if self.recorder is None:
            return
        self.recorder.check()
        for d in self.recorder.run_dirs:
            if str(d) not in self._reported:
                self._reported.add(str(d))
                self.say("run_dir", {"path": str(d)})

    def finish(self) -> None:
        summary, recorder = self.summary, self.recorder
        summary.elapsed_s = time.perf_counter() - self.t_start
        summary.batching = self.batching
        # (called from a finally: a Ctrl-C or SIGTERM on its way up is the exception in flight)
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        try:
            if recorder is not None:
                try:
                    try:
                        extra: dict[str, Any] = {}
                        if recorder.final_metric:
                            extra["metric"] = dict(recorder.final_metric)
                        if self.batching is not None:
                            extra["batching"] = self.batching
                        seg = recorder.manifest.get("segment")
                        if isinstance(seg, dict) and self.segment_outcome:
                            outcome = _outcome(complete=summary.complete, ok=self.ok, interrupted=interrupted)
                            extra["segment"] = {**seg, "finished": _now(), "outcome": outcome,
                                                "episodes": len(summary.episodes), "steps": summary.steps}
                        recorder.update_manifest(finished=_now(), codec=self.codec, frames=self.frames, **extra)
                    finally:
                        # Stopped: the videos still to make are left to the resume, said once.
                        recorder.close(interrupted=interrupted)
                    summary.recorded_s = time.perf_counter() - self.t_start
                    # (merged per process: the last process to finish writes its figures)
                    recorder.update_manifest(recording={
                        "transcode": self.cfg.transcode,
                        "loop_s": round(summary.elapsed_s, 3),
                        "complete_s": round(summary.recorded_s, 3),
                    })
                except GenmanipError as exc:
                    if self.ok:
                        raise
                    # the first error is what the user needs; a traceback for this one only with -vv
                    log.error("recording also failed while stopping: %s", exc,
                              exc_info=log.isEnabledFor(logging.DEBUG))
                summary.run_dirs = [str(d) for d in recorder.run_dirs]
        finally:
            if self.plot_hook is not None and hasattr(self.plot_hook, "close"):
                failed = self.plot_hook.close()
                if failed:
                    log.warning("%d episode plot(s) failed; rerun them with 'gmp plot'", failed)


def _run_lanes(session: _Session, inference: Inference, stop: Any) -> None:
    """The asynchronous loop: a lane per worker, one batcher for the policy."""
    cfg = session.cfg
    call = inference.actions if session.mode == "single" else inference.chunks
    batcher: Batcher[Any] | Unbatched[Any]
    if inference.concurrent:
        # (a policy server batches every connection's requests: batching here too would make
        # each worker wait for the others' replies and hide their timing from it)
        batcher = Unbatched(call, batch_size_of=inference.batch_size_of)
    else:
        batcher = Batcher(
            call,
            max_batch=cfg.max_batch or min(DEFAULT_MAX_BATCH, len(session.wids)),
            max_wait_s=_max_wait_s(cfg, inference),
        )
    listener = SerializedListener(session.recorder) if session.recorder is not None else None
    n = cfg.chunk_size if cfg.chunk_size and cfg.chunk_size > 0 else None
    settings = LaneSettings(client_kwargs=session.client_kwargs(), mode=session.mode, chunk=n)
    lock = threading.Lock()

    def emit(kind: str, payload: dict[str, Any]) -> None:
        if kind == "steps":
            with lock:
                session.summary.steps += int(payload["n"])
        session.say(kind, payload)

    lane_stop = threading.Event()
    lanes = [
        Lane(w, settings, batcher=batcher, listener=listener, on_event=session.on_event, emit=emit,
             stop=lambda: lane_stop.is_set() or session.stopped(stop))
        for w in session.wids
    ]
    session.total_episodes(lanes[0].client)
    announced = False

    def tick() -> None:
        nonlocal announced
        if not announced:
            for lane in lanes:
                if lane.connected.is_set():
                    session.connected(lane.client)
                    announced = True
                    break
        failed = next((lane for lane in lanes if lane.error is not None
                       and not isinstance(lane.error, KeyboardInterrupt)), None)
        if failed is not None or session.stopped(stop):
            lane_stop.set()
            # A lane waiting on the server (a reset, a poll) has nothing in flight: end it now
            # rather than after its wait; a lane mid-request finishes the request first.
            for lane in lanes:
                if lane.alive and not lane.stepping:
                    lane.interrupt()
        try:
            session.check()
        except GenmanipError:
            lane_stop.set()
            raise

    try:
        for lane in lanes:
            lane.start()
        wait_lanes(lanes, tick=tick)
    except BaseException:
        # Ctrl-C / SIGTERM (or the recorder failed): every lane stops now; a request cut short is
        # settled by its client's close(), as after a Ctrl-C of one client.
        lane_stop.set()
        for lane in lanes:
            lane.interrupt()
        deadline = time.monotonic() + 15.0
        for lane in lanes:
            lane.join(max(0.0, deadline - time.monotonic()))
        raise
    finally:
        session.batching = batcher.snapshot().as_dict()
        batcher.close()
        with lock:
            session.summary.recoveries = sum(int(lane.client.stats.get("recoveries", 0)) for lane in lanes)
    if not announced and lanes[0].connected.is_set():
        session.connected(lanes[0].client)
    errors = [lane.error for lane in lanes if lane.error is not None]
    real = [e for e in errors if not isinstance(e, KeyboardInterrupt)]
    if real:
        raise real[0]
    if errors and not session.stopped(stop):
        raise errors[0]  # a lane interrupted without a stop: the process is being stopped
    session.check()
    session.summary.complete = all(lane.client.done for lane in lanes)


def _max_wait_s(cfg: EvalConfig, inference: Inference) -> float:
    """The batcher's ``max_wait_s``: the flag, else the default for a batched policy, else 0 (a
    per-worker policy serves a batch one observation at a time: waiting would only idle it)."""
    if cfg.max_wait_ms is not None:
        return max(0.0, cfg.max_wait_ms / 1000.0)
    return DEFAULT_MAX_WAIT_S if inference.batched else 0.0


def _run_lockstep(session: _Session, inference: Inference, stop: Any) -> None:
    """The reference client's loop: each worker's policy call in turn, one ``/step`` for all."""
    cfg, wids, mode = session.cfg, session.wids, session.mode
    n = cfg.chunk_size if cfg.chunk_size and cfg.chunk_size > 0 else None
    client = EvalClient(worker_ids=wids, on_event=session.on_event, listener=session.recorder,
                        **session.client_kwargs())
    buffers: dict[str, deque[tuple[Any, int | None, int, int]]] = {w: deque() for w in wids}
    try:
        session.total_episodes(client)
        entries = client.reset()
        session.connected(client)
        while not client.done:
            if session.stopped(stop):
                break
            session.check()
            actions: dict[str, Any] = {}
            meta: dict[str, dict[str, Any]] = {}
            for wid in wids:
                obs = entries[wid]["obs"]
                if obs is None:
                    continue
                new = bool(obs.get("reset"))
                if new:
                    buffers[wid].clear()
                item = BatchItem(wid, None if obs.get("episode_id") is None else str(obs.get("episode_id")),
                                 obs, new_episode=new)
                t0 = time.perf_counter()
                if mode == "single":
                    actions[wid] = inference.actions([item])[0]
                    meta[wid] = {"policy_ms": (time.perf_counter() - t0) * 1000}
                elif mode == "step_chunk":
                    chunk = inference.chunks([item])[0]
                    actions[wid] = chunk[:n] if n else chunk
                    meta[wid] = {"policy_ms": (time.perf_counter() - t0) * 1000}
                else:
                    buf = buffers[wid]
                    if not buf:
                        chunk = inference.chunks([item])[0]
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
            session.summary.steps += executed
            timing = [client.timing(w) for w in actions]
            session.say(
                "steps",
                {
                    "n": executed,
                    "network_ms": _mean([t.network_ms if t.network_ms is not None else t.total_ms for t in timing]),
                    "server_ms": _mean([t.server_ms for t in timing]),
                    "policy_ms": _mean([t.policy_ms for t in timing]),
                },
            )
        session.summary.complete = client.done
    finally:
        session.summary.recoveries = int(client.stats.get("recoveries", 0))
        client.close()


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
        # (the parent ends the run.json segment once, for every process: this one has its share)
        summary = run_workers(cfg, wids, emit=emit, stop=stop, segment_outcome=False)
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


def _merge_summaries(reports: Sequence[dict[str, Any]], *, complete: bool) -> RunSummary:
    """One :class:`RunSummary` of the processes' (``asdict``) summaries, in process order;
    ``complete`` (every process sent one) and each one complete."""
    summary = RunSummary(codec=None)
    for r in reports:
        summary.episodes.extend(r["episodes"])
        summary.steps += r["steps"]
        summary.lock_lost += r["lock_lost"]
        summary.recoveries += r.get("recoveries", 0)
        summary.restarts += r.get("restarts", 0)
        summary.codec = summary.codec or r["codec"]
        if r.get("batching"):
            summary.batching = merge_batch_stats(summary.batching, r["batching"])
        for d in r["run_dirs"]:
            if d not in summary.run_dirs:
                summary.run_dirs.append(d)
    summary.complete = complete and all(r["complete"] for r in reports)
    return summary


def end_segment(cfg: EvalConfig, run_dirs: Sequence[str], *, ok: bool, complete: bool, interrupted: bool,
                episodes: int, steps: int) -> None:
    """End the invocation's ``run.json`` segment (``cfg.segment_id``) in every run directory its
    workers wrote: the one write of its outcome and totals when the workers ran in several
    processes or actors (each ran :func:`run_workers` with ``segment_outcome=False``). Call it
    once they have all ended: a worker's later write would set the segment back to running.

    ``ok``: the run ended without an error; ``complete``: the job has nothing left; ``interrupted``:
    Ctrl-C or SIGTERM. The outcome is ``complete`` (ok and complete), ``stopped`` (ok),
    ``interrupted`` or ``failed``. ``episodes``, ``steps``: the whole run's totals. Nothing is
    written without ``cfg.record`` or ``cfg.segment_id``.

    Raises:
        RecordingError: ``run.json`` cannot be updated, when ``ok`` (after a failure it is logged:
            the first error is what the user needs).
    """
    if not cfg.record or cfg.segment_id is None:
        return
    outcome = _outcome(complete=ok and complete, ok=ok, interrupted=interrupted)
    for d in run_dirs:
        try:
            finish_segment(d, cfg.segment_id, finished=_now(), outcome=outcome, episodes=episodes, steps=steps)
        except GenmanipError as exc:
            if ok:
                raise
            log.error("recording also failed while stopping: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))


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

    With ``cfg.compare_to``, every finished episode feeds the sequential paired test against that
    recorded run (:class:`genmanip_results.compare.BaselineMonitor`): the decision is emitted as a
    ``"decided"`` event, kept in :attr:`RunSummary.comparison` and in each ``run.json``, and with
    ``cfg.stop_when_decided`` it ends the run.

    Raises:
        WorkerProcessError: a worker process died or failed (the others are stopped first).
    """
    say: Emit = emit or (lambda kind, payload: None)
    if not cfg.compare_to:
        return _run_eval(cfg, say, stop, grace_s)
    from genmanip_results.compare import BaselineMonitor, load_outcomes, resolve_run

    baseline = resolve_run(cfg.compare_to, cfg.results_dir)
    monitor = BaselineMonitor(load_outcomes(baseline), alpha=cfg.alpha,
                              **({} if cfg.delta is None else {"delta": cfg.delta}))
    decided = threading.Event()
    lock = threading.Lock()

    def watch(kind: str, payload: dict[str, Any]) -> None:
        say(kind, payload)
        if kind != "episode":
            return
        with lock:  # (episodes arrive from every lane's thread)
            if decided.is_set() or monitor.add(payload) is None:
                return
            decided.set()
            verdict = monitor.summary()
        say("decided", {**verdict, "baseline": str(baseline.path)})

    either = _Either(stop, decided if cfg.stop_when_decided else None)
    summary = _run_eval(cfg, watch, either, grace_s)
    summary.comparison = {**monitor.summary(), "baseline": str(baseline.path),
                          "stop_when_decided": cfg.stop_when_decided}
    for d in summary.run_dirs:
        _record_comparison(Path(d), summary.comparison)
    return summary


def load_launcher(name: str) -> Callable[..., RunSummary]:
    """The ``--launcher NAME`` of the ``genmanip.launchers`` entry points (:data:`LAUNCHER_GROUP`):
    ``launch(cfg, *, emit, stop) -> RunSummary``. Not installed: a :class:`PolicyError` whose hint
    names what to install (from the ``genmanip.providers`` tables)."""
    from .plugins import entry_points_of, providers

    eps = [ep for ep in entry_points_of(LAUNCHER_GROUP) if ep.name == name]
    if not eps:
        dist = providers(LAUNCHER_GROUP).get(name)
        err = PolicyError(
            f"--launcher {name!r}: not installed (installed: local"
            + "".join(f", {ep.name}" for ep in entry_points_of(LAUNCHER_GROUP)) + ")",
            hint=f"pip install {dist}" if dist else None,
        )
        err.exit_code = ExitCode.NOT_INSTALLED  # type: ignore[misc]
        raise err
    fn = eps[0].load()
    if not callable(fn):
        raise PolicyError(f"--launcher {name!r}: {eps[0].value} is not callable")
    return fn  # type: ignore[no-any-return]


class _Either:
    """``is_set()`` of two optional events: the caller's stop, or the comparison's decision."""

    def __init__(self, a: Any, b: Any) -> None:
        self._events = [e for e in (a, b) if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self._events)


def _record_comparison(run_dir: Path, comparison: dict[str, Any]) -> None:
    from genmanip_results.layout import RUN_JSON, RUN_JSON_LOCK
    from genmanip_runtime.atomic import merge_json

    def update(cur: dict[str, Any]) -> None:
        cur["comparison"] = comparison

    merge_json(run_dir / RUN_JSON, update, run_dir / RUN_JSON_LOCK)


def _run_eval(cfg: EvalConfig, say: Emit, stop: Any, grace_s: float) -> RunSummary:
    # (one id for every process and actor of this invocation: one entry in run.json)
    cfg = with_segment_id(cfg)
    if cfg.launcher != "local":
        return load_launcher(cfg.launcher)(cfg, emit=say, stop=stop)
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
    # The whole run as the processes' events tell it (their summaries' totals, also of a process
    # that died or failed before sending its summary): what ends the run.json segment.
    n_episodes = 0
    n_steps = 0
    run_dirs: list[str] = []
    interrupted = False
    ended = False  # the loop ended without an exception (here)
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
                elif kind == "steps":
                    n_steps += int(payload["n"])
                elif kind == "run_dir" and payload["path"] not in run_dirs:
                    run_dirs.append(payload["path"])
                say(kind, payload)
        ended = True
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
        # Every process has exited. None of them ended the segment (each had only its share of
        # the run): it is ended here, once.
        summary = _merge_summaries([results[i] for i in sorted(results)], complete=len(results) == len(procs))
        ok = ended and not failures
        run_dirs += [d for d in summary.run_dirs if d not in run_dirs]
        end_segment(cfg, run_dirs, ok=ok, complete=summary.complete, interrupted=interrupted,
                    episodes=n_episodes, steps=n_steps)
    summary.elapsed_s = time.perf_counter() - t0
    if cfg.record:  # the processes have closed their recorders: their recordings are complete
        summary.recorded_s = summary.elapsed_s
    if failures:
        err = WorkerProcessError("; ".join(failures), hint="; ".join(hints) or None)
        err.summary = summary  # type: ignore[attr-defined]
        if fail_code != ExitCode.FAILURE:
            err.exit_code = fail_code  # type: ignore[misc]
        raise err
    return summary
