"""Assembling and running a testbed: :class:`LocalServer`, :func:`serve_testbed`, :class:`ServerHandle`."""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

from .app import build_asgi_app
from .core import CoreConfig, EvalCore
from .errors import OptionError, ServerStartError, UnknownConfigError
from .faults import FaultSpec, FaultState
from .hosted import HostedServices
from .stats import Stats
from .tasks import DEFAULT_CONFIG, resolve_configs

__all__ = ["LocalServer", "ServerHandle", "ServerOptions", "serve_testbed"]

log = logging.getLogger("genmanip_testbed")

_WIRES = ("legacy", "msgpack", "both")


@dataclass
class ServerOptions:
    """Everything that configures a testbed (see :func:`serve_testbed` for the meaning of each).

    Times in seconds; ``max_upload_bytes`` in bytes.
    """

    robot: str = "manip/lift2/R5a"
    wire: str = "both"
    tasks: tuple[str, ...] = (DEFAULT_CONFIG,)
    token: str | None = None
    online_token: str | None = None
    leaderboard_token: str | None = None
    results_root: Path = field(default_factory=lambda: Path("."))
    data_dir: Path | None = None
    save_process: bool = False
    run_id: str | None = None
    job: bool = True
    seed: int = 0
    num_steps: int | None = None
    capacity: int = 8
    reset_delay: float = 0.03
    is_rel_default: bool = False
    render: bool = True
    frame_cache: bool = True
    online_ready_after: int = 2
    max_upload_bytes: int = 256 * 1024 * 1024
    next_task_timeout: float = 600.0
    rescan_interval: float = 0.05

    def __post_init__(self) -> None:
        if self.wire not in _WIRES:
            raise OptionError(f"wire: expected one of {', '.join(_WIRES)}, got {self.wire!r}")
        if self.online_token is None:
            self.online_token = self.token
        if self.leaderboard_token is None:
            self.leaderboard_token = self.token
        self.results_root = Path(self.results_root)
        if self.data_dir is None:
            self.data_dir = self.results_root / "testbed_data"
        self.tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)  # type: ignore[unreachable]

    def core_config(self, **overrides: Any) -> CoreConfig:
        kw: dict[str, Any] = dict(
            robot=self.robot,
            results_root=self.results_root,
            save_process=self.save_process,
            capacity=self.capacity,
            reset_delay=self.reset_delay,
            num_steps=self.num_steps,
            is_rel_default=self.is_rel_default,
            render=self.render,
            frame_cache=self.frame_cache,
            next_task_timeout=self.next_task_timeout,
            rescan_interval=self.rescan_interval,
            world_seed=self.seed,
        )
        kw.update(overrides)
        return CoreConfig(**kw)


class LocalServer:
    """One testbed process: the eval core, the hosted-service emulations and the ASGI app."""

    def __init__(
        self, options: ServerOptions, *, faults: FaultSpec | Mapping[str, Any] | str | None = None
    ) -> None:
        self.options = options
        try:
            resolve_configs(list(options.tasks))
        except (ValueError, AssertionError) as e:
            raise UnknownConfigError(
                str(e),
                hint="known task sets: testbed/all, testbed/smoke, "
                "testbed/<reach|lift>[/<easy|hard>]",
            ) from None
        self.stats = Stats()
        #: set when the server starts shutting down: injected latencies end early (503) instead
        #: of being cancelled mid-request by uvicorn's graceful-shutdown timeout (a traceback each)
        self.stopping = threading.Event()
        # JPEG encoding of a reply's cameras runs side by side (simplejpeg releases the GIL).
        self.jpeg_pool = ThreadPoolExecutor(2, thread_name_prefix="testbed-jpeg")
        self.faults = FaultState(FaultSpec.coerce(faults))
        self.core = EvalCore(options.core_config(), stats=self.stats, faults=self.faults)
        if options.job:
            try:
                self.core.start_new_job(list(options.tasks), options.run_id)
            except ValueError as e:
                self.core.close()
                raise OptionError(f"run_id {options.run_id!r}: {e}") from None
        self.hosted = HostedServices(self)
        self.app: ASGIApp = build_asgi_app(self, self.hosted.routes(), self.hosted.online_routes())

    def online_core(self, task_id: str) -> EvalCore | None:
        return self.hosted.online_core(task_id)

    def set_faults(self, faults: FaultSpec | Mapping[str, Any] | str | None) -> None:
        """Replace the fault configuration (counters restart)."""
        self.faults.set(FaultSpec.coerce(faults))

    def close(self) -> None:
        self.hosted.close()
        self.core.close()
        self.jpeg_pool.shutdown(wait=True)


class ServerHandle:
    """A running testbed (what :func:`serve_testbed` yields).

    Attributes:
        url: ``"http://127.0.0.1:<port>"`` (``https://`` with TLS files).
        results_root: the project root; results are under ``saved/eval_results/...``.
        stats: :class:`~genmanip_testbed.stats.Stats` counters.
        app: the ASGI application (usable in-process).
        server: the :class:`LocalServer` (its ``core`` is the eval state machine).
    """

    def __init__(self, server: LocalServer, url: str) -> None:
        self.server = server
        self.url = url
        self.results_root = server.options.results_root
        self.stats = server.stats
        self.app = server.app

    @property
    def core(self) -> EvalCore:
        return self.server.core

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def run_id(self) -> str | None:
        return self.server.core.run_id

    @property
    def run_dir(self) -> Path:
        """``<results_root>/saved/eval_results/<benchmark>/<run_id>`` of the current job."""
        return self.server.core.run_dir

    def set_faults(self, faults: FaultSpec | Mapping[str, Any] | str | None) -> None:
        self.server.set_faults(faults)

    def wait_finalizes(self, timeout: float | None = 60.0) -> bool:
        """Wait until every finished episode's files are on disk."""
        return self.server.core.wait_finalizes(timeout)

    def __repr__(self) -> str:
        return f"ServerHandle(url={self.url!r}, results_root={str(self.results_root)!r})"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(config: Any, stopping: threading.Event) -> Any:
    """A ``uvicorn.Server`` for ``config`` that sets ``stopping`` as soon as it is asked to exit
    (a signal, or :meth:`_UvicornThread.stop`), before it waits for open requests."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            stopping.set()
            super().handle_exit(sig, frame)

    return _Server(config)


class _UvicornThread:
    """uvicorn on a pre-bound socket in a background thread."""

    def __init__(
        self,
        app: ASGIApp,
        sock: socket.socket,
        *,
        ssl_certfile: str | None,
        ssl_keyfile: str | None,
        stopping: threading.Event,
        log_level: str = "warning",
    ) -> None:
        import uvicorn

        config = uvicorn.Config(
            app,
            http="httptools",
            lifespan="off",
            log_level=log_level,
            access_log=False,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            timeout_graceful_shutdown=2,
            timeout_keep_alive=5,
        )
        self.server = _uvicorn_server(config, stopping)
        self.stopping = stopping
        self.sock = sock
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="testbed-uvicorn", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as e:
            self.error = e

    def start(self, timeout: float = 20.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise ServerStartError(f"the testbed server failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"the testbed server did not start within {timeout}s")
            time.sleep(0.005)

    def stop(self) -> None:
        # (not handle_exit: uvicorn would record a signal to re-raise)
        self.stopping.set()
        self.server.should_exit = True
        self.thread.join(timeout=15)
        with contextlib.suppress(OSError):
            self.sock.close()


@contextlib.contextmanager
def serve_testbed(
    robot: str = "manip/lift2/R5a",
    *,
    wire: str = "both",
    tasks: Sequence[str] | str = (DEFAULT_CONFIG,),
    token: str | None = None,
    results_root: str | Path | None = None,
    save_process: bool = False,
    run_id: str | None = None,
    job: bool = True,
    faults: FaultSpec | Mapping[str, Any] | str | None = None,
    seed: int = 0,
    num_steps: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    online_token: str | None = None,
    leaderboard_token: str | None = None,
    data_dir: str | Path | None = None,
    capacity: int = 8,
    reset_delay: float = 0.03,
    online_ready_after: int = 2,
    max_upload_bytes: int = 256 * 1024 * 1024,
    ssl_certfile: str | Path | None = None,
    ssl_keyfile: str | Path | None = None,
    keep_results: bool = False,
    frame_cache: bool = True,
    is_rel_default: bool = False,
) -> Iterator[ServerHandle]:
    """Run a testbed on ``host:port`` (port 0 = an ephemeral port) in a background thread.

    Args:
        robot: robot id or alias (cameras, state and action sizes follow it).
        wire: ``"legacy"`` (pickle + JPEG frames), ``"msgpack"`` or ``"both"`` (chosen per request by
            Content-Type).
        tasks: config names loaded as the default job (``testbed/all``, ``testbed/smoke``, ...).
        token: Bearer token required on every route but ``/docs`` (None: no auth).
        results_root: the project root; None makes a temp dir (deleted on exit unless
            ``keep_results``).
        save_process: write per-camera mp4s and ``meta_record.pkl`` for every episode.
        run_id: the default job's run id (None: a timestamp, the real server's rule).
        job: load a job at start (False: idle until ``/start_new_job``).
        faults: a :class:`FaultSpec`, a spec string or a dict.
        seed: world seed; 0 gives the default scenes (every episode is seeded by its task and seed;
            a non-zero value varies them all, deterministically).
        num_steps: episode step limit override.
        online_token: Bearer token of the online-service emulation (default: ``token``).
        leaderboard_token: accepted ``author_token`` of the leaderboard emulation (default: ``token``;
            None accepts any non-empty token).
        capacity: worker slots (more -> ``InsufficientResourcesError``).
        reset_delay: background reset duration, so the pending form is observable.
        online_ready_after: ``ready`` polls answered ``ready: false`` before an endpoint is given.
        ssl_certfile, ssl_keyfile: serve HTTPS with these PEM files.

    Yields:
        a :class:`ServerHandle`; the server, its threads and its socket are gone after the block.
    """
    created: Path | None = None
    if results_root is None:
        created = Path(tempfile.mkdtemp(prefix="gmp-testbed-"))
        root = created
    else:
        root = Path(results_root)
        root.mkdir(parents=True, exist_ok=True)
    opts = ServerOptions(
        robot=robot,
        wire=wire,
        tasks=tuple([tasks] if isinstance(tasks, str) else tasks),
        token=token,
        online_token=online_token,
        leaderboard_token=leaderboard_token,
        results_root=root,
        data_dir=Path(data_dir) if data_dir is not None else None,
        save_process=save_process,
        run_id=run_id,
        job=job,
        seed=seed,
        num_steps=num_steps,
        capacity=capacity,
        reset_delay=reset_delay,
        online_ready_after=online_ready_after,
        max_upload_bytes=max_upload_bytes,
        frame_cache=frame_cache,
        is_rel_default=is_rel_default,
    )
    server: LocalServer | None = None
    runner: _UvicornThread | None = None
    try:
        server = LocalServer(opts, faults=faults)
        sock = _bind(host, port)
        runner = _UvicornThread(
            server.app,
            sock,
            ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
            ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
            stopping=server.stopping,
        )
        runner.start()
        bound = sock.getsockname()
        scheme = "https" if ssl_certfile else "http"
        h = bound[0] if ":" not in bound[0] else f"[{bound[0]}]"
        yield ServerHandle(server, f"{scheme}://{h}:{bound[1]}")
    finally:
        if runner is not None:
            runner.stop()
        if server is not None:
            server.close()
        if created is not None and not keep_results:
            shutil.rmtree(created, ignore_errors=True)
