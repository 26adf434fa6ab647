"""``gmp online run``: the whole online flow in one command.

1. create a task on the online service (or reuse ``--task-id``) and wait for its endpoint
   (``genmanip_online``: backoff with jitter, hard ``--deadline``, Ctrl-C offers to stop);
2. evaluate ``--policy`` against the endpoint exactly like ``gmp eval`` (``genmanip_eval``), with
   the task id as run id and the online token;
3. stop the task (unless ``--keep-task``), also when the evaluation failed or was interrupted.
"""

from __future__ import annotations

import argparse

from genmanip_eval.cli import run_eval
from genmanip_online.cli import (
    client_from_args,
    resolve_online_token,
    stop_command,
    submit_and_wait,
)
from genmanip_online.client import OnlineClient
from genmanip_online.errors import GenmanipOnlineError
from genmanip_online.urls import check_url
from genmanip_protocol.errors import ExitCode, ValidationError, Violation
from genmanip_runtime.console import Console

__all__ = ["run"]


def _stop(client: OnlineClient, task_id: str, endpoint: str, console: Console) -> bool:
    try:
        res = client.stop(task_id, endpoint)
    except GenmanipOnlineError as e:
        console.error(f"could not stop task {task_id}: {e}",
                      hint=f"stop it with: {stop_command(client, task_id, endpoint)}")
        return False
    console.info(f"stopped task {task_id} ({res.url})")
    return True


def run(args: argparse.Namespace) -> int:
    """Handler of ``gmp online run`` (see the module docstring); returns the evaluation's exit code."""
    console = Console.from_args(args)
    token = resolve_online_token(args)
    requested_run_id = getattr(args, "run_id", None)
    if requested_run_id and getattr(args, "task_id", None) and requested_run_id != args.task_id:
        raise ValidationError(
            Violation("--run-id", "the task id (online runs use it as run id)", repr(requested_run_id)),
            hint="drop --run-id, or pass the task with --task-id",
        )
    if requested_run_id and not getattr(args, "task_id", None):
        raise ValidationError(
            Violation("--run-id", "unset (the online service assigns the run id: the task id)",
                      repr(requested_run_id)),
            hint="use --task-id to continue an existing task",
        )
    keep = bool(getattr(args, "keep_task", False))
    with client_from_args(args, token) as client:
        try:
            task_id, status = submit_and_wait(args, client, console)
        except KeyboardInterrupt:
            return int(ExitCode.INTERRUPTED)
        endpoint = str(status.endpoint)
        # The token goes to the endpoint too: the same plain-HTTP rule applies to it.
        check_url(endpoint, insecure_http=bool(getattr(args, "insecure_http", False)), field="data.endpoint")

        eval_args = argparse.Namespace(**vars(args))
        eval_args.url = endpoint
        eval_args.host = None
        eval_args.port = None
        eval_args.token = token
        eval_args.run_id = task_id
        console.info(f"evaluating {getattr(args, 'policy', 'zero')} on {endpoint} (run id {task_id})")
        try:
            rc = run_eval(eval_args)
        except BaseException:
            if not keep:
                _stop(client, task_id, endpoint, console)
            raise
        if keep:
            console.info(f"task {task_id} kept; stop it with: {stop_command(client, task_id, endpoint)}")
        elif not _stop(client, task_id, endpoint, console) and rc == 0:
            rc = int(ExitCode.REMOTE_ERROR)
        return int(rc)
