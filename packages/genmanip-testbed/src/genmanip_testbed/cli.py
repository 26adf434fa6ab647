"""Command-line handler of ``gmp testbed serve`` (the parser lives in the ``genmanip`` meta package)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from pathlib import Path

from genmanip_protocol.errors import ExitCode
from genmanip_runtime.config import resolve_token
from genmanip_runtime.console import Console

from .errors import ServerStartError
from .faults import FaultSpec, parse_fault_spec
from .server import LocalServer, ServerOptions, _bind, _uvicorn_server
from .tasks import DEFAULT_CONFIG

__all__ = ["serve"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tune_malloc() -> None:
    """Keep freed multi-MB frame buffers in the heap instead of returning them to the OS.

    Every step allocates fresh frames; with glibc's defaults each one is a new mmap and costs
    hundreds of page faults. Raising the mmap and trim thresholds (our own process only) makes
    those allocations reuse memory. No-op where glibc's ``mallopt`` is unavailable.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 512 * 1024 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def serve(args: argparse.Namespace) -> int:
    """Run the testbed in the foreground until Ctrl-C; one access-log line per request on stderr."""
    console = Console.from_args(args)
    _tune_malloc()
    token = resolve_token(getattr(args, "token", None), "GMP_TESTBED_TOKEN", "testbed")
    faults = (
        parse_fault_spec(",".join(getattr(args, "fault", None) or []))
        if getattr(args, "fault", None)
        else FaultSpec()
    )
    opts = ServerOptions(
        robot=args.robot,
        wire=args.wire,
        tasks=tuple(args.tasks or (DEFAULT_CONFIG,)),
        token=token,
        online_token=getattr(args, "online_token", None),
        leaderboard_token=getattr(args, "leaderboard_token", None),
        results_root=Path(args.results_root),
        save_process=bool(args.save_process),
        run_id=args.run_id,
        job=not args.no_job,
        num_steps=getattr(args, "num_steps", None),
        capacity=getattr(args, "capacity", 8),
        reset_delay=getattr(args, "reset_delay", 0.03),
        is_rel_default=bool(getattr(args, "is_relative_action", False)),
        seed=int(getattr(args, "seed", 0) or 0),
        render=not getattr(args, "without_render", False),
    )
    if not _is_loopback(args.host) and token is None:
        console.warn(
            f"serving on {args.host} without --token: anyone who can reach it can drive the robot"
        )
    opts.results_root.mkdir(parents=True, exist_ok=True)
    server = LocalServer(opts, faults=faults)
    sock = _bind(args.host, args.port)
    if not console.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        access = logging.getLogger("genmanip_testbed.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False
    import uvicorn

    certfile = getattr(args, "ssl_certfile", None)
    keyfile = getattr(args, "ssl_keyfile", None)
    if bool(certfile) != bool(keyfile):
        raise ServerStartError("--ssl-certfile and --ssl-keyfile go together")
    config = uvicorn.Config(
        server.app,
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        timeout_graceful_shutdown=5,
    )
    host, port = sock.getsockname()[:2]
    scheme = "https" if certfile else "http"
    job = (
        f"job {server.core.benchmark_id}/{server.core.run_id} ({', '.join(opts.tasks)})"
        if opts.job
        else "no job (waiting for /start_new_job)"
    )
    console.info(
        f"testbed serving {scheme}://{host}:{port}  robot {server.core.robot.robot_id}, wire {opts.wire}, "
        f"{job}, auth {'on' if token else 'off'}, results under {opts.results_root.resolve()}/saved/eval_results"
    )
    try:
        _uvicorn_server(config, server.stopping).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        sock.close()
    console.info("testbed stopped")
    return int(ExitCode.OK)
