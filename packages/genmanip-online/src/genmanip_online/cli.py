"""Handlers of ``gmp online create|ready|submit|stop`` (the parser lives in the meta package).

Data goes to stdout (a task id, a JSON object), talk to stderr. The token comes from ``--token``,
``GMP_ONLINE_TOKEN`` or the config file's ``[online] token`` and is never printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from genmanip_protocol.errors import ConfigError, ExitCode
from genmanip_runtime.config import resolve_setting, resolve_token
from genmanip_runtime.console import Console

from .client import CREATE_FIELDS, OnlineClient, PollEvent, ReadyStatus
from .errors import GenmanipOnlineError, MissingTokenError

__all__ = [
    "DEFAULT_DEADLINE",
    "TOKEN_ENV",
    "URL_ENV",
    "client_from_args",
    "console_from_args",
    "create",
    "offer_stop",
    "ready",
    "resolve_online_token",
    "stop",
    "stop_command",
    "submit",
    "submit_and_wait",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "GMP_ONLINE_TOKEN"  # noqa: S105 - the variable name, not a token
URL_ENV = "GMP_ONLINE_URL"
SECTION = "online"
#: Default ``--deadline`` in seconds: waiting is never unbounded.
DEFAULT_DEADLINE = 3600.0



def resolve_online_token(args: argparse.Namespace) -> str:
    """The token from ``--token``, ``$GMP_ONLINE_TOKEN`` or ``[online] token`` in the config file."""
    if getattr(args, "token", None):
        log.warning("--token puts the token in process lists and shell history; prefer $%s "
                    "or the config file", TOKEN_ENV)
    token = resolve_token(getattr(args, "token", None), TOKEN_ENV, SECTION)
    if not token:
        raise MissingTokenError(
            "the online service needs a token",
            hint=f"set ${TOKEN_ENV}, add `token = \"...\"` under [online] in the config file, or pass --token",
        )
    return token


def console_from_args(args: argparse.Namespace, stream: TextIO | None = None) -> Console:
    """A stderr console honouring the global ``-q``/``-v`` flags."""
    return Console(
        stream if stream is not None else sys.stderr,
        quiet=bool(getattr(args, "quiet", False)),
        verbose=int(getattr(args, "verbose", 0) or 0),
    )


def client_from_args(args: argparse.Namespace, token: str | None = None) -> OnlineClient:
    """Build the client from ``--base-url`` (or ``$GMP_ONLINE_URL`` / ``[online] base_url``) and flags."""
    base_url = resolve_setting(getattr(args, "base_url", None), URL_ENV, SECTION, "base_url", None)
    if not base_url:
        raise ConfigError(
            "no online service URL",
            hint=f"pass --base-url, set ${URL_ENV}, or add `base_url = \"https://...\"` under [online] in the config file",
        )
    return OnlineClient(
        str(base_url),
        token if token is not None else resolve_online_token(args),
        timeout=float(getattr(args, "timeout", 30.0) or 30.0),
        ca_file=getattr(args, "ca_cert", None),
        insecure_http=bool(getattr(args, "insecure_http", False)),
    )


def _create_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in CREATE_FIELDS:
        value = getattr(args, name, None)
        if value is not None and value is not False:
            fields[name] = value
    return fields


def stop_command(client: OnlineClient, task_id: str, endpoint: str | None) -> str:
    """The exact ``gmp online stop`` command for a task (never with the token)."""
    parts = ["gmp online stop", f"--base-url {client.base_url}", f"--task-id {task_id}"]
    if endpoint:
        parts.append(f"--endpoint {endpoint}")
    if client.insecure_http:
        parts.append("--insecure-http")
    return " ".join(parts)


def _fmt_secs(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


class _PollDisplay:
    """Renders poll events: a live line on a TTY, nothing when piped (errors are always told)."""

    def __init__(self, console: Console, task_id: str) -> None:
        self.console = console
        self.task_id = task_id
        self._live = console.is_tty and not getattr(console, "quiet", False)
        self._drawn = False

    def __call__(self, ev: PollEvent) -> None:
        if ev.error is not None:
            self.clear()
            self.console.warn(f"poll {ev.polls} failed (will retry): {ev.error}")
        if not self._live:
            return
        bits = [f"waiting for task {self.task_id}", _fmt_secs(ev.elapsed_s), f"poll {ev.polls}"]
        st = ev.status
        if st is not None:
            if st.status:
                bits.append(st.status)
            if st.queue_position is not None:
                bits.append(f"queue position {st.queue_position}")
            if st.eta_s is not None:
                bits.append(f"ETA {_fmt_secs(st.eta_s)}")
        if ev.next_delay_s is not None:
            d = ev.next_delay_s
            bits.append(f"next poll in {d:.1f} s" if d < 10 else f"next poll in {d:.0f} s")
        self.console.stream.write("\r\x1b[2K" + ", ".join(bits))
        self.console.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        if self._drawn:
            self.console.stream.write("\r\x1b[2K")
            self.console.stream.flush()
            self._drawn = False


def _ask_yes_no(prompt: str) -> bool:
    try:
        sys.stderr.write(prompt)
        sys.stderr.flush()
        answer = sys.stdin.readline()
    except (KeyboardInterrupt, EOFError):
        sys.stderr.write("\n")
        return False
    return answer.strip().lower() in ("y", "yes")


def offer_stop(
    client: OnlineClient,
    task_id: str,
    endpoint: str | None,
    console: Console,
    *,
    interactive: bool | None = None,
    ask: Callable[[str], bool] = _ask_yes_no,
) -> bool:
    """After Ctrl-C: on a TTY ask whether to stop the task; otherwise print the stop command.

    Returns True when the task was stopped.
    """
    if interactive is None:
        interactive = sys.stdin.isatty() and console.is_tty
    cmd = stop_command(client, task_id, endpoint)
    if not interactive:
        console.warn(f"interrupted; task {task_id} is left as it is. To stop it: {cmd}")
        return False
    if not ask(f"Stop task {task_id} on the service? [y/N] "):
        console.info(f"task {task_id} left as it is. To stop it later: {cmd}")
        return False
    try:
        _do_stop(client, task_id, endpoint, console, user_id=None)
    except GenmanipOnlineError as e:
        console.error(f"could not stop task {task_id}: {e}")
        console.info(f"to retry: {cmd}")
        return False
    return True


def _do_stop(
    client: OnlineClient,
    task_id: str,
    endpoint: str | None,
    console: Console,
    *,
    user_id: str | None,
) -> dict[str, Any]:
    if not endpoint:
        st = client.ready(task_id)
        if not st.ready or not st.endpoint:
            raise GenmanipOnlineError(
                f"task {task_id} has no endpoint yet, so there is nothing running to stop",
                hint="the service exposes stop only on an assigned endpoint; try again once `gmp online ready` shows one",
            )
        endpoint = st.endpoint
    res = client.stop(task_id, endpoint, user_id=user_id)
    console.success(f"stopped task {task_id} ({res.url})")
    return {"task_id": task_id, "endpoint": endpoint, "stopped": True, "stop_url": res.url, "reply": res.reply}


def submit_and_wait(
    args: argparse.Namespace,
    client: OnlineClient,
    console: Console,
) -> tuple[str, ReadyStatus]:
    """Create the task (or reuse ``--task-id``) and wait until it has an endpoint.

    ``KeyboardInterrupt`` propagates after :func:`offer_stop` ran; its ``task_id`` attribute is set.
    """
    task_id = getattr(args, "task_id", None)
    if task_id:
        console.info(f"using task {task_id}")
    else:
        task_id = client.create_task(**_create_fields(args))
        console.info(f"created task {task_id}")
    deadline = float(getattr(args, "deadline", None) or DEFAULT_DEADLINE)
    interval = float(getattr(args, "interval", None) or 5.0)
    display = _PollDisplay(console, task_id)
    started = time.monotonic()
    try:
        status = client.wait_ready(task_id, deadline=deadline, interval=interval, on_poll=display)
    except KeyboardInterrupt as e:
        display.clear()
        offer_stop(client, task_id, None, console)
        e.task_id = task_id  # type: ignore[attr-defined]
        raise
    except GenmanipOnlineError:
        display.clear()
        raise
    display.clear()
    console.success(
        f"task {task_id} is ready after {_fmt_secs(time.monotonic() - started)}: {status.endpoint}"
    )
    return task_id, status


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def create(args: argparse.Namespace) -> int:
    """``gmp online create``: create a task; print its id on stdout."""
    console = console_from_args(args)
    with client_from_args(args) as client:
        task_id = client.create_task(**_create_fields(args))
    console.info(f"created task {task_id}")
    sys.stdout.write(task_id + "\n")
    return int(ExitCode.OK)


def ready(args: argparse.Namespace) -> int:
    """``gmp online ready``: ask once; print ``{"task_id", "ready", "endpoint", ...}`` on stdout."""
    with client_from_args(args) as client:
        st = client.ready(args.task_id)
    _print_json(
        {
            "task_id": st.task_id,
            "ready": st.ready,
            "endpoint": st.endpoint,
            "queue_position": st.queue_position,
            "eta_s": st.eta_s,
            "status": st.status,
        }
    )
    return int(ExitCode.OK)


def submit(args: argparse.Namespace) -> int:
    """``gmp online submit``: create (or reuse ``--task-id``) and wait for the endpoint.

    stdout: with ``--print-endpoint`` only the JSON ``{"task_id", "endpoint"}``; otherwise the same
    JSON too (it is the command's data), progress and messages on stderr.
    """
    console = console_from_args(args)
    with client_from_args(args) as client:
        try:
            task_id, status = submit_and_wait(args, client, console)
        except KeyboardInterrupt:
            return int(ExitCode.INTERRUPTED)
    _print_json({"task_id": task_id, "endpoint": status.endpoint})
    if not getattr(args, "print_endpoint", False):
        console.info(
            f"evaluate it with: GMP_TOKEN=\"${TOKEN_ENV}\" gmp eval --url {status.endpoint} "
            f"--run-id {task_id} --policy ...  (or do it all with `gmp online run`)"
        )
    return int(ExitCode.OK)


def stop(args: argparse.Namespace) -> int:
    """``gmp online stop``: stop a task on its endpoint (looked up with ``ready`` unless ``--endpoint``)."""
    console = console_from_args(args)
    with client_from_args(args) as client:
        out = _do_stop(
            client,
            args.task_id,
            getattr(args, "endpoint", None),
            console,
            user_id=getattr(args, "user_id", None),
        )
    _print_json(out)
    return int(ExitCode.OK)
