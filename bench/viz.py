"""Benchmark: genmanip-viz recording builds and results-browser page latency.

* ``.genmanip_vis.rrd`` build time for a 600-step, 4-camera lift2 episode (client layout, wrist
  cameras 640x480, top/overlook 1280x720, H.264 as ``gmp eval`` records them). Target < 2 s. Also the
  recording's size next to the source videos (they go in once, as video assets).
* Runs page latency with 200 runs x 50 episodes on disk (client layout, no videos needed): the first
  request (first scan) and the median of later requests (target < 300 ms after the first scan), over
  real HTTP to a running ``VizServer``.

Usage: python bench/viz.py [--steps 600] [--runs 200] [--episodes 50] [--workdir DIR]
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def synth_episode(root: Path, steps: int) -> Path:
    from genmanip_results.testing import write_client_run

    cams = {
        "left_camera": (640, 480),
        "right_camera": (640, 480),
        "top_camera": (1280, 720),
        "overlook_camera": (1280, 720),
    }
    run = write_client_run(
        root, "ebench", "bench", tasks={"ebench/lift2/pick": [1.0]}, steps=steps, cameras=cams
    )
    return run / "ebench/lift2/pick/0"


def time_build(ep_dir: Path, repeats: int) -> tuple[float, int, int]:
    from genmanip_results.discovery import load_episode
    from genmanip_viz.recording import build_recording

    ep = load_episode(ep_dir)
    build_recording(ep, force=True)  # warm: imports, page cache
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = build_recording(ep, force=True)
        best = min(best, time.perf_counter() - t)
    src = sum(p.stat().st_size for p in ep_dir.glob("*.mp4"))
    return best, out.stat().st_size, src


def synth_tree(root: Path, runs: int, episodes: int) -> None:
    """``runs`` client-layout runs of ``episodes`` complete episodes each (steps.jsonl + result.json),
    written directly (10k episodes: no videos, one-row steps files)."""
    for r in range(runs):
        run_dir = root / f"bench{r % 4}" / f"run_{r:04d}"
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(
            json.dumps(
                {
                    "run_id": run_dir.name,
                    "benchmark": run_dir.parent.name,
                    "start": 1.7e9 + r,
                    "total_episodes": episodes,
                }
            )
        )
        for e in range(episodes):
            task = f"ebench/suite{e % 3}/task{e % 10}"
            seed = str(e // 10)
            ep = run_dir / task / seed
            ep.mkdir(parents=True, exist_ok=True)
            score = float((r + e) % 3 == 0)
            (ep / "steps.jsonl").write_text(
                json.dumps({"step": 0, "frame": None, "state": None, "action": None}) + "\n"
            )
            (ep / "result.json").write_text(
                json.dumps(
                    {
                        "episode_id": f"{run_dir.parent.name}/{run_dir.name}/{task}/{seed}",
                        "task_name": task,
                        "seed": seed,
                        "score": score,
                        "sr": score,
                        "steps": 1,
                        "instruction": "pick",
                    }
                )
            )


def time_pages(root: Path, samples: int) -> tuple[float, float, float, int]:
    import requests
    from genmanip_viz.server import VizServer

    with VizServer(root, scan_interval=2.0) as s:
        sess = requests.Session()
        t = time.perf_counter()
        r = sess.get(s.base_url + "/", timeout=600)
        first = time.perf_counter() - t
        assert r.status_code == 200
        s.app.state.viz.index.wait_for_scan(timeout=600)  # type: ignore[attr-defined]
        lat = []
        for _ in range(samples):
            t = time.perf_counter()
            r = sess.get(s.base_url + "/", timeout=60)
            lat.append(time.perf_counter() - t)
            assert r.status_code == 200
            time.sleep(0.05)
        n_rows = r.text.count("<tr>") - 1
        key = r.text.split('href="/run/', 1)[1].split('"', 1)[0]
        run_lat = []
        for _ in range(samples):
            t = time.perf_counter()
            assert sess.get(f"{s.base_url}/run/{key}", timeout=60).status_code == 200
            run_lat.append(time.perf_counter() - t)
        return first, statistics.median(lat), statistics.median(run_lat), n_rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gmp-bench-viz-") as tmp:
        work = a.workdir or Path(tmp)
        ep = synth_episode(work / "episode", a.steps)
        build_s, rrd_size, src_size = time_build(ep, a.repeats)
        synth_tree(work / "tree", a.runs, a.episodes)
        first, runs_med, run_med, n_rows = time_pages(work / "tree", a.samples)
    mb = 1024 * 1024
    print(
        f"| measurement ({a.steps}-step 4-camera lift2 episode; {a.runs} runs x {a.episodes} episodes) | gmp viz | target | ratio to target |"
    )
    print("|---|---|---|---|")
    print(f"| `.rrd` build (best of {a.repeats}) | {build_s:.2f} s | < 2 s | {build_s / 2:.2f} |")
    print(
        f"| `.rrd` size vs source mp4s | {rrd_size / mb:.1f} MiB vs {src_size / mb:.1f} MiB | ~1x (videos stored once) | {rrd_size / max(src_size, 1):.2f} |"
    )
    print(
        f"| runs page, first request (includes first scan of {a.runs * a.episodes} episodes) | {first * 1000:.0f} ms | - | - |"
    )
    print(
        f"| runs page after the first scan (median of {a.samples}, {n_rows} rows) | {runs_med * 1000:.0f} ms | < 300 ms | {runs_med / 0.3:.2f} |"
    )
    print(
        f"| run page, {a.episodes} episodes (median of {a.samples}) | {run_med * 1000:.0f} ms | < 300 ms | {run_med / 0.3:.2f} |"
    )


if __name__ == "__main__":
    main()
