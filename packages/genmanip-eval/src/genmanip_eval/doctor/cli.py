"""The ``gmp doctor`` handler (the parser is in the meta package: ``genmanip.cli.specs.doctor``).

Data on stdout (the report, or ``--json``), talk on stderr (what the probe spends, progress).
"""

from __future__ import annotations

import json
from typing import Any

from genmanip_runtime.console import Console, table
from genmanip_runtime.redact import scrub_secrets
from genmanip_runtime.text import safe_text
from genmanip_runtime.transport import build_base_url

from ..policy import parse_policy_args
from .findings import Report
from .run import DoctorConfig, run_doctor

__all__ = ["doctor", "render_text"]


def _worker_ids(value: str | None) -> list[str]:
    return [s.strip() for s in str(value or "0").split(",") if s.strip()] or ["0"]


def render_text(rep: Report) -> str:
    """The human-readable report (plain text, no ANSI codes; every value made safe to print)."""
    out: list[str] = []
    srv = rep.server
    out.append(f"gmp doctor: {safe_text(srv.get('url', ''))}  codec {srv.get('codec')}  frames "
               f"{srv.get('frames')}  robot {safe_text(str(srv.get('robot_id') or '?'))}")
    pr = rep.probe
    if pr.get("no_steps"):
        out.append("probe: none (--no-steps: link-only)")
    else:
        out.append(f"probe: worker {pr.get('worker_id')}, {pr.get('resets', 0)} reset, "
                   f"{pr.get('steps', 0)} real step(s), released with /kill")
    wire = rep.measurements.get("wire") or []
    if wire:
        out.append("")
        out.append("wire (one worker, one step):")
        rows = [[m["codec"], m["frames"], m["request_bytes"], m["reply_bytes"], m["client_decode_ms"],
                 m["server_encode_ms"], m["est_link_ms"]] for m in wire]
        out.append(table(rows, ["codec", "frames", "request B", "reply B", "decode ms", "encode ms",
                                "est. link ms"]).rstrip())
    adv = rep.advice
    if adv:
        out.append("")
        out.append(f"advice   {adv['formula']}")
        inputs = adv["inputs"]
        pol = ", ".join(f"P({b}) = {v:.2f}" for b, v in inputs["P_policy_ms"].items()) or "P = 0 (no policy)"
        reset = inputs["R_reset_ms"]
        out.append(f"  measured: S = {inputs['S_server_ms']:.2f} ms, N(1) = {inputs['N1_link_ms']:.2f} ms, "
                   f"RTT = {inputs['rtt_ms']:.2f} ms, {pol} ms, "
                   f"R = {'-' if reset is None else f'{reset:.0f}'} ms, E = {inputs['E_episode_steps']} steps (assumed)")
        for label in ("current", "recommended"):
            c = adv[label]
            t = c["terms_ms"]
            out.append(f"  {label:<11} W={c['workers']:<3} K={c['chunk_size']:<3} "
                       f"S {t['server']:.1f} + N {t['link']:.1f} + P/K {t['policy']:.1f} = {c['step_cost_ms']:.1f} ms"
                       f" -> {c['steps_per_s']:.1f} steps/s, {c['episodes_per_hour']:.0f} episodes/h, "
                       f"bottleneck {c['bottleneck']}")
        settings = [f"--worker-ids with {adv['workers']} id(s)", f"--chunk-size {adv['chunk_size']}"]
        if adv.get("codec") == "msgpack":
            settings.append(f"--codec msgpack --frames {adv['frames']}")
        elif adv.get("codec"):
            settings.append(f"--codec {adv['codec']}")
        settings.append(f"policy: {adv['inference']}")
        out.append("  use: " + ", ".join(settings))
        for r in adv["reasons"]:
            out.append(f"   - {r}")
        if adv.get("note"):
            out.append(f"  note: {adv['note']}")
    out.append("")
    out.append("findings:")
    for f in rep.sorted_findings():
        out.append(f"  [{f.severity}] {f.id}: {safe_text(f.title)}")
        if f.evidence:
            out.append(f"      evidence: {safe_text(f.evidence, limit=600)}")
        if f.fix:
            out.append(f"      fix: {safe_text(f.fix, limit=400)}")
    counts = {s: len(rep.ids(s)) for s in ("fail", "warn", "info")}
    out.append("")
    out.append(("healthy" if rep.healthy else "NOT healthy")
               + f": {counts['fail']} fail, {counts['warn']} warn, {counts['info']} info")
    return "\n".join(out) + "\n"


def doctor(
    *,
    url: str | None,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    run_id: str | None,
    worker_ids: str,
    policy: str | None,
    policy_arg: list[str],
    chunk_size: int,
    robot: str | None,
    no_steps: bool,
    probe_steps: int,
    episode_steps: int,
    as_json: bool,
    console: Console,
) -> int:
    """``gmp doctor``: measure the link and check the policy's contract; exit 1 if a check fails."""
    cfg = DoctorConfig(
        url=build_base_url(url, host or "127.0.0.1", port or 8087),
        token=token,
        ca_file=ca_cert,
        run_id=run_id or None,
        worker_ids=_worker_ids(worker_ids),
        policy=policy or None,
        policy_args=parse_policy_args(policy_arg),
        chunk_size=max(1, int(chunk_size or 1)),
        no_steps=no_steps,
        probe_steps=max(1, int(probe_steps)),
        episode_steps=max(1, int(episode_steps)),
        robot=robot,
    )
    rep = run_doctor(cfg, console)
    if as_json:
        # json.dumps escapes control characters; an echoed token is scrubbed.
        print(scrub_secrets(json.dumps(rep.to_json(), sort_keys=True, default=_jsonable)), flush=True)
    else:
        print(scrub_secrets(render_text(rep)), end="", flush=True)
    if not rep.healthy:
        console.warn(f"doctor: {len(rep.ids('fail'))} failed and {len(rep.ids('warn'))} suspicious check(s)")
    return rep.exit_code


def _jsonable(value: Any) -> Any:
    """Last resort for values json cannot write (numpy scalars, dataclasses): plain Python."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    if hasattr(value, "__dict__"):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)
