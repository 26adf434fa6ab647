"""Handlers of ``gmp viz`` (:func:`serve`) and ``gmp viz build`` (:func:`build`)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import secrets
import socket
import sys
from pathlib import Path

from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import is_run_dir, load_run
from genmanip_results.layout import EPISODE_RRD
from genmanip_runtime.console import Console, Progress

from .errors import NoRunError, VizDependencyError
from .recording import IGNORE_SIGINT, build_recording, recording_is_fresh

__all__ = ["build", "serve"]


def _check_rerun() -> None:
    # find_spec, not import: importing rerun (pyarrow, the native module) takes seconds, and only
    # the build processes need it.
    import importlib.util

    if importlib.util.find_spec("rerun") is None:
        raise VizDependencyError(
            "gmp viz needs rerun-sdk 0.41 (Python >= 3.11)",
            hint="pip install 'rerun-sdk==0.41.*'  (or reinstall genmanip-viz, which requires it)",
        )


def serve(
    *,
    root: str,
    port: int,
    host: str,
    https: bool | None,
    open: bool,  # --open's dest; shadows the builtin, which this function does not use
    console: Console,
) -> int:
    """``gmp viz [--root DIR] [--port 55077] [--host 127.0.0.1] [--https | --http] [--open]``.

    Loopback binds serve plain HTTP (``http://localhost`` is a secure context, which the viewer's
    video decoding needs) unless ``--https``; other binds serve HTTPS with a self-signed certificate
    and require a generated access token (``--http`` forces plain HTTP, the token stays).
    """
    _check_rerun()
    from .server import VizServer, is_loopback

    root_dir = Path(root or ".").expanduser()
    if not root_dir.is_dir():
        raise NoRunError(f"--root: {root_dir} is not a directory")
    host = str(host or "127.0.0.1")
    loopback = is_loopback(host)
    token = None if loopback else secrets.token_urlsafe(24)
    server = VizServer(
        root_dir,
        host=host,
        port=port,
        https=https,
        token=token,
        # gmp viz has no --jobs (gmp viz build has): the server's on-demand builds use two.
        workers=2,
    )
    if port not in (0, server.port):
        console.warn(f"port {port} is busy; using {server.port}")
    # The URL (with the token, printed once) is the command's data: stdout. Hints go to stderr.
    print(server.url, flush=True)
    console.info(f"serving results under {root_dir.resolve()}")
    if loopback:
        here = socket.gethostname()
        console.info(
            f"from another machine: ssh -L {server.port}:localhost:{server.port} {here}  "
            f"then open http://localhost:{server.port}/"
        )
    else:
        if server.https:
            console.info("self-signed certificate: your browser asks once to accept it")
        else:
            console.warn("plain HTTP beyond loopback: the token and results travel unencrypted")
        console.info(
            f"safer: bind to 127.0.0.1 and tunnel: ssh -L {server.port}:localhost:{server.port} "
            f"{socket.gethostname()}"
        )
    console.info("press Ctrl-C to stop")
    if open:
        import webbrowser

        webbrowser.open(server.url)
    server.run()
    return int(ExitCode.OK)


def build(*, run_dir: str, jobs: int | None, console: Console) -> int:
    """``gmp viz build RUN_DIR [--jobs N]``: build every complete episode's recording up front."""
    _check_rerun()
    run_path = Path(run_dir).expanduser()
    if not run_path.is_dir() or not is_run_dir(run_path):
        raise NoRunError(
            f"RUN_DIR: {run_path} is not a run directory",
            hint="give <results>/<benchmark>/<run_id> (the directory holding the task folders)",
        )
    run = load_run(run_path)
    episodes = [e for e in run.episodes if e.complete and e.videos]
    todo = [
        e
        for e in episodes
        if not recording_is_fresh(e) and not (Path(e.path) / EPISODE_RRD).is_file()
    ]
    workers = jobs or min(2, os.cpu_count() or 1)
    if workers < 1:
        raise NoRunError("--jobs: must be >= 1")
    failed: list[tuple[str, str]] = []
    if todo:
        ctx = multiprocessing.get_context("spawn")
        with (
            Progress(len(todo), "building recordings", console, unit="episodes") as prog,
            concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                                   **IGNORE_SIGINT) as pool,
        ):
            futures = {pool.submit(build_recording, e): e for e in todo}
            for fut in concurrent.futures.as_completed(futures):
                ep = futures[fut]
                try:
                    fut.result()
                except Exception as exc:
                    failed.append((ep.episode_id, str(exc)))
                prog.update(1)
    built = len(todo) - len(failed)
    console.info(
        f"{built} recordings built, {len(episodes) - len(todo)} up to date, {len(failed)} failed "
        f"({run.benchmark}/{run.run_id})"
    )
    for eid, msg in failed:
        console.error(f"{eid}: {msg}")
    print(run_path.resolve(), file=sys.stdout)
    return int(ExitCode.FAILURE if failed else ExitCode.OK)
