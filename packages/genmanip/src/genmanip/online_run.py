"""``gmp online run``: the whole online flow in one command.

1. create a task on the online service (or reuse ``--task-id``) and wait for its endpoint
   (``genmanip_online``: backoff with jitter, hard ``--deadline``, Ctrl-C offers to stop);
2. evaluate ``--policy`` against the endpoint exactly like ``gmp eval`` (``genmanip_eval``'s
   :func:`~genmanip_eval.cli.eval_config` and :func:`~genmanip_eval.cli.evaluate`), with the task
   id as run id and the online token;
3. stop the task (unless ``--keep-task``), also when the evaluation failed or was interrupted.
"""

from __future__ import annotations

from genmanip_eval.cli import EvalFlags, eval_config, eval_exit_code, evaluate
from genmanip_online.cli import (
    client_from_flags,
    resolve_online_token,
    stop_command,
    submit_and_wait,
    task_fields,
)
from genmanip_online.client import OnlineClient
from genmanip_online.errors import GenmanipOnlineError
from genmanip_online.urls import check_url
from genmanip_protocol.errors import ExitCode, ValidationError, Violation
from genmanip_runtime.console import Console
from genmanip_runtime.transport import build_base_url

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


def run(
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
    keep_task: bool,
    run_id: str | None,
    worker_ids: str,
    processes: int,
    max_episodes: int | None,
    max_recoveries: int,
    policy: str | None,
    policy_arg: list[str],
    chunk_size: int,
    step_chunk: bool,
    robot: str | None,
    arm_type: str | None,
    gripper_type: str | None,
    control_type: str | None,
    codec: str,
    frames: str,
    render_mode: str | None,
    subframes: int | None,
    results_dir: str | None,
    record: bool,
    live_every: int,
    plot_on_episode_end: bool,
    runner: str,
    max_batch: int | None,
    max_wait_ms: float | None,
    compare_to: str | None,
    stop_when_decided: bool,
    alpha: float,
    delta: float | None,
    launcher: str,
    ray_address: str | None,
    workers_per_actor: int | None,
    policy_replicas: int | None,
    gpus_per_replica: float | None,
    cpus_per_replica: float | None,
    allow_policy_change: bool,
    as_json: bool,
    transcode: str,
    console: Console,
) -> int:
    """Handler of ``gmp online run`` (see the module docstring); returns the evaluation's exit code."""
    online_token = resolve_online_token(token)
    requested_run_id = run_id
    if requested_run_id and task_id and requested_run_id != task_id:
        raise ValidationError(
            Violation("--run-id", "the task id (online runs use it as run id)", repr(requested_run_id)),
            hint="drop --run-id, or pass the task with --task-id",
        )
    if requested_run_id and not task_id:
        raise ValidationError(
            Violation("--run-id", "unset (the online service assigns the run id: the task id)",
                      repr(requested_run_id)),
            hint="use --task-id to continue an existing task",
        )
    keep = keep_task
    fields = task_fields(
        task_id=task_id, model_name=model_name, model_type=model_type,
        benchmark_set=benchmark_set, submitter_name=submitter_name,
        submitter_homepage=submitter_homepage, is_public=is_public,
    )
    with client_from_flags(
        base_url=base_url, token=token, timeout=timeout, ca_cert=ca_cert,
        insecure_http=insecure_http, resolved_token=online_token,
    ) as client:
        try:
            task_id, status = submit_and_wait(
                client, console, task_id=task_id, fields=fields, deadline=deadline,
                interval=interval,
            )
        except KeyboardInterrupt:
            return int(ExitCode.INTERRUPTED)
        endpoint = str(status.endpoint)
        # The token goes to the endpoint too: the same plain-HTTP rule applies to it.
        check_url(endpoint, insecure_http=insecure_http, field="data.endpoint")

        console.info(f"evaluating {policy} on {endpoint} (run id {task_id})")
        try:
            # gmp eval's flags with the endpoint as --url, the online token and the task id as
            # run id; the --ca-cert given for the service is trusted for its endpoint too.
            cfg = eval_config(console, EvalFlags.of(locals()), url=build_base_url(endpoint),
                              token=online_token, ca_cert=ca_cert, run_id=task_id)
            rc = eval_exit_code(cfg, evaluate(cfg, console, policy_given=policy is not None, as_json=as_json))
        except BaseException:
            if not keep:
                _stop(client, task_id, endpoint, console)
            raise
        if keep:
            console.info(f"task {task_id} kept; stop it with: {stop_command(client, task_id, endpoint)}")
        elif not _stop(client, task_id, endpoint, console) and rc == 0:
            rc = int(ExitCode.REMOTE_ERROR)
        return int(rc)
