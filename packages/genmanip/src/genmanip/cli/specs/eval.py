"""``gmp eval``, ``gmp submit``, ``gmp status``, ``gmp demo`` (genmanip-eval; demo in the meta package)."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_connection_flags, add_flag, add_replaced

__all__ = ["add_eval_flags", "register"]

_DIST = "genmanip-eval"


def add_eval_flags(parser: argparse.ArgumentParser, *, connection: bool = True) -> None:
    """The flags of ``gmp eval``; ``gmp online run`` reuses them with ``connection=False``."""
    if connection:
        add_connection_flags(parser, token_env="GMP_TOKEN", config_section="eval")  # noqa: S106 - an env var name
    run = parser.add_argument_group("run")
    add_flag(run, "--run-id", aliases=["--run_id"], metavar="ID", default=None,
             help="run id on the server (default: the server's current job)")
    add_flag(run, "--worker-ids", aliases=["--worker_ids"], metavar="IDS", default="0",
             help="comma-separated worker ids driven by this client (default: %(default)s)")
    add_flag(run, "--processes", metavar="N", type=int, default=1,
             help="client processes; worker ids are split between them (default: %(default)s)")
    add_flag(run, "--json", dest="as_json", action="store_true", default=False,
             help="print the final summary as JSON on stdout (per task and overall: n, successes, "
                  "SR with its Wilson 95%% interval, mean score) instead of the table")
    add_flag(run, "--allow-policy-change", aliases=["--allow_policy_change"], action="store_true",
             default=False, help="resume a run (--run-id) with another policy or policy args than it "
                                 "was recorded with (refused otherwise; run.json keeps each "
                                 "invocation in 'segments')")
    add_flag(run, "--max-episodes", metavar="N", type=int, default=None,
             help="stop after N finished episodes (default: until the server's job is done)")
    add_flag(run, "--max-recoveries", metavar="N", type=int, default=5,
             help="failed requests in a row one worker recovers from (finding out whether it ran; "
                  "restarting the episode when unsure) before the run stops; 0 stops at the first "
                  "(default: %(default)s)")

    policy = parser.add_argument_group("policy")
    add_flag(policy, "--policy", metavar="SPEC", default=None,
             help="pkg.module:factory, a name from the genmanip.policies entry points (zero, expert "
                  "from genmanip-testbed, your own), or ws://HOST:PORT (a policy server); required "
                  "against a real server (the testbed runs zero without one)")
    add_flag(policy, "--policy-arg", aliases=["--policy_arg"], metavar="KEY=VALUE",
             action="append", default=[], help="argument for the policy factory (repeatable)")
    add_flag(policy, "--chunk-size", aliases=["--chunk_size"], metavar="N", type=int, default=1,
             help="actions per policy call (default: %(default)s)")
    add_flag(policy, "--step-chunk", aliases=["--step_chunk"], action="store_true", default=False,
             help="send a whole chunk per request (/step_chunk) instead of one /step per action")
    add_flag(policy, "--runner", choices=["async", "lockstep"], default="async",
             help="async: each worker steps on its own connection and the policy gets one call per "
                  "batch of ready observations; lockstep: the reference loop, every worker's call in "
                  "turn, then one /step for all (default: %(default)s)")
    add_flag(policy, "--max-batch", aliases=["--max_batch"], metavar="N", type=int, default=None,
             help="largest batch of observations per policy call (default: the number of workers, "
                  "at most 32)")
    add_flag(policy, "--max-wait-ms", aliases=["--max_wait_ms"], metavar="MS", type=float,
             default=None, help="the longest an idle policy waits for workers that are due to "
                                "join its batch (default: 200 for a batched policy, 0 for a "
                                "per-worker one)")

    scale = parser.add_argument_group("scale-out")
    add_flag(scale, "--launcher", metavar="NAME", default="local",
             help="where worker groups run: local (this machine's processes and threads) or ray "
                  "(a Ray cluster; needs genmanip-ray) (default: %(default)s)")
    add_flag(scale, "--ray-address", aliases=["--ray_address"], metavar="ADDR", default=None,
             help="with --launcher ray: auto, ray://HOST:PORT, or none to start a local Ray "
                  "(default: auto when a cluster runs, else local)")
    add_flag(scale, "--workers-per-actor", aliases=["--workers_per_actor"], metavar="K", type=int,
             default=None, help="with --launcher ray: worker ids each eval actor drives (default: 4)")
    add_flag(scale, "--policy-replicas", aliases=["--policy_replicas"], metavar="N", type=int,
             default=None, help="with --launcher ray: policy replica actors (default: 1)")
    add_flag(scale, "--gpus-per-replica", aliases=["--gpus_per_replica"], metavar="F", type=float,
             default=None, help="with --launcher ray: GPUs per policy replica; 0.5 puts two on one "
                                "GPU (default: 0)")
    add_flag(scale, "--cpus-per-replica", aliases=["--cpus_per_replica"], metavar="C", type=float,
             default=None, help="with --launcher ray: CPUs per policy replica (default: 1)")

    cmp = parser.add_argument_group("comparison")
    add_flag(cmp, "--compare-to", aliases=["--compare_to"], metavar="RUN", default=None,
             help="a recorded run (directory or run id) to compare with as episodes finish, "
                  "paired on (task, seed), by an anytime-valid sequential test (see gmp compare)")
    add_flag(cmp, "--stop-when-decided", aliases=["--stop_when_decided"], action="store_true",
             default=False, help="with --compare-to: stop once the test has decided (better, "
                                 "worse, or no difference larger than --delta)")
    add_flag(cmp, "--alpha", metavar="A", type=float, default=0.05,
             help="level of the sequential test (default: %(default)s)")
    add_flag(cmp, "--delta", metavar="D", type=float, default=None,
             help="the margin of 'no difference larger than D' (default: 0.1)")

    robot = parser.add_argument_group("robot")
    add_flag(robot, "--robot", aliases=["--robot_id", "--robot-id"], metavar="ID", default=None,
             help="robot id, e.g. manip/lift2/R5a (default: from the server)")
    add_flag(robot, "-a", "--arm-type", aliases=["--arm_type"], metavar="ARM", default=None,
             help="legacy robot selection: franka, aloha, r5a")
    add_flag(robot, "-g", "--gripper-type", aliases=["--gripper_type"], metavar="GRIPPER",
             default=None, help="legacy robot selection: panda_hand, robotiq, piper, lift2")
    add_flag(robot, "-c", "--control-type", aliases=["--control_type"],
             choices=["joint_position", "ee_pose"], default=None,
             help="control type of --policy zero's no-op actions (default: joint_position); "
                  "other policies choose their own")

    wire = parser.add_argument_group("wire")
    add_flag(wire, "--codec", choices=["auto", "msgpack", "legacy"], default="auto",
             help="wire codec; auto uses msgpack when the server offers it (default: %(default)s)")
    add_flag(wire, "--frames", choices=["auto", "raw", "jpeg"], default="auto",
             help="camera frames on the msgpack wire; auto = JPEG when recording or remote, "
                  "raw otherwise (default: %(default)s)")
    add_flag(wire, "--render-mode", aliases=["--render_mode"], choices=["lite", "always"],
             default=None, help="server render mode per step (default: the server's)")
    add_flag(wire, "--subframes", metavar="N", type=int, default=None,
             help="simulator subframes per step (default: the server's)")

    rec = parser.add_argument_group("recording")
    add_flag(rec, "--results-dir", aliases=["--results_dir"], metavar="DIR", default=None,
             help="results root (default: $GENMANIP_RESULT_DIR, else ./client_results)")
    # Reference spellings: --save_process / --no_save_process switch recording on / off.
    add_flag(rec, "--no-record", aliases=["--no_save_process", "--no-save-process"],
             dest="record", action="store_false", default=True,
             help="do not record steps and videos (recording is on by default)")
    add_flag(rec, "--record", aliases=["--save_process", "--save-process"], dest="record",
             action="store_true", default=True, help=argparse.SUPPRESS)
    add_flag(rec, "--transcode", choices=("deferred", "inline"), default="deferred",
             help="when the H.264 videos are made: deferred = keep the JPEG frames as received and "
             "make an mp4 when a viewer, plot or bundle needs one (or with gmp transcode); inline = "
             "x264 after each episode, ~40 ms of CPU per 4-camera step (default: %(default)s)")
    add_flag(rec, "--live-every", aliases=["--live_every"], metavar="N", type=int, default=0,
             help="publish a live preview frame every N steps; 0 = off (default: %(default)s)")
    add_replaced(rec, "--web_view", "--web-view",
                 replacement="watch a run live with gmp viz (gmp eval --live-every N publishes its "
                             "newest frames for the live view)")
    add_replaced(rec, "--web_view_port", "--web_view_interval", "--web_view_scale",
                 replacement="the live view is gmp viz (its --port); gmp eval --live-every N sets "
                             "how often frames are published", takes_value=True)
    add_flag(rec, "--plot-on-episode-end", aliases=["--plot_on_episode_end"],
             action="store_true", default=False,
             help="plot each episode when it ends (needs genmanip-artifacts)")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``eval``, ``submit``, ``status`` and ``demo``."""
    p = add_command(
        subparsers, "eval", handler="genmanip_eval.cli:run_eval", dist=_DIST,
        help="run a policy against a GenManip server and record the episodes",
        epilog="example:\n  gmp eval --url http://127.0.0.1:8087 --policy mypkg.policy:make "
               "--policy-arg ckpt=last.pt --worker-ids 0,1",
    )
    add_eval_flags(p)

    for name in ("analyse", "analyze"):
        a = add_command(
            subparsers, name, handler="genmanip.replaced:analyse", dist="genmanip", hidden=True,
            help="the reference client's analysis command (replaced)",
        )
        # Whatever follows (the reference's own flags, --run ...) is taken as words, so the
        # message names the replacements instead of "unrecognized arguments".
        a.prefix_chars = a._optionals.prefix_chars = "\x00"
        a.add_argument("args", nargs="*", help=argparse.SUPPRESS)

    p = add_command(
        subparsers, "submit", handler="genmanip_eval.cli:submit", dist=_DIST,
        help="start an evaluation job on a server from benchmark config files",
    )
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="benchmark config path(s)")
    add_flag(p, "--run-id", aliases=["--run_id"], metavar="ID", default=None,
             help="run id (default: a new timestamped id; an existing id resumes that run)")
    add_connection_flags(p, token_env="GMP_TOKEN", config_section="eval")  # noqa: S106 - an env var name

    p = add_command(
        subparsers, "status", handler="genmanip_eval.cli:status", dist=_DIST,
        help="show the server's job status and per-task results",
    )
    # dest as_json: a handler keyword named json would shadow the json module.
    add_flag(p, "--json", dest="as_json", action="store_true", default=False,
             help="print the raw status JSON on stdout")
    add_flag(p, "--watch", action="store_true", default=False,
             help="refresh until the job is done")
    add_flag(p, "--interval", metavar="SECONDS", type=float, default=2.0,
             help="refresh interval with --watch (default: %(default)s)")
    add_flag(p, "--run-id", aliases=["--run_id"], metavar="ID", default=None,
             help="warn when the server's current run is not this one")
    add_connection_flags(p, token_env="GMP_TOKEN", config_section="eval")  # noqa: S106 - an env var name

    p = add_command(
        subparsers, "demo", handler="genmanip.demo:run_demo", dist="genmanip",
        help="start a local testbed server, evaluate a policy on it and show the results",
    )
    add_flag(p, "--workers", metavar="N", type=int, default=4,
             help="worker ids to drive (default: %(default)s)")
    add_flag(p, "--processes", metavar="N", type=int, default=2,
             help="client processes the workers are spread over (default: %(default)s)")
    add_flag(p, "--tasks", metavar="CONFIG", default="testbed/reach",
             help="testbed task set (default: %(default)s)")
    add_flag(p, "--policy", metavar="SPEC", default="expert",
             help="policy to run (default: %(default)s)")
    add_flag(p, "--results-dir", aliases=["--results_dir"], metavar="DIR", default="gmp-demo",
             help="results root (default: ./%(default)s)")
