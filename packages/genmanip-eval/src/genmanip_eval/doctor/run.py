"""The doctor's run: connect, measure the link, probe one worker, check the policy, advise.

:func:`run_doctor` is the library entry point (the ``gmp doctor`` handler calls it); it returns a
:class:`~genmanip_eval.doctor.findings.Report` and never prints data (progress goes to the
console given).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genmanip_protocol.errors import GenmanipError
from genmanip_protocol.robots import RobotSpec, get_robot
from genmanip_runtime.console import Console

from ..client import EvalClient
from ..errors import GenmanipEvalError, PolicyError
from ..inference import BatchItem, Inference
from .advice import Inputs, advise
from .contract import ContractChecker
from .findings import Finding, Report
from .measure import median, round_trips, synthetic_observation, time_policy, wire_modes

__all__ = ["DoctorConfig", "run_doctor"]


@dataclass
class DoctorConfig:
    """What ``gmp doctor`` checks.

    Attributes:
        url: server base URL.
        token, ca_file, run_id: as for ``gmp eval``.
        worker_ids: the workers a run would use (W = their number); the probe uses the first.
        policy: ``--policy`` spec (None: link and server only).
        policy_args: ``--policy-arg`` strings.
        chunk_size: ``--chunk-size`` the run would use (1: none).
        no_steps: link-only: no ``/reset`` and no ``/step`` (the contract is not checked).
        probe_steps: steps of the probe episode.
        episode_steps: E, the steps per episode assumed for episodes per hour.
        robot: robot id when the server does not say (``--no-steps`` on the real server).
    """

    url: str
    token: str | None = None
    ca_file: str | None = None
    run_id: str | None = None
    worker_ids: Sequence[str] = ("0",)
    policy: str | None = None
    policy_args: Mapping[str, str] = field(default_factory=dict)
    chunk_size: int = 1
    no_steps: bool = False
    probe_steps: int = 12
    episode_steps: int = 300
    robot: str | None = None


def _link(fid: str, severity: str, title: str, evidence: str = "", fix: str = "", **data: Any) -> Finding:
    return Finding(fid, "link", severity, title, evidence, fix, dict(data))


def run_doctor(cfg: DoctorConfig, console: Console | None = None) -> Report:
    """Run every check of ``cfg``; see docs/doctor.md.

    Raises:
        PolicyError: the policy does not load (exit 2/3 like ``gmp eval``).
        GenmanipError: the server is unreachable or answers with errors (its exit code).
    """
    con = console or Console(quiet=True)
    rep = Report()
    wids = [str(w) for w in cfg.worker_ids] or ["0"]
    probe_wid = wids[0]
    inference: Inference | None = None
    if cfg.policy:
        inference = Inference.create(cfg.policy, dict(cfg.policy_args))
    client = EvalClient(cfg.url, [probe_wid], cfg.run_id, cfg.token, ca_file=cfg.ca_file,
                        max_recoveries=0, kill_on_close=True)
    try:
        return _run(cfg, con, rep, client, inference=inference, wids=wids, probe_wid=probe_wid)
    finally:
        client.close()
        if inference is not None:
            inference.close()


def _run(
    cfg: DoctorConfig,
    con: Console,
    rep: Report,
    client: EvalClient,
    *,
    inference: Inference | None,
    wids: list[str],
    probe_wid: str,
) -> Report:
    con.info(f"doctor: connecting to {client.base_url}")
    client.connect()
    info = client.server_info or {}
    codecs = [c for c in info.get("codecs", []) if c in ("msgpack", "legacy")] or ["legacy"]
    frames = [f for f in info.get("frames", []) if f in ("raw", "jpeg")] or ["jpeg"]
    rep.server = {
        "url": client.base_url,
        "codec": client.codec_name,
        "frames": client.frames,
        "protocol": info or None,
        "codecs_offered": codecs,
        "frames_offered": frames,
        "robot_id": info.get("robot_id"),
    }
    rtts = round_trips(client)
    rtt = median(rtts) or 0.0
    rep.measurements["rtt_ms"] = {"median": round(rtt, 3), "min": round(min(rtts), 3),
                                  "max": round(max(rtts), 3), "n": len(rtts), "route": "GET /status"}
    rep.add(_link("link.rtt", "info", f"round trip {rtt:.1f} ms",
                  f"{len(rtts)} x GET /status: median {rtt:.2f} ms, min {min(rtts):.2f}, max {max(rtts):.2f}"))

    robot_id = cfg.robot or info.get("robot_id")
    observations: list[Any] = []
    sent_actions: list[dict[str, Any]] = []
    step_total: list[float] = []
    step_server: list[float] = []
    reset_ms: float | None = None
    reset_server: float | None = None
    checker: ContractChecker | None = None
    use_chunks = False
    horizon: int | None = None
    rep.probe = {"worker_id": probe_wid, "steps": 0, "resets": 0, "no_steps": cfg.no_steps,
                 "episode_ended": False}
    policy_ms_1: list[float] = []

    if cfg.no_steps:
        rep.add(_link("probe.no_steps", "info", "link-only check: no /reset, no /step",
                      "--no-steps: server time per step and reset and the policy's contract are not "
                      "measured; bytes and policy latency use a synthetic observation"))
        if robot_id:
            observations.append(synthetic_observation(get_robot(robot_id)))
    else:
        con.info(f"doctor: probing worker {probe_wid} (this spends {cfg.probe_steps} real steps of one "
                 "episode; the worker is released with /kill afterwards, so the server re-queues the seed)")
        t0 = time.perf_counter()
        entries = client.reset()
        reset_ms = (time.perf_counter() - t0) * 1000.0
        reset_server = client.timing(probe_wid).server_ms
        rep.probe["resets"] = 1
        entry = entries[probe_wid]
        obs = entry.get("obs")
        robot_spec = client.robot(probe_wid) or (get_robot(robot_id) if robot_id else None)
        if robot_spec is not None:
            robot_id = robot_spec.robot_id
        if inference is not None and robot_spec is not None:
            use_chunks = inference.has_chunk and (cfg.chunk_size > 1 or not inference.has_action)
            checker = ContractChecker(robot_spec, chunk_size=cfg.chunk_size, chunked=use_chunks)
        if obs is None:
            rep.add(_link("probe.no_episode", "warn", "the server gave the probe worker no episode",
                          "/reset returned no observation: the job is done or has no tasks",
                          "start a job (gmp submit CONFIG) or run gmp doctor --no-steps"))
        step = 0
        while obs is not None and step < cfg.probe_steps:
            observations.append(obs)
            action = _probe_action(inference, checker=checker, robot=robot_spec, wid=probe_wid,
                                   obs=obs, step=step, use_chunks=use_chunks, policy_ms=policy_ms_1)
            if use_chunks and checker is not None:
                horizon = checker.max_chunk
            if action is None:
                break
            entries, done = client.step({probe_wid: action})
            sent_actions.append(action)
            timing = client.timing(probe_wid)
            step_total.append(timing.total_ms)
            if timing.server_ms is not None:
                step_server.append(timing.server_ms)
            step += 1
            entry = entries[probe_wid]
            nxt = entry.get("obs")
            if entry.get("episode_result") is not None or (nxt is not None and nxt.get("reset")) or done:
                rep.probe["episode_ended"] = True
                res = entry.get("episode_result")
                score = res.get("score") if isinstance(res, Mapping) else getattr(res, "score", None)
                rep.add(_link(
                    "probe.episode_ended", "info", f"the probe episode ended after {step} step(s)",
                    f"the server ended the episode during the probe (score {score}): unlike a "
                    "released one, that seed now counts in the server's run",
                    "run the doctor on a scratch run id (--run-id doctor-check) or with fewer "
                    "--probe-steps", score=score))
                break
            obs = nxt
        rep.probe["steps"] = step
        con.info(f"doctor: spent {step} step(s) and 1 reset on worker {probe_wid}")

    # ---- wire modes
    robot_spec_final: RobotSpec | None = get_robot(robot_id) if robot_id else None
    modes: list[dict[str, Any]] = []
    if observations and robot_spec_final is not None:
        act = sent_actions[0] if sent_actions else robot_spec_final.neutral_action("joint_position")
        modes = wire_modes(observations[0], act, worker_id=probe_wid, codecs=codecs, frames=frames)
    link_used = None
    if step_total:
        total = median(step_total) or 0.0
        server = median(step_server)
        if server is None:  # the real server sends no timing header: estimate the link part
            used = next((m for m in modes if m["codec"] == client.codec_name and m["frames"] == client.frames), None)
            codec_cost = (used["client_decode_ms"] + used["client_encode_ms"]) if used else 0.0
            link_used = min(total, rtt + codec_cost)
            server = max(0.0, total - link_used)
            server_note = "estimated: total - RTT - codec (the server sends no X-Genmanip-Server-Ms)"
        else:
            link_used = max(0.0, total - server)
            server_note = "X-Genmanip-Server-Ms"
        rep.measurements["step_ms"] = {"total": round(total, 3), "server": round(server, 3),
                                       "link": round(link_used, 3), "n": len(step_total),
                                       "server_source": server_note}
        rep.add(_link("server.step", "info", f"server {server:.1f} ms per step on one worker",
                      f"{len(step_total)} /step: request {total:.1f} ms = server {server:.1f} ms + "
                      f"link {link_used:.1f} ms ({client.codec_name}, {client.frames} frames; {server_note})"))
    if reset_ms is not None:
        rep.measurements["reset_ms"] = {"total": round(reset_ms, 3),
                                        "server": None if reset_server is None else round(reset_server, 3)}
        rep.add(_link("server.reset", "info", f"reset {reset_ms:.0f} ms",
                      f"kill + /reset + /reset_result polling until the first observation: {reset_ms:.1f} ms"))
    _wire_estimates(modes, rep, client, rtt, link_used)

    # ---- policy latency
    policy_ms: dict[int, float] = {}
    if inference is not None and observations and not (checker is not None and checker.policy_broken):
        sizes = sorted({1, len(wids)} | ({4} if len(wids) == 1 else set()))
        try:
            for b in sizes:
                ids = wids[:b] if b <= len(wids) else [f"doctor-{i}" for i in range(b)]
                policy_ms[b] = time_policy(inference, observations, ids, chunks=use_chunks)
        except GenmanipError as exc:
            if checker is None:
                checker = ContractChecker(robot_spec_final or get_robot("manip/lift2/R5a"),
                                          chunk_size=cfg.chunk_size, chunked=use_chunks)
            checker.policy_failed(0, observations[0], exc)
        if policy_ms:
            synthetic = cfg.no_steps
            rep.measurements["policy_ms"] = {
                "by_batch": {str(b): round(v, 3) for b, v in policy_ms.items()},
                "probe_calls_median": None if not policy_ms_1 else round(median(policy_ms_1) or 0.0, 3),
                "batched": inference.batched, "chunks": use_chunks, "synthetic": synthetic,
            }
            text = ", ".join(f"P({b}) = {v:.2f} ms" for b, v in policy_ms.items())
            rep.add(_link("policy.latency", "info", f"policy {text}",
                          f"{'batched' if inference.batched else 'per-worker'} policy, "
                          f"{'get_action_chunk' if use_chunks else 'get_action'}; median of 3 calls "
                          f"per batch size on {'synthetic' if synthetic else 'real'} observations"))
    # ---- advice
    if step_total or cfg.no_steps:
        s_ms = (rep.measurements.get("step_ms") or {}).get("server", 0.0)
        n1 = link_used if link_used is not None else rtt
        if cfg.no_steps and modes:
            used = next((m for m in modes if m["codec"] == client.codec_name and m["frames"] == client.frames), None)
            if used is not None and used.get("est_link_ms") is not None:
                n1 = float(used["est_link_ms"])
        inp = Inputs(
            workers=len(wids), chunk_size=max(1, cfg.chunk_size), server_ms=float(s_ms),
            link_ms=float(n1), rtt_ms=rtt, reset_ms=reset_ms, policy_ms=policy_ms,
            batched=bool(inference and inference.batched),
            served=bool(cfg.policy and "://" in cfg.policy),
            chunk_horizon=horizon if use_chunks else None,
            episode_steps=max(1, cfg.episode_steps), modes=modes,
        )
        rep.advice = advise(inp)
        if cfg.no_steps:
            rep.advice["note"] = "no server time measured (--no-steps): S = 0, a lower bound on the cost"

    # ---- contract findings
    if checker is not None:
        for f in checker.findings():
            rep.add(f)
        rep.probe["checked_calls"] = checker.checked
    elif inference is not None:
        rep.add(Finding("contract.skipped", "contract", "info", "the policy's contract was not checked",
                        "--no-steps" if cfg.no_steps else "no observation to check it on"))
    return rep


def _probe_action(
    inference: Inference | None,
    *,
    checker: ContractChecker | None,
    robot: RobotSpec | None,
    wid: str,
    obs: Any,
    step: int,
    use_chunks: bool,
    policy_ms: list[float],
) -> dict[str, Any] | None:
    """The action the probe sends for ``obs``: the policy's when it is safe, else the neutral one.

    None when nothing can be sent (no robot known).
    """
    neutral = robot.neutral_action("joint_position") if robot is not None else None
    if inference is None or checker is None or checker.policy_broken:
        return neutral
    eid = obs.get("episode_id")
    item = BatchItem(wid, None if eid is None else str(eid), obs, new_episode=bool(obs.get("reset")) or step == 0)
    t0 = time.perf_counter()
    try:
        out: list[Any] = inference.chunks([item])[0] if use_chunks else [inference.actions([item])[0]]
    except PolicyError as exc:
        checker.policy_failed(step, obs, exc)
        return neutral
    except GenmanipEvalError as exc:  # pragma: no cover - other eval errors are the policy's too
        checker.policy_failed(step, obs, exc)
        return neutral
    if step > 0:
        policy_ms.append((time.perf_counter() - t0) * 1000.0)
    safe = checker.observe(step, obs, out)
    return safe if safe is not None else neutral


def _wire_estimates(
    modes: list[dict[str, Any]], rep: Report, client: EvalClient, rtt: float, link_used: float | None
) -> None:
    """Estimate each mode's link time from the measured one (bytes over the observed bandwidth)."""
    if not modes:
        rep.add(_link("link.wire", "info", "bytes per step not measured",
                      "the robot is unknown (pass --robot with --no-steps on a server without /protocol)"))
        return
    used = next((m for m in modes if m["codec"] == client.codec_name and m["frames"] == client.frames), None)
    rate = None  # bytes per ms
    if used is not None and link_used is not None:
        transfer = link_used - rtt - used["client_decode_ms"] - used["client_encode_ms"]
        nbytes = used["reply_bytes"] + used["request_bytes"]
        if transfer > 0.05 * max(1.0, link_used):
            rate = nbytes / transfer
    for m in modes:
        wire = 0.0 if rate is None else (m["reply_bytes"] + m["request_bytes"]) / rate
        m["est_link_ms"] = round(rtt + wire + m["client_decode_ms"] + m["client_encode_ms"], 3)
    rep.measurements["wire"] = modes
    rep.measurements["bandwidth_MBps"] = None if rate is None else round(rate / 1000.0, 2)
    lines = [f"{m['codec']}/{m['frames']}: request {m['request_bytes']} B, reply {m['reply_bytes'] / 1e6:.3f} MB, "
             f"decode {m['client_decode_ms']:.2f} ms, est. link {m['est_link_ms']:.1f} ms" for m in modes]
    rep.add(_link("link.wire", "info", f"{len(modes)} wire mode(s) offered", "; ".join(lines)
                  + ("" if rate is None else f"; observed throughput {rate / 1000.0:.0f} MB/s")))
    if used is not None:
        best = min(modes, key=lambda m: m["est_link_ms"])
        if best is not used and used["est_link_ms"] > 1.5 * best["est_link_ms"] + 1.0:
            rep.add(_link(
                "link.codec_choice", "info",
                f"{best['codec']}/{best['frames']} would be faster than {used['codec']}/{used['frames']}",
                f"estimated link {best['est_link_ms']:.1f} ms vs {used['est_link_ms']:.1f} ms per step",
                f"gmp eval --codec {best['codec']}"
                + (f" --frames {best['frames']}" if best["codec"] == "msgpack" else "")))
