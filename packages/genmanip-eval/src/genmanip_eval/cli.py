"""Handlers of ``gmp eval``, ``gmp submit`` and ``gmp status`` (the parser is in the meta package).

Data goes to stdout (the per-task table, ``--json``, the run id of ``submit``); talk, progress and
the results path go to stderr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_protocol.robots import resolve_robot
from genmanip_protocol.schema import ServerStatus, parse_status
from genmanip_results.stats import wilson_interval
from genmanip_runtime.console import Console, table
from genmanip_runtime.redact import scrub_secrets
from genmanip_runtime.text import safe_text
from genmanip_runtime.transport import build_base_url

from .client import EvalClient
from .errors import GenmanipEvalError
from .policy import parse_policy_args
from .runner import EvalConfig, RunSummary
from .runner import run_eval as _run_eval

__all__ = ["eval_config", "eval_exit_code", "evaluate", "per_task_rows", "run_eval", "status", "submit"]


class JobRefused(GenmanipEvalError):
    """``gmp submit`` would disturb a job: exit 1 like the reference client."""

    exit_code = ExitCode.FAILURE


def _url(url: str | None, host: str | None, port: int | None) -> str:
    return build_base_url(url, host or "127.0.0.1", port or 8087)


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
    lat = state["lat"]
    if lat["n"]:
        parts = [f"net {lat['network'] / lat['n']:.1f}"]
        if lat["server_n"]:
            parts.append(f"srv {lat['server'] / lat['server_n']:.1f}")
        if lat["policy_n"]:
            parts.append(f"pol {lat['policy'] / lat['policy_n']:.1f}")
        fields["ms"] = "/".join(parts)
    return fields


def eval_config(
    console: Console,
    *,
    url: str,
    token: str | None,
    ca_cert: str | None,
    run_id: str | None,
    worker_ids: str,
    processes: int,
    max_episodes: int | None,
    max_recoveries: int,
    policy: str,
    policy_arg: Sequence[str] | None,
    chunk_size: int | None,
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
) -> EvalConfig:
    """The :class:`EvalConfig` of ``gmp eval``'s flags, for a server at ``url`` (already built).

    The one reading of those flags, shared by ``gmp eval`` and ``gmp online run``: the legacy
    ``--arm-type``/``--gripper-type`` robot selection, ``--control-type`` (warned about on
    ``console`` unless the policy is ``zero``), an empty ``--worker-ids`` (an error).
    """
    if robot is None and arm_type:
        robot = resolve_robot(arm_type, gripper_type).robot_id
    policy_args = parse_policy_args(policy_arg)
    if control_type:
        if (policy or "zero") == "zero":
            policy_args.setdefault("control_type", control_type)
        else:
            console.warn("--control-type only applies to --policy zero: your policy chooses each action's control_type")
    cfg = EvalConfig(
        url=url,
        token=token,
        run_id=run_id or None,
        worker_ids=_worker_ids(worker_ids),
        processes=max(1, int(processes or 1)),
        policy=policy or "zero",
        policy_args=policy_args,
        chunk_size=chunk_size if chunk_size and chunk_size > 1 else None,
        step_chunk=step_chunk,
        render_mode=render_mode,
        subframes=subframes,
        codec=codec or "auto",
        frames=frames or "auto",
        robot=robot,
        record=record,
        results_dir=results_dir,
        live_every=int(live_every or 0),
        max_episodes=max_episodes,
        max_recoveries=max(0, int(max_recoveries)),
        plot_on_episode_end=plot_on_episode_end,
        ca_file=ca_cert,
    )
    if not cfg.worker_ids:
        raise GenmanipEvalError("--worker-ids: no worker id given")
    return cfg


def eval_exit_code(cfg: EvalConfig, summary: RunSummary) -> int:
    """OK when the server's job is complete (or ``--max-episodes`` bounded the run), else FAILURE."""
    return 0 if summary.complete or cfg.max_episodes is not None else int(ExitCode.FAILURE)


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
    policy: str,
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
    console: Console,
) -> int:
    """``gmp eval``: evaluate a policy, record the episodes, print per-task results."""
    cfg = eval_config(
        console,
        url=_url(url, host, port),
        token=token,
        ca_cert=ca_cert,
        run_id=run_id,
        worker_ids=worker_ids,
        processes=processes,
        max_episodes=max_episodes,
        max_recoveries=max_recoveries,
        policy=policy,
        policy_arg=policy_arg,
        chunk_size=chunk_size,
        step_chunk=step_chunk,
        robot=robot,
        arm_type=arm_type,
        gripper_type=gripper_type,
        control_type=control_type,
        codec=codec,
        frames=frames,
        render_mode=render_mode,
        subframes=subframes,
        results_dir=results_dir,
        record=record,
        live_every=live_every,
        plot_on_episode_end=plot_on_episode_end,
    )
    summary = evaluate(cfg, console)
    return eval_exit_code(cfg, summary)


def evaluate(cfg: EvalConfig, console: Console, *, label: str = "eval") -> RunSummary:
    """Run ``cfg`` with a live progress line; print the per-task table and the results path.

    Shared by ``gmp eval``, ``gmp demo`` and ``gmp online run``.
    """
    total: int | None = None
    try:
        with EvalClient(cfg.url, cfg.worker_ids, cfg.run_id, cfg.token, kill_on_close=False,
                        ca_file=cfg.ca_file) as probe:
            total = probe.status(retry=False).get("total_episodes") or None
            if cfg.max_episodes is not None:
                total = min(total, cfg.max_episodes) if total else cfg.max_episodes
    except GenmanipError as exc:
        console.debug(f"GET /status failed ({exc}); no episode total")
    state: dict[str, Any] = {
        "episodes": 0,
        "successes": 0,
        "steps": 0,
        "t0": time.perf_counter(),
        "lat": {"n": 0, "network": 0.0, "server": 0.0, "server_n": 0, "policy": 0.0, "policy_n": 0},
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
                progress.set(**_live_fields(state))
            elif kind == "episode":
                state["episodes"] += 1
                state["successes"] += 1 if payload["success"] else 0
                progress.update(1, **_live_fields(state))
                if not progress.live:
                    mark = "success" if payload["success"] else "failure"
                    console.info(
                        f"episode {state['episodes']}{'/' + str(total) if total else ''}: "
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
            elif kind == "run_dir":
                if payload["path"] not in state["run_dirs"]:
                    state["run_dirs"].append(payload["path"])

        summary = _run_eval(cfg, emit=emit)
    elapsed = summary.elapsed_s or 1e-9
    console.info(
        f"{label}: {len(summary.episodes)} episodes, {summary.steps} steps in {elapsed:.1f} s "
        f"({summary.steps / elapsed:.1f} steps/s)"
        + (f", {summary.lock_lost} lock losses" if summary.lock_lost else "")
        + (
            f", {summary.recoveries} failed requests recovered from ({summary.restarts} episodes restarted)"
            if summary.recoveries
            else ""
        )
    )
    if summary.episodes:
        rows = per_task_rows(summary.episodes)
        print(table(rows, ["task", "n", "SR", "SR 95% CI", "mean score"]), end="", flush=True)
    for d in summary.run_dirs or state["run_dirs"]:
        console.info(f"results: {d}")
    if not summary.complete and cfg.max_episodes is None:
        console.warn("the server's job is not complete (stopped early)")
    return summary


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
            data = client.status(refresh=True)
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
