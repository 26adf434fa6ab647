"""What recording costs the client: CPU per recorded step and job wall time, the whole process tree.

The same job three ways, side by side: ``gmp eval --no-record``, ``--transcode inline`` (x264 after
each episode: what gmp did before) and ``--transcode deferred`` (the default: the JPEG frames as
received become each camera's frame store, no encoder). lift2 (4 JPEG cameras: 2 x 640x480 +
2 x 1280x720), the zero policy, the testbed in its own process (its CPU is not counted). Client CPU
= user + system time of ``gmp eval`` and every child it waited for (ffmpeg included:
``RUSAGE_CHILDREN`` around the subprocess); wall time = until the process exits, i.e. until its
recordings are complete. Then with 8 workers; then the cost of an on-demand video, the first open of
the episode in ``gmp viz`` (page + first frame of every camera, and the Rerun replay's build), raw
frames' one encoding, and the stream-copied MJPEG-in-Matroska alternative to the frame store.

Usage: ``python bench/recording_cost.py [--steps N] [--episodes N] [--viz-steps N]``; markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ServerProcess, cpu_s

ROBOT = "manip/lift2/R5a"
TASK = "testbed/all"


def _eval(url: str, results: Path, *, workers: int, episodes: int, mode: str) -> dict[str, float]:
    args = [sys.executable, "-m", "genmanip", "eval", "--url", url, "--policy", "zero",
            "--worker-ids", ",".join(str(i) for i in range(workers)), "--max-episodes", str(episodes),
            "--results-dir", str(results), "-q"]
    args += ["--no-record"] if mode == "off" else ["--transcode", mode]
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("GENMANIP_RESULT_DIR", None)
    cpu0, t0 = cpu_s(own=False), time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600, check=False)
    wall, cpu = time.perf_counter() - t0, cpu_s(own=False) - cpu0
    if p.returncode != 0:
        raise SystemExit(f"gmp eval ({mode}) failed: {p.stderr[-1500:]}")
    steps = sum(len(f.read_text().splitlines()) for f in results.rglob("steps.jsonl")) if mode != "off" else None
    return {"wall": wall, "cpu": cpu, "steps": float(steps or 0)}


def _job(steps: int, episodes: int, workers: int, tmp: Path) -> list[tuple[str, dict[str, float]]]:
    out = []
    for mode in ("off", "inline", "deferred"):  # a fresh server (and job) each: the same episodes
        with ServerProcess(robot=ROBOT, tasks=(TASK,), num_steps=steps, results_root=tmp / f"srv-{workers}-{mode}") as url:
            r = _eval(url, tmp / f"res-{workers}-{mode}", workers=workers, episodes=episodes, mode=mode)
        out.append((mode, r))
    n = max(r["steps"] for _, r in out)
    for _, r in out:
        r["steps"] = r["steps"] or n
    return out


def _table(title: str, rows: list[tuple[str, dict[str, float]]]) -> None:
    base = dict(rows)["off"]
    print(f"\n## {title}\n")
    print("| recording | job wall time | x --no-record | client CPU (process tree) | CPU per step |")
    print("|---|---:|---:|---:|---:|")
    names = {"off": "`--no-record`", "inline": "`--transcode inline` (before)", "deferred": "`--transcode deferred` (default)"}
    for mode, r in rows:
        print(f"| {names[mode]} | {r['wall']:.2f} s | {r['wall'] / base['wall']:.2f} | {r['cpu']:.2f} s | "
              f"{1000 * r['cpu'] / r['steps']:.1f} ms |")


def _viz_first_open(tmp: Path, steps: int) -> list[tuple[str, str]]:
    from genmanip_results.discovery import find_runs
    from genmanip_results.frames import ensure_video, episode_streams
    from genmanip_viz.recording import build_recording

    res = tmp / "viz"
    with ServerProcess(robot=ROBOT, tasks=(TASK,), num_steps=steps, results_root=tmp / "srv2") as url:
        _eval(url, res, workers=1, episodes=1, mode="deferred")
    run = find_runs(res)[0]
    ep = run.episodes[0]
    streams = episode_streams(ep.path)
    n = len((Path(ep.path) / "steps.jsonl").read_text().splitlines())
    size = sum(s.store.stat().st_size for s in streams.values() if s.store)
    rows = [("episode", f"{n} steps, {len(streams)} cameras, frame stores {size / 2**20:.1f} MiB")]
    from genmanip_viz.server import VizServer

    with VizServer(res, warm=False) as srv:
        import re

        t0 = time.perf_counter()
        runs = urllib.request.urlopen(srv.base_url + "/", timeout=60).read().decode()
        while "/run/" not in runs:  # the first scan
            time.sleep(0.2)
            runs = urllib.request.urlopen(srv.base_url + "/", timeout=60).read().decode()
        key = re.search(r'href="/run/([0-9a-f]+)', runs)
        assert key, "no run link"
        html = urllib.request.urlopen(srv.base_url + f"/run/{key.group(1)}", timeout=60).read().decode()
        m = re.search(r'href="(/episode/[^"]+)"', html)
        assert m, "no episode link"
        page_url = srv.base_url + m.group(1)
        t1 = time.perf_counter()
        page = urllib.request.urlopen(page_url, timeout=60).read().decode()
        for src in re.findall(r'data-base="([^"]+)" data-tail="([^"]+)"', page):
            urllib.request.urlopen(srv.base_url + src[0] + "0" + src[1], timeout=60).read()
        t2 = time.perf_counter()
    rows.append(("gmp viz: episode page + frame 0 of every camera (first open)", f"{t2 - t1:.3f} s (target <= 2 s)"))
    rows.append(("(runs + run page before it, first scan)", f"{t1 - t0:.3f} s"))
    t0 = time.perf_counter()
    rrd = build_recording(ep, force=True)
    rows.append(("Rerun replay build from the JPEG frames (EncodedImage)",
                 f"{time.perf_counter() - t0:.2f} s, {rrd.stat().st_size / 2**20:.1f} MiB"))
    cpu0, t0 = cpu_s(own=False), time.perf_counter()
    for cam in streams:
        ensure_video(ep.path, cam)
    mp4 = sum((ep.path / f"{c}.mp4").stat().st_size for c in streams)
    rows.append(("on-demand H.264 of all cameras (ensure_video, x264 ultrafast)",
                 f"{time.perf_counter() - t0:.2f} s wall, {cpu_s(own=False) - cpu0:.2f} s CPU, {mp4 / 2**20:.1f} MiB"))
    # The alternative store: MJPEG stream-copied into Matroska (ffmpeg -c copy), per episode.
    from genmanip_results.frames import FrameStore
    from genmanip_results.video import ffmpeg_executable

    cpu0, t0 = cpu_s(own=False), time.perf_counter()
    for cam, s in streams.items():
        assert s.store is not None
        with FrameStore(s.store) as st:
            p = subprocess.Popen([ffmpeg_executable(), "-nostdin", "-loglevel", "error", "-y", "-f", "image2pipe",
                                  "-c:v", "mjpeg", "-i", "pipe:0", "-c", "copy", str(tmp / f"{cam}.mkv")],
                                 stdin=subprocess.PIPE)
            assert p.stdin is not None
            for f in st:
                p.stdin.write(f)
            p.stdin.close()
            p.wait()
    rows.append(("alternative: MJPEG-in-Matroska (-c copy) of all cameras",
                 f"{time.perf_counter() - t0:.2f} s wall, {cpu_s(own=False) - cpu0:.2f} s CPU "
                 "(the frame store: a rename, 0 s)"))
    return rows


def _raw_cost() -> list[tuple[str, str]]:
    import io

    import numpy as np
    from genmanip_protocol.codec import decode_jpeg, encode_jpeg
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = []
    for h, w in ((480, 640), (720, 1280)):
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.clip(np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1) + rng.normal(0, 2, (h, w, 3)), 0, 255).astype(np.uint8)
        for name, fn in (("JPEG q95 (stored)", lambda a: encode_jpeg(a, quality=95)),
                         ("JPEG q85 (the server's)", lambda a: encode_jpeg(a, quality=85)),
                         ("PNG (lossless)", lambda a: _png(a, Image, io))):
            t0 = time.perf_counter()
            for _ in range(5):
                data = fn(img)
            ms = 1000 * (time.perf_counter() - t0) / 5
            extra = ""
            if name.startswith("JPEG"):
                err = np.abs(decode_jpeg(data).astype(np.int16) - img).mean()
                extra = f", mean abs error {err:.2f}"
            rows.append((f"raw {w}x{h} -> {name}", f"{ms:.1f} ms, {len(data) / 1024:.0f} KiB{extra}"))
    return rows


def _png(a, Image, io):  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps per episode (default 200)")
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8, help="workers of the second job (default 8)")
    ap.add_argument("--viz-steps", type=int, default=600)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gmp-bench-rec-") as d:
        tmp = Path(d)
        one = _job(args.steps, args.episodes, 1, tmp)
        _table(f"1 worker, {args.episodes} episodes x {args.steps} steps (lift2, 4 JPEG cameras)", one)
        many = _job(args.steps, max(args.episodes, args.workers), args.workers, tmp)
        _table(f"{args.workers} workers, {max(args.episodes, args.workers)} episodes x {args.steps} steps", many)
        print("\n## On demand, viz, raw frames\n")
        print("| measurement | figure |")
        print("|---|---|")
        for k, v in _viz_first_open(tmp, args.viz_steps) + _raw_cost():
            print(f"| {k} | {v} |")
        d_one = dict(one)
        cpu_ms = 1000 * d_one["deferred"]["cpu"] / d_one["deferred"]["steps"]
        off_ms = 1000 * d_one["off"]["cpu"] / d_one["off"]["steps"]
        ratio = d_one["deferred"]["wall"] / d_one["off"]["wall"]
        print(f"\nDefault (deferred): {cpu_ms:.1f} ms client CPU per step ({cpu_ms - off_ms:+.1f} ms over "
              f"--no-record; target <= 5 ms), wall {ratio:.2f}x --no-record (target <= 1.1x).")
        print(json.dumps({"deferred_cpu_ms_per_step": round(cpu_ms, 2), "wall_ratio": round(ratio, 3)}),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
