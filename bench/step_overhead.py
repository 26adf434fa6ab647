"""Client-side per-step overhead of the eval loop, side by side in one run.

Everything the client spends per step except server time and policy time, for a lift2 observation
(4 cameras: 2 x 480x640 + 2 x 720x1280), against the testbed on 127.0.0.1 (server saving off, a
constant action so the server's frame cache keeps its own cost low and steady). Server time is
subtracted per request using the testbed's ``X-Genmanip-Server-Ms`` header.

Rows:

* ``baseline (reference hot path)``: what the public client does per step: a new connection per
  request (``requests.post``), the pickle reply read whole, every ``numpy_array`` base64-decoded,
  every camera JPEG decoded eagerly (Pillow), and a deep copy of the observation for recording.
  (The unpickle goes through the allow-list here too: this benchmark never unpickles blindly.)
* ``EvalClient legacy``: this client on the same pickle wire (keep-alive, lazy JPEG).
* ``EvalClient msgpack``: this client on the msgpack wire, raw frames (loopback default).
* ``raw socket floor (msgpack)``: a hand-written HTTP/1.1 exchange on one socket sending the same
  pre-encoded body and reading the reply bytes, no decoding at all.

Then steps/s of this client with recording off and on (msgpack + JPEG frames both times, so the
server work is identical; recording writes steps.jsonl, frame files and mp4s in the background).

Usage: ``python bench/step_overhead.py [--steps N]``; prints markdown tables.
"""

from __future__ import annotations

import argparse
import base64
import copy
import io
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from _common import ServerProcess
from genmanip_eval import EvalClient, Recorder, ZeroPolicy
from genmanip_protocol.codec import MsgpackCodec, safe_loads

ROBOT = "manip/lift2/R5a"


def _server_ms(headers: Any) -> float:
    v = headers.get("X-Genmanip-Server-Ms") or headers.get("x-genmanip-server-ms")
    return float(v) if v is not None else 0.0


def _eager_untag(node: Any) -> Any:
    if isinstance(node, dict):
        t = node.get("type")
        if t == "numpy_array":
            raw = base64.b64decode(node["data"])
            return np.frombuffer(raw, dtype=node["dtype"]).reshape(node["shape"]).copy()
        if t == "jpeg_bytes":
            from PIL import Image

            return np.asarray(Image.open(io.BytesIO(node["data"])).convert("RGB"))
        return {k: _eager_untag(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_eager_untag(v) for v in node]
    return node


def bench_baseline(url: str, action: dict[str, Any], steps: int) -> list[float]:
    import pickle

    import requests

    out: list[float] = []
    body = pickle.dumps({"0": action}, protocol=pickle.HIGHEST_PROTOCOL)
    for _ in range(steps):
        t0 = time.perf_counter()
        r = requests.post(url + "/step", data=body,
                          headers={"Content-Type": "application/octet-stream"}, timeout=600)
        r.raise_for_status()
        data = safe_loads(r.content)
        obs = _eager_untag(data["0"]["obs"])
        _record = copy.deepcopy(obs)
        dt = (time.perf_counter() - t0) * 1000
        out.append(dt - _server_ms(r.headers))
    return out


def bench_client(url: str, codec: str, steps: int, *, frames: str = "auto") -> tuple[list[float], float]:
    pol = ZeroPolicy()
    out = []
    # kill_on_close=False: the worker stays mid-episode for the next measurement.
    with EvalClient(url, ["0"], codec=codec, frames=frames, kill_on_close=False) as c:
        e = c.reset()
        action = pol.get_action(e["0"]["obs"])
        t_start = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            e, _ = c.step(action)
            dt = (time.perf_counter() - t0) * 1000
            out.append(dt - (c.timing("0").server_ms or 0.0))
        rate = steps / (time.perf_counter() - t_start)
    return out, rate


def bench_raw_socket(url: str, action: dict[str, Any], steps: int) -> list[float]:
    parts = urlsplit(url)
    body = MsgpackCodec().encode({"0": action})
    head = (
        f"POST /step HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
        "Content-Type: application/x-genmanip-msgpack\r\nX-Genmanip-Frames: raw\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    req = head + body
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = sock.makefile("rb")
    out = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            sock.sendall(req)
            status = f.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"raw floor: unexpected reply {status!r}")
            length = 0
            server = 0.0
            while True:
                line = f.readline()
                if line in (b"\r\n", b""):
                    break
                k, _, v = line.decode().partition(":")
                if k.lower() == "content-length":
                    length = int(v)
                elif k.lower() == "x-genmanip-server-ms":
                    server = float(v)
            f.read(length)
            out.append((time.perf_counter() - t0) * 1000 - server)
    finally:
        f.close()
        sock.close()
    return out


def bench_recording(url: str, steps: int, record: bool) -> float:
    pol = ZeroPolicy()
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(Path(d)) if record else None
        with EvalClient(url, ["0"], codec="msgpack", frames="jpeg", listener=rec) as c:
            e = c.reset()
            t0 = time.perf_counter()
            n = 0
            while n < steps and not c.done:
                e, _ = c.step(pol.get_action(e["0"]["obs"]))
                n += e["0"]["executed_steps"]
            rate = n / (time.perf_counter() - t0)
        if rec is not None:
            rec.close()
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    n = args.steps
    rows = []
    with tempfile.TemporaryDirectory() as root:
        # One long episode per measurement: no resets inside the timed loop.
        with ServerProcess(robot=ROBOT, tasks=("testbed/smoke",), num_steps=100_000, results_root=root) as url:
            action = ZeroPolicy().get_action({"robot_id": ROBOT})
            with EvalClient(url, ["0"], kill_on_close=False) as c:  # warm the frame cache
                c.reset()
                for _ in range(5):
                    c.step(action)
            cpu: dict[str, float] = {}

            def timed(key: str, fn: Any, *a: Any) -> Any:
                c0 = time.process_time()
                r = fn(*a)
                cpu[key] = (time.process_time() - c0) * 1000 / n
                return r

            base = timed("base", bench_baseline, url, action, n)
            legacy, _ = timed("legacy", bench_client, url, "legacy", n)
            msgp, _ = timed("msgpack", bench_client, url, "msgpack", n)
            raw = timed("raw", bench_raw_socket, url, action, n)
        med = {k: statistics.median(v) for k, v in
               {"base": base, "legacy": legacy, "msgpack": msgp, "raw": raw}.items()}
        rows = [
            ("baseline (reference hot path: requests.post, pickle+base64, eager JPEG, deepcopy)", "base"),
            ("EvalClient legacy (pickle wire, keep-alive, lazy JPEG)", "legacy"),
            ("EvalClient msgpack (raw frames)", "msgpack"),
            ("raw socket floor (msgpack bytes, no decode)", "raw"),
        ]
        # Alternate off/on a few times and keep each one's best: the machine's load drifts.
        offs, ons = [], []
        for i in range(3):
            for record, acc in ((False, offs), (True, ons)):
                with ServerProcess(robot=ROBOT, tasks=("testbed/smoke",), num_steps=100,
                                   results_root=f"{root}/rec{i}{int(record)}") as url:
                    acc.append(bench_recording(url, n, record=record))
        off, on = max(offs), max(ons)

    print(f"## Client-side per-step overhead (lift2, 4 cameras, {n} steps each)\n")
    print("Client CPU = CPU time of the client process per step (the server runs in another process);")
    print("wall = median request wall time minus the server's own handling time (X-Genmanip-Server-Ms),")
    print("which still contains the server's socket write and any scheduling noise.\n")
    print("| client | client CPU ms/step | x baseline | x raw floor | wall overhead ms/step |")
    print("|---|---:|---:|---:|---:|")
    for name, key in rows:
        print(f"| {name} | {cpu[key]:.2f} | {cpu[key] / cpu['base']:.2f} | {cpu[key] / cpu['raw']:.2f} "
              f"| {med[key]:.2f} |")
    print()
    r_legacy = cpu["base"] / cpu["legacy"]
    r_msgpack = cpu["msgpack"] / cpu["raw"]
    print(f"Targets (client CPU): legacy >= 3x lower than baseline: {r_legacy:.1f}x "
          f"({'met' if r_legacy >= 3 else 'NOT met'}); msgpack within 2x of the raw floor: "
          f"{r_msgpack:.2f}x ({'met' if r_msgpack <= 2 else 'NOT met'}).\n")
    print("## Recording cost (msgpack + JPEG frames, episodes of 100 steps, steps/s incl. server, best of 3)\n")
    print("| recording | steps/s | relative |")
    print("|---|---:|---:|")
    print(f"| off | {off:.1f} | 1.00 |")
    print(f"| on | {on:.1f} | {on / off:.2f} |")
    cost = 1 - on / off
    print(f"\nRecording costs {100 * cost:.1f}% of steps/s (target <= 10%: {'met' if cost <= 0.10 else 'NOT met'}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
