"""Command-line handler of ``gmp policy serve`` (the parser lives in the ``genmanip`` meta package)."""

from __future__ import annotations

import threading

from genmanip_eval.batcher import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_S
from genmanip_eval.inference import Inference
from genmanip_eval.policy import parse_policy_args
from genmanip_protocol.errors import ExitCode
from genmanip_runtime.config import resolve_token
from genmanip_runtime.console import Console
from genmanip_runtime.netpolicy import is_loopback_host

from .client import API_KEY_ENV
from .errors import ServeConfigError
from .server import DEFAULT_MAX_MESSAGE_BYTES, PolicyServer, ServeOptions

__all__ = ["serve"]

_MIB = 1024 * 1024


def _status(server: PolicyServer) -> str:
    s = server.stats()
    b = s["batcher"]
    fields = [f"{s['connections']} conn", f"{b['items']} req", f"{b['batches']} batches"]
    if b["mean_batch"] is not None:
        fields.append(f"mean batch {b['mean_batch']:.2f}")
        fields.append(f"infer {b['mean_call_ms']:.1f} ms")
        fields.append(f"queue {b['mean_queue_ms']:.1f} ms")
    errors = sum(s["errors"].values())
    if errors:
        fields.append(f"{errors} errors")
    return "  ".join(fields)


def serve(
    *,
    policy: str,
    policy_arg: list[str],
    host: str,
    port: int,
    max_batch: int | None,
    max_wait_ms: float | None,
    api_key: str | None,
    max_message_mb: float | None,
    console: Console,
) -> int:
    """Load ``--policy`` once and serve it until Ctrl-C (exit 130, via gmp's main).

    One line on stderr says where it serves; on a terminal a live status line follows
    (connections, requests, batches, mean batch size, policy and queue time); piped, nothing more.
    """
    max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    wait_s = DEFAULT_MAX_WAIT_S if max_wait_ms is None else max_wait_ms / 1000.0
    if max_batch < 1:
        raise ServeConfigError(f"--max-batch {max_batch}: must be at least 1")
    if wait_s < 0:
        raise ServeConfigError(f"--max-wait-ms {max_wait_ms}: must be >= 0")
    size = DEFAULT_MAX_MESSAGE_BYTES if max_message_mb is None else int(max_message_mb * _MIB)
    if size < _MIB:
        raise ServeConfigError(f"--max-message-mb {max_message_mb}: must be at least 1")
    key = resolve_token(api_key, API_KEY_ENV, "policy")
    options = ServeOptions(host=host, port=port, max_batch=max_batch, max_wait_s=wait_s,
                           api_key=key, max_message_bytes=size)
    inference = Inference.create(policy, parse_policy_args(policy_arg))
    try:
        server = PolicyServer(inference, options, policy=policy)
        if not is_loopback_host(host) and key is None:
            console.warn(f"serving on {host} without --api-key: anyone who can reach it can use the policy")
        kind = "batched" if inference.batched else "per worker"
        calls = "+".join(n for n, ok in (("actions", inference.has_action), ("chunks", inference.has_chunk)) if ok)
        console.info(
            f"policy server {server.url}  policy {policy} ({kind}, {calls}), max batch {max_batch}, "
            f"max wait {wait_s * 1000:g} ms, auth {'on' if key else 'off'}, max message "
            f"{size / _MIB:g} MiB  (GET /healthz, /stats)"
        )
        done = threading.Event()
        line = console.status_line("serving")
        live = console.is_tty and not console.quiet

        def tick() -> None:
            while not done.wait(1.0):
                line.update(_status(server))

        ticker = threading.Thread(target=tick, name="gmp-policy-status", daemon=True)
        if live:
            line.start()
            ticker.start()
        try:
            server.serve_forever()
        finally:
            done.set()
            if live:
                line.close()
            server.close()
    finally:
        inference.close()
    return int(ExitCode.OK)
