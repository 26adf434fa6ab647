"""Ray's overhead: the same job through ``--launcher local`` and ``--launcher ray``, side by side.

The zero-idle bench's setting (bench/zero_idle.py): the testbed in its own process
(``testbed/reach``, ``--num-steps 30``, ``latency=48ms`` on every eval route, no server saving),
8 workers, no recording, the synthetic GPU-like batched policy (30 ms + 2 ms x batch, a sleep).
Rows: the local launcher (the asynchronous runner in this process, one model copy) and the Ray
launcher on a local Ray instance (2 eval actors x 4 workers, one policy replica batching across
both, the driver in this process). Ray is started once, before the rows (a cluster is up before a
run). Each row runs ``--episodes`` episodes; reported: steps/s over the whole ``run_eval`` (actor
start-up and policy load included) and in steady state (first to last step), best of
``--repeats``, rows alternating.

Usage: ``python bench/ray_launcher.py [--episodes N] [--num-steps N] [--repeats N]``; prints markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the policies module (Ray's workers: PYTHONPATH)

from _common import ServerProcess
from genmanip_eval import EvalConfig, run_eval
from genmanip_runtime.transport import HttpTransport

HERE = Path(__file__).resolve().parent
LATENCY = "48ms"
WORKERS, ACTORS = 8, 2


def _new_job(url: str) -> None:
    with HttpTransport(url) as http:
        body = json.dumps({"data": {"config_path": ["testbed/reach"],
                                    "run_id": f"ray-bench-{uuid.uuid4().hex[:8]}"}}).encode()
        http.request("POST", "/start_new_job", body=body, content_type="application/json",
                     timeout=60.0).raise_for_status()


def _run(url: str, launcher: str, episodes: int, frames: str) -> tuple[float, float, dict[str, Any] | None]:
    """(steps/s of the whole run, steady-state steps/s, batch stats)."""
    _new_job(url)
    times: list[float] = []
    steps = [0]

    def emit(kind: str, payload: dict[str, Any]) -> None:
        if kind == "steps":
            steps[0] += int(payload["n"])
            times.append(time.perf_counter())

    cfg = EvalConfig(url=url, worker_ids=[str(i) for i in range(WORKERS)], policy="_zero_idle_policies:gpu",
                     record=False, max_episodes=episodes, launcher=launcher, frames=frames,
                     launcher_options={"workers_per_actor": WORKERS // ACTORS} if launcher == "ray" else {})
    t0 = time.perf_counter()
    summary = run_eval(cfg, emit=emit)
    wall = time.perf_counter() - t0
    span = max(1e-9, times[-1] - times[0]) if len(times) > 1 else 1e-9
    return summary.steps / wall, (steps[0] - 1) / span, summary.batching


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32, help="episodes per row (default: 32)")
    ap.add_argument("--num-steps", type=int, default=30, help="steps per episode (default: 30)")
    ap.add_argument("--frames", default="jpeg", choices=("jpeg", "raw"),
                    help="camera frames of both rows (default: jpeg, what a recording run uses)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per row, best kept (default: 2)")
    opts = ap.parse_args(argv)
    import ray

    paths = [str(HERE), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    t_init = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}})
    init_s = time.perf_counter() - t_init
    conf = {"tasks": ("testbed/reach",), "num_steps": opts.num_steps, "capacity": 2 * WORKERS,
            "save_process": False, "faults": f"latency={LATENCY}"}
    best: dict[str, list[float]] = {"local": [0.0, 0.0], "ray": [0.0, 0.0]}
    batching: dict[str, Any] = {}
    try:
        with ServerProcess(**conf) as url:
            for _ in range(max(1, opts.repeats)):
                for launcher in ("local", "ray"):
                    whole, steady, b = _run(url, launcher, opts.episodes, opts.frames)
                    best[launcher] = [max(best[launcher][0], whole), max(best[launcher][1], steady)]
                    batching[launcher] = b
    finally:
        ray.shutdown()
    bound = WORKERS / (0.048 + (30 + 2 * WORKERS) / 1000.0)
    print(f"{WORKERS} workers, testbed/reach, {opts.num_steps} steps/episode, latency={LATENCY}, "
          f"{opts.episodes} episodes per row, best of {opts.repeats}, {opts.frames} frames; GPU-like policy 30 ms + 2 ms x batch; "
          f"bound {bound:.1f} steps/s; ray.init {init_s:.1f} s (not in the rows)\n")
    print("| launcher | steps/s (whole run) | steps/s (steady state) | steady vs local | mean batch |")
    print("|---|---:|---:|---:|---:|")
    for name, key in (("local (async runner, 1 process)", "local"),
                      (f"ray ({ACTORS} actors x {WORKERS // ACTORS} workers, 1 replica)", "ray")):
        whole, steady = best[key]
        ratio = steady / max(1e-9, best["local"][1])
        mb = (batching.get(key) or {}).get("mean_batch")
        print(f"| {name} | {whole:.1f} | {steady:.1f} | {ratio:.2f} | {f'{mb:.1f}' if mb is not None else '-'} |")
    overhead = 1.0 - best["ray"][1] / max(1e-9, best["local"][1])
    print(f"\nRay's overhead in steady state: {100 * overhead:.1f}% of steps/s (target <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
