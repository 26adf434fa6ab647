"""Handlers of ``gmp leaderboard list|bundle|submit|status`` (the parser lives in the meta package).

Data on stdout (a table or JSON, a bundle path, the submission JSON), talk on stderr. The author
token comes from ``--token``, ``$USER_TOKEN`` or ``[leaderboard] token`` in the config file and is
never printed; host and port from the flags, ``$LEADERBOARD_HOST``/``$LEADERBOARD_PORT`` or the
config file's ``[leaderboard]`` section.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from genmanip_protocol.errors import ExitCode, ValidationError, Violation
from genmanip_results.discovery import policy_label
from genmanip_runtime.config import resolve_setting, resolve_token
from genmanip_runtime.console import Console, Progress, table
from genmanip_runtime.redact import scrub_secrets
from genmanip_runtime.text import safe_text

from .bundle import Bundle, build_bundle
from .client import DEFAULT_HOST, DEFAULT_PORT, LeaderboardClient
from .errors import MissingTokenError
from .runs import default_roots, discover_runs, resolve_run, run_summary, select_run
from .submit import submit_run

__all__ = [
    "TOKEN_ENV",
    "bundle",
    "client_from_flags",
    "list_runs",
    "status",
    "submit",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "USER_TOKEN"  # noqa: S105 - the variable name, not a token
SECTION = "leaderboard"



def _print_json(obj: Any) -> None:
    # The service's replies are in it: json.dumps escapes every control character (ASCII output),
    # and a token the service echoed back is scrubbed.
    sys.stdout.write(scrub_secrets(json.dumps(obj, indent=2, sort_keys=True, default=str)) + "\n")
    sys.stdout.flush()


def _fmt_time(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def _fmt_size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def client_from_flags(
    *,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    insecure_http: bool,
    need_token: bool,
) -> LeaderboardClient:
    """The client from ``--host/--port/--token/--ca-cert/--insecure-http`` (+ env and config)."""
    flag_token = token
    host = resolve_setting(host, "LEADERBOARD_HOST", SECTION, "host", DEFAULT_HOST)
    port_raw = resolve_setting(port, "LEADERBOARD_PORT", SECTION, "port", DEFAULT_PORT)
    try:
        port = int(port_raw)
    except (TypeError, ValueError):
        raise ValidationError(
            Violation("--port / LEADERBOARD_PORT", "a port number", repr(port_raw))
        ) from None
    if flag_token:
        log.warning("--token puts the token in process lists and shell history; prefer $%s "
                    "or the config file", TOKEN_ENV)
    token = resolve_token(flag_token, TOKEN_ENV, SECTION)
    if need_token and not token:
        raise MissingTokenError(
            "the leaderboard needs an author token",
            hint=f"set ${TOKEN_ENV}, add `token = \"...\"` under [leaderboard] in the config file, or pass --token",
        )
    ca = resolve_setting(ca_cert, "GMP_LEADERBOARD_CA", SECTION, "ca_cert", None)
    return LeaderboardClient(
        str(host),
        port,
        token,
        ca_file=ca,
        insecure_http=insecure_http,
    )


def list_runs(*, root: str | None, as_json: bool, console: Console) -> int:
    """``gmp leaderboard list``: every local run, newest first, as a table or ``--json``."""
    roots = default_roots(root)
    runs = discover_runs(roots)
    rows = [run_summary(r) for r in runs]
    if as_json:
        _print_json(rows)
        return int(ExitCode.OK)
    if not rows:
        console.info("no runs found under " + ", ".join(str(r) for r in roots))
        return int(ExitCode.OK)
    table_rows = []
    for r in rows:
        total = r["episodes_total"]
        episodes = f"{r['episodes_done']}/{total if total is not None else '?'}"
        sr = r["success_rate"]
        sub = "yes" if r["submitted"] else "no"
        if r["submission_id"]:
            sub = f"yes ({r['submission_id']})"
        table_rows.append(
            [
                r["benchmark"],
                r["run_id"] + (" (live)" if r["live"] else ""),
                r["layout"],
                safe_text(policy_label(r["policy"]), limit=60),
                episodes,
                "-" if sr is None else f"{sr:.3f}",
                sub,
                _fmt_time(r["updated"]),
            ]
        )
    sys.stdout.write(
        table(table_rows, ["BENCHMARK", "RUN ID", "LAYOUT", "POLICY", "EPISODES", "SR", "SUBMITTED", "UPDATED"])
    )
    return int(ExitCode.OK)


def _describe_bundle(console: Console, b: Bundle) -> None:
    counts = b.manifest.get("counts", {})
    if counts.get("episodes_expected") is None:
        console.warn(
            "the run does not record how many episodes it should have; completeness was judged "
            "from the episodes found on disk"
        )
    console.info(
        f"bundle {b.path}: {counts.get('files')} files, {_fmt_size(b.size)}, "
        f"{counts.get('episodes_complete')} complete episode(s); sha256 {b.sha256}"
    )
    if b.skipped:
        reasons: dict[str, int] = {}
        for s in b.skipped:
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        console.info("left out: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))
        for s in b.skipped:
            if "symlink" in s.reason:
                console.warn(f"{s.name}: {s.reason}")
            else:
                console.debug(f"left out {s.name}: {s.reason}")


def bundle(
    *,
    run: str,
    root: str | None,
    benchmark_id: str | None,
    out: str | None,
    include_videos: bool,
    allow_incomplete: bool,
    console: Console,
) -> int:
    """``gmp leaderboard bundle RUN``: write a verified bundle; print its path on stdout."""
    found = resolve_run(run, root, benchmark_id)
    b = build_bundle(
        found,
        out,
        include_videos=include_videos,
        allow_incomplete=allow_incomplete,
    )
    if not b.manifest.get("complete"):
        console.warn(f"run {found.run_id} is incomplete: {len(b.manifest.get('missing', []))} episode(s) missing")
    _describe_bundle(console, b)
    sys.stdout.write(str(b.path) + "\n")
    return int(ExitCode.OK)


def _upload_progress(console: Console) -> Callable[[Bundle], Callable[[int], None] | None]:
    state: dict[str, Any] = {}

    def factory(b: Bundle) -> Callable[[int], None] | None:
        _describe_bundle(console, b)
        total_kib = max(1, math.ceil(b.size / 1024))
        bar = Progress(total_kib, "uploading", console, unit="KiB")
        bar.__enter__()
        state["bar"] = bar
        state["sent"] = 0

        def cb(sent_bytes: int) -> None:
            kib = min(total_kib, sent_bytes // 1024)
            if kib > state["sent"]:
                bar.update(kib - state["sent"])
                state["sent"] = kib

        return cb

    factory.state = state  # type: ignore[attr-defined]
    return factory


def submit(
    *,
    run_id: str,
    submission_name: str,
    leaderboard_name: str,
    benchmark_id: str | None,
    root: str | None,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    insecure_http: bool,
    include_videos: bool,
    force: bool,
    console: Console,
) -> int:
    """``gmp leaderboard submit``: bundle, verify and upload a run; mark it submitted on success."""
    roots = default_roots(root)
    run = select_run(discover_runs(roots), run_id, benchmark_id)
    with client_from_flags(
        host=host, port=port, token=token, ca_cert=ca_cert, insecure_http=insecure_http,
        need_token=True,
    ) as client:
        console.info(f"submitting {run.benchmark}/{run.run_id} ({run.path}) to {client.base_url}")
        factory = _upload_progress(console)
        try:
            outcome = submit_run(
                run,
                client,
                submission_name=submission_name,
                leaderboard_name=leaderboard_name,
                include_videos=include_videos,
                force=force,
                progress=factory,
            )
        finally:
            bar = factory.state.get("bar")  # type: ignore[attr-defined]
            if bar is not None:
                bar.close()
    out = {
        "status": outcome.status,
        "benchmark": run.benchmark,
        "run_id": run.run_id,
        "submission_id": outcome.submission_id,
        "status_url": outcome.status_url,
        "bundle_sha256": outcome.bundle_sha256,
        "content_sha256": outcome.content_sha256,
    }
    _print_json(out)
    if outcome.status == "unchanged":
        prev = outcome.previous or {}
        when = prev.get("submitted_at") or "earlier"
        console.info(
            f"run {run.run_id} was already submitted to {prev.get('leaderboard_name', leaderboard_name)!r}"
            f" ({prev.get('submission_id') or 'unknown id'}, {when}) and has not changed: nothing to do"
            " (--force submits again)"
        )
        return int(ExitCode.NOTHING_TO_DO)
    console.success(f"submitted as {outcome.submission_id}; status: {outcome.status_url}")
    return int(ExitCode.OK)


def status(
    *,
    submission_id: str,
    host: str | None,
    port: int | None,
    token: str | None,
    ca_cert: str | None,
    insecure_http: bool,
    console: Console,
) -> int:
    """``gmp leaderboard status SUBMISSION_ID``: the service's upload status as JSON on stdout."""
    with client_from_flags(
        host=host, port=port, token=token, ca_cert=ca_cert, insecure_http=insecure_http,
        need_token=False,
    ) as client:
        result = client.status(submission_id)
    _print_json(result)
    return int(ExitCode.OK)
