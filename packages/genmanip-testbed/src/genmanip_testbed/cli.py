"""Command-line handler of ``gmp testbed serve`` (the parser lives in the ``genmanip`` meta package)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from genmanip_protocol.errors import ExitCode
from genmanip_results.layout import EVAL_RESULTS_DIR, SAVED_DIR
from genmanip_runtime.config import resolve_token
from genmanip_runtime.console import Console
from genmanip_runtime.netpolicy import is_loopback_host
from genmanip_runtime.text import SafeFormatter

from .errors import ServerStartError
from .faults import FaultSpec, parse_fault_spec
from .server import LocalServer, ServerOptions, _bind, _uvicorn_server
from .tasks import DEFAULT_CONFIG

__all__ = ["serve"]


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


def serve(
    *,
    host: str,
    port: int,
    token: str | None,
    wire: str,
    robot: str,
    tasks: list[str] | None,
    results_root: str,
    save_process: bool,
    fault: list[str],
    no_job: bool,
    run_id: str | None,
    num_steps: int | None,
    capacity: int,
    reset_delay: float,
    is_relative_action: bool,
    seed: int,
    without_render: bool,
    online_token: str | None,
    leaderboard_token: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    console: Console,
) -> int:
    """Run the testbed in the foreground until Ctrl-C; one access-log line per request on stderr."""
    _tune_malloc()
    server_token = resolve_token(token, "GMP_TESTBED_TOKEN", "testbed")
    faults = parse_fault_spec(",".join(fault)) if fault else FaultSpec()
    opts = ServerOptions(
        robot=robot,
        wire=wire,
        tasks=tuple(tasks or (DEFAULT_CONFIG,)),
        token=server_token,
        online_token=online_token,
        leaderboard_token=leaderboard_token,
        results_root=Path(results_root),
        save_process=save_process,
        run_id=run_id,
        job=not no_job,
        num_steps=num_steps,
        capacity=capacity,
        reset_delay=reset_delay,
        is_rel_default=is_relative_action,
        seed=int(seed or 0),
        render=not without_render,
    )
    if not is_loopback_host(host) and server_token is None:
        console.warn(
            f"serving on {host} without --token: anyone who can reach it can drive the robot"
        )
    opts.results_root.mkdir(parents=True, exist_ok=True)
    server = LocalServer(opts, faults=faults)
    sock = _bind(host, port)
    if not console.quiet:
        handler = logging.StreamHandler(sys.stderr)
        # A request line is the client's text (a path with ESC ]52; or a newline forging the
        # next line): the log line goes through the one safe formatter, like every gmp output.
        handler.setFormatter(SafeFormatter("%(asctime)s %(message)s", "%H:%M:%S"))
        access = logging.getLogger("genmanip_testbed.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False
    import uvicorn

    if bool(ssl_certfile) != bool(ssl_keyfile):
        raise ServerStartError("--ssl-certfile and --ssl-keyfile go together")
    config = uvicorn.Config(
        server.app,
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        timeout_graceful_shutdown=5,
    )
    bound_host, bound_port = sock.getsockname()[:2]
    scheme = "https" if ssl_certfile else "http"
    job = (
        f"job {server.core.benchmark_id}/{server.core.run_id} ({', '.join(opts.tasks)})"
        if opts.job
        else "no job (waiting for /start_new_job)"
    )
    console.info(
        f"testbed serving {scheme}://{bound_host}:{bound_port}  robot {server.core.robot.robot_id}, wire {opts.wire}, "
        f"{job}, auth {'on' if server_token else 'off'}, results under {opts.results_root.resolve() / SAVED_DIR / EVAL_RESULTS_DIR}"
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
