"""Handlers of ``gmp online create|ready|submit|stop`` (the parser lives in the meta package).

Data goes to stdout (a task id, a JSON object), talk to stderr. The token comes from ``--token``,
``GMP_ONLINE_TOKEN`` or the config file's ``[online] token`` and is never printed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from genmanip_protocol.errors import ConfigError, ExitCode
from genmanip_runtime.config import resolve_setting, resolve_token
from genmanip_runtime.console import Console, format_duration
from genmanip_runtime.redact import scrub_secrets

from .client import CREATE_FIELDS, OnlineClient, PollEvent, ReadyStatus
from .errors import GenmanipOnlineError, MissingTokenError

__all__ = [
    "DEFAULT_DEADLINE",
    "TOKEN_ENV",
    "URL_ENV",
    "client_from_flags",
    "create",
    "offer_stop",
    "ready",
    "resolve_online_token",
    "stop",
    "stop_command",
    "submit",
    "submit_and_wait",
    "task_fields",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "GMP_ONLINE_TOKEN"  # noqa: S105 - the variable name, not a token
URL_ENV = "GMP_ONLINE_URL"
SECTION = "online"
#: Default ``--deadline`` in seconds: waiting is never unbounded.
DEFAULT_DEADLINE = 3600.0



def resolve_online_token(token: str | None) -> str:
    """The token from ``--token`` (``token``), ``$GMP_ONLINE_TOKEN`` or ``[online] token`` in the
    config file."""
    flag_token = token
    if flag_token:
        log.warning("--token puts the token in process lists and shell history; prefer $%s "
                    "or the config file", TOKEN_ENV)
    token = resolve_token(flag_token, TOKEN_ENV, SECTION)
    if not token:
        raise MissingTokenError(
            "the online service needs a token",
            hint=f"set ${TOKEN_ENV}, add `token = \"...\"` under [online] in the config file, or pass --token",
        )
    return token


def client_from_flags(
    *,
    base_url: str | None,
    token: str | None,
    timeout: float,
    ca_cert: str | None,
    insecure_http: bool,
    resolved_token: str | None = None,
) -> OnlineClient:
    """Build the client from ``--base-url`` (or ``$GMP_ONLINE_URL`` / ``[online] base_url``) and flags.

    ``token`` is the ``--token`` flag, resolved after the URL (:func:`resolve_online_token`);
    ``resolved_token`` skips that, for a caller that resolved it already (``gmp online run``).
    """
    base_url = resolve_setting(base_url, URL_ENV, SECTION, "base_url", None)
    if not base_url:
        raise ConfigError(
            "no online service URL",
            hint=f"pass --base-url, set ${URL_ENV}, or add `base_url = \"https://...\"` under [online] in the config file",
        )
    return OnlineClient(
        str(base_url),
        resolved_token if resolved_token is not None else resolve_online_token(token),
        timeout=float(timeout or 30.0),
        ca_file=ca_cert,
        insecure_http=insecure_http,
    )


def task_fields(
    *,
    task_id: str | None,
    model_name: str | None,
    model_type: str | None,
    benchmark_set: str | None,
    submitter_name: str | None,
    submitter_homepage: str | None,
    is_public: bool,
) -> dict[str, Any]:
    """The ``createTask`` body (:data:`CREATE_FIELDS`) from the task flags; unset ones are not sent."""
    given: dict[str, Any] = {
        "task_id": task_id,
        "model_name": model_name,
        "model_type": model_type,
        "benchmark_set": benchmark_set,
        "submitter_name": submitter_name,
        "submitter_homepage": submitter_homepage,
        "is_public": is_public,
    }
    return {
        name: given[name]
        for name in CREATE_FIELDS
        if given[name] is not None and given[name] is not False
    }


def stop_command(client: OnlineClient, task_id: str, endpoint: str | None) -> str:
    """The exact ``gmp online stop`` command for a task (never with the token)."""
    parts = ["gmp online stop", f"--base-url {client.base_url}", f"--task-id {task_id}"]
    if endpoint:
        parts.append(f"--endpoint {endpoint}")
    if client.insecure_http:
        parts.append("--insecure-http")
    return " ".join(parts)


class _PollDisplay:
    """Renders poll events on the console's status line: live on a TTY, nothing when piped.

    Failed polls are always told (as warnings, which the console writes above the line).
    """

    def __init__(self, console: Console, task_id: str) -> None:
        self.console = console
        self._line = console.status_line(f"waiting for task {task_id}").start()

    def __call__(self, ev: PollEvent) -> None:
        if ev.error is not None:
            self.console.warn(f"poll {ev.polls} failed (will retry): {ev.error}")
        bits = [f"poll {ev.polls}"]
        st = ev.status
        if st is not None:
            if st.status:
                bits.append(st.status)
            if st.queue_position is not None:
                bits.append(f"queue position {st.queue_position}")
            if st.eta_s is not None:
                bits.append(f"ETA {format_duration(st.eta_s)}")
        if ev.next_delay_s is not None:
            d = ev.next_delay_s
            bits.append(f"next poll in {d:.1f} s" if d < 10 else f"next poll in {d:.0f} s")
        self._line.update(*bits)

    def clear(self) -> None:
        """Remove the line for good (idempotent)."""
        self._line.close()


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
    client: OnlineClient,
    console: Console,
    *,
    task_id: str | None,
    fields: Mapping[str, Any],
    deadline: float,
    interval: float,
) -> tuple[str, ReadyStatus]:
    """Create the task (or reuse ``task_id``) and wait until it has an endpoint.

    ``fields`` is the ``createTask`` body (:func:`task_fields`), used when ``task_id`` is unset.
    ``KeyboardInterrupt`` propagates after :func:`offer_stop` ran; its ``task_id`` attribute is set.
    """
    if task_id:
        console.info(f"using task {task_id}")
    else:
        task_id = client.create_task(**fields)
        console.info(f"created task {task_id}")
    deadline = float(deadline or DEFAULT_DEADLINE)
    interval = float(interval or 5.0)
    display = _PollDisplay(console, task_id)
    started = time.monotonic()
    try:
        status = client.wait_ready(task_id, deadline=deadline, interval=interval, on_poll=display)
    except KeyboardInterrupt as e:
        display.clear()
        offer_stop(client, task_id, None, console)
        e.task_id = task_id  # type: ignore[attr-defined]
        raise
    finally:
        # Whatever ends the wait, the live line must not outlive it (clear is idempotent).
        display.clear()
    console.success(
        f"task {task_id} is ready after {format_duration(time.monotonic() - started)}: {status.endpoint}"
    )
    return task_id, status


def _print_json(obj: Any) -> None:
    # The service's replies are in it: json.dumps escapes every control character (ASCII output),
    # and a token the service echoed back is scrubbed.
    sys.stdout.write(scrub_secrets(json.dumps(obj, sort_keys=True)) + "\n")
    sys.stdout.flush()


def create(
    *,
    base_url: str | None,
    token: str | None,
    timeout: float,
    ca_cert: str | None,
    insecure_http: bool,
    task_id: str | None,
    model_name: str | None,
    model_type: str | None,
    benchmark_set: str | None,
    submitter_name: str | None,
    submitter_homepage: str | None,
    is_public: bool,
    console: Console,
) -> int:
    """``gmp online create``: create a task; print its id on stdout."""
    fields = task_fields(
        task_id=task_id, model_name=model_name, model_type=model_type,
        benchmark_set=benchmark_set, submitter_name=submitter_name,
        submitter_homepage=submitter_homepage, is_public=is_public,
    )
    with client_from_flags(
        base_url=base_url, token=token, timeout=timeout, ca_cert=ca_cert,
        insecure_http=insecure_http,
    ) as client:
        task_id = client.create_task(**fields)
    console.info(f"created task {task_id}")
    sys.stdout.write(scrub_secrets(task_id) + "\n")  # controls were refused by the client
    return int(ExitCode.OK)


def ready(
    *,
    base_url: str | None,
    token: str | None,
    timeout: float,
    ca_cert: str | None,
    insecure_http: bool,
    task_id: str,
    console: Console,
) -> int:
    """``gmp online ready``: ask once; print ``{"task_id", "ready", "endpoint", ...}`` on stdout."""
    with client_from_flags(
        base_url=base_url, token=token, timeout=timeout, ca_cert=ca_cert,
        insecure_http=insecure_http,
    ) as client:
        st = client.ready(task_id)
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


def submit(
    *,
    base_url: str | None,
    token: str | None,
    timeout: float,
    ca_cert: str | None,
    insecure_http: bool,
    task_id: str | None,
    model_name: str | None,
    model_type: str | None,
    benchmark_set: str | None,
    submitter_name: str | None,
    submitter_homepage: str | None,
    is_public: bool,
    interval: float,
    deadline: float,
    print_endpoint: bool,
    console: Console,
) -> int:
    """``gmp online submit``: create (or reuse ``--task-id``) and wait for the endpoint.

    stdout: with ``--print-endpoint`` only the JSON ``{"task_id", "endpoint"}``; otherwise the same
    JSON too (it is the command's data), progress and messages on stderr.
    """
    fields = task_fields(
        task_id=task_id, model_name=model_name, model_type=model_type,
        benchmark_set=benchmark_set, submitter_name=submitter_name,
        submitter_homepage=submitter_homepage, is_public=is_public,
    )
    with client_from_flags(
        base_url=base_url, token=token, timeout=timeout, ca_cert=ca_cert,
        insecure_http=insecure_http,
    ) as client:
        try:
            ready_id, status = submit_and_wait(
                client, console, task_id=task_id, fields=fields, deadline=deadline,
                interval=interval,
            )
        except KeyboardInterrupt:
            return int(ExitCode.INTERRUPTED)
    _print_json({"task_id": ready_id, "endpoint": status.endpoint})
    if not print_endpoint:
        console.info(
            f"evaluate it with: GMP_TOKEN=\"${TOKEN_ENV}\" gmp eval --url {status.endpoint} "
            f"--run-id {ready_id} --policy ...  (or do it all with `gmp online run`)"
        )
    return int(ExitCode.OK)


def stop(
    *,
    base_url: str | None,
    token: str | None,
    timeout: float,
    ca_cert: str | None,
    insecure_http: bool,
    task_id: str,
    endpoint: str | None,
    user_id: str | None,
    console: Console,
) -> int:
    """``gmp online stop``: stop a task on its endpoint (looked up with ``ready`` unless ``--endpoint``)."""
    with client_from_flags(
        base_url=base_url, token=token, timeout=timeout, ca_cert=ca_cert,
        insecure_http=insecure_http,
    ) as client:
        out = _do_stop(client, task_id, endpoint, console, user_id=user_id)
    _print_json(out)
    return int(ExitCode.OK)
