"""The viewer never serves a file outside its root through a symlink inside it, and its build
processes do not grow per build.

* Inputs that are symlinks out of the root (``result.json``, ``steps.jsonl``, a camera ``.mp4``,
  ``meta_record.pkl``, ``result_info.json``, ``episode.rrd``, ``run.json``, the viewer cache), in
  both layouts, present at scan time or swapped in after it: no route's body ever holds the
  secret's bytes, and no route crashes.
* 32 rebuilds in one process, and 32 builds through the server's pool: the thread count of the
  build process stays flat (it grew by four per build: rerun's blueprint stream was never
  disconnected, and dropped streams waited for an orphan sweep that never ran).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genmanip_results.discovery import find_runs, load_episode
from genmanip_results.testing import write_client_run, write_server_run
from genmanip_viz.recording import RRD_NAME, SIDECAR_NAME, build_recording, input_fingerprint
from genmanip_viz.server import RecordingPool, VizServer
from rerun.chunk import RrdReader

SECRET = b"TOPSECRET-viz-links-4f1c"


def _get(srv: VizServer, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", f"localhost:{srv.port}")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _relink(path: Path, target: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, viz_cache: Path) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("viz-links")
    outside = base / "outside"
    outside.mkdir()
    secret_json = outside / "secret.json"
    secret_json.write_bytes(json.dumps({"score": 1.0, "instruction": SECRET.decode(),
                                        "robot_id": SECRET.decode(), "run_id": SECRET.decode()}).encode())
    secret_rows = outside / "secret.jsonl"
    secret_rows.write_bytes(json.dumps({"step": 0, "robot_id": SECRET.decode()}).encode() + b"\n")
    secret_bin = outside / "secret.bin"
    secret_bin.write_bytes(SECRET * 64)
    root = base / "project"
    client = write_client_run(root / "client_results", "ebench", "links",
                              tasks={"ebench/t/a": [1.0] * 7}, steps=4)
    eps = {s: client / "ebench/t/a" / str(s) for s in range(7)}
    _relink(eps[0] / "result.json", secret_json)
    _relink(eps[1] / "steps.jsonl", secret_rows)
    _relink(eps[2] / "left_camera.mp4", secret_bin)
    # a forged viewer cache: the recording and a sidecar that claims it is fresh
    _relink(eps[3] / RRD_NAME, secret_bin)
    (eps[3] / SIDECAR_NAME).write_text(json.dumps(input_fingerprint(load_episode(eps[3]))))
    server = write_server_run(root, "ebench", "srvlinks", tasks={"ebench/k/d": [1.0] * 3}, steps=4)
    seps = {s: server / "ebench/k/d" / str(s) for s in range(3)}
    _relink(seps[0] / "meta_record.pkl", secret_bin)
    _relink(seps[1] / "result_info.json", secret_json)
    _relink(seps[2] / "episode.rrd", secret_bin)
    linked_run = write_client_run(root / "client_results", "ebench", "linkedmanifest",
                                  tasks={"ebench/t/b": [1.0]}, steps=3, videos=False)
    _relink(linked_run / "run.json", secret_json)
    with VizServer(root, warm=False, scan_interval=0.5, cache_dir=viz_cache) as srv:
        srv.app.state.viz.index.wait_for_scan()
        yield {"srv": srv, "client": eps, "server": seps, "outside": outside,
               "secrets": (secret_json, secret_rows, secret_bin)}


def _keys(srv: VizServer) -> dict[str, str]:
    _, body = _get(srv, "/")
    return {m.group(2): m.group(1) for m in re.finditer(r'href="/run/([0-9a-f]{12})">([^<]+)</a>', body.decode())}


def _routes(key: str, task: str, seeds: range) -> list[str]:
    out = [f"/run/{key}", f"/live/{key}", f"/run/{key}?failures=1"]
    for s in seeds:
        out += [f"/episode/{key}/{task}/{s}", f"/rrd/{key}/{task}/{s}/recording.rrd"]
    return out


def test_links_out_are_never_served(world: dict[str, Any]) -> None:
    srv: VizServer = world["srv"]
    keys = _keys(srv)
    assert {"links", "srvlinks"} <= set(keys)
    paths = ["/", *_routes(keys["links"], "ebench/t/a", range(7)),
             *_routes(keys["srvlinks"], "ebench/k/d", range(3))]
    if "linkedmanifest" in keys:
        paths += _routes(keys["linkedmanifest"], "ebench/t/b", range(1))
    leaks, statuses = [], {}
    for path in paths:
        status, body = _get(srv, path)
        statuses[path] = status
        if SECRET in body:
            leaks.append(f"{status} {path}")
    assert not leaks, leaks
    assert all(s in (200, 404) for s in statuses.values()), statuses
    # the episodes whose other files are fine still play: the linked video is simply not there
    assert statuses[f"/rrd/{keys['links']}/ebench/t/a/2/recording.rrd"] == 200
    assert statuses[f"/rrd/{keys['srvlinks']}/ebench/k/d/2/recording.rrd"] in (200, 404)
    # the forged cache was replaced by a real build (the link itself, not its target)
    assert not world["client"][3].joinpath(RRD_NAME).is_symlink()
    assert world["secrets"][2].read_bytes() == SECRET * 64


@pytest.mark.parametrize("name", ["steps.jsonl", "left_camera.mp4", RRD_NAME])
def test_inputs_swapped_for_links_after_the_scan_are_never_served(
    world: dict[str, Any], name: str
) -> None:
    """The index holds the episode from its scan; then the file becomes a symlink out. Checked
    where each file is opened, not where it was listed."""
    srv: VizServer = world["srv"]
    key = _keys(srv)["links"]
    seed = {"steps.jsonl": 4, "left_camera.mp4": 5, RRD_NAME: 6}[name]
    ep = world["client"][seed]
    status, body = _get(srv, f"/rrd/{key}/ebench/t/a/{seed}/recording.rrd")  # builds it
    assert status == 200 and SECRET not in body
    secret = world["secrets"][1] if name == "steps.jsonl" else world["secrets"][2]
    _relink(ep / name, secret)
    if name != RRD_NAME:
        (ep / RRD_NAME).unlink()  # force a rebuild from the swapped input
    for path in (f"/episode/{key}/ebench/t/a/{seed}", f"/rrd/{key}/ebench/t/a/{seed}/recording.rrd"):
        status, body = _get(srv, path)
        assert SECRET not in body, (path, status)
        assert status in (200, 404, 500), (path, status)  # 500: the typed build error page
        if status == 500:
            assert b"outside the results root" in body or b"cannot read" in body


def _threads() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/task"))


def test_rebuilds_keep_threads_bounded(tmp_path: Path) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0]}, steps=4)
    episode = load_episode(run / "t/a/0")
    out = build_recording(episode, force=True)  # the first build imports rerun (its own threads)
    py0, native0 = _threads()
    counts = []
    for _ in range(32):
        build_recording(episode, force=True)
        counts.append(_threads())
    assert max(c[0] for c in counts) <= py0 + 1, counts
    assert max(c[1] for c in counts) <= native0 + 2, counts  # was native0 + 4 per build
    reader = RrdReader(str(out))
    assert len(reader.blueprints()) == 1 and len(reader.recordings()) == 1  # the blueprint stays


def test_build_pool_process_threads_stay_bounded(tmp_path: Path) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0] * 32}, steps=3, size=(32, 24))
    (info,) = find_runs(tmp_path)
    pool = RecordingPool(workers=1)
    try:
        parent0 = threading.active_count()
        child: list[int] = []
        for ep in info.episodes:
            assert Path(pool.submit(ep).result(timeout=300)).is_file()
            procs = list(pool._executor._processes) if pool._executor is not None else []
            assert len(procs) == 1
            child.append(len(os.listdir(f"/proc/{procs[0]}/task")))
        assert len(child) == 32
        assert max(child) - child[0] <= 2, child  # was +4 per build: 14 -> 142 over 32 builds
        assert threading.active_count() <= parent0 + 2
        assert all((Path(e.path) / RRD_NAME).is_file() for e in info.episodes)
        assert run.is_dir()
    finally:
        pool.shutdown()


def test_build_pool_replaces_its_processes_between_builds(tmp_path: Path) -> None:
    """The backstop: after ``builds_per_process`` builds each, the next build (none running) gets
    fresh processes; a build in flight is never cut short."""
    write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0] * 3}, steps=3, size=(32, 24))
    (info,) = find_runs(tmp_path)
    pool = RecordingPool(workers=1, builds_per_process=2)
    try:
        pids = []
        for ep in info.episodes:
            assert Path(pool.submit(ep).result(timeout=300)).is_file()
            assert pool._executor is not None
            pids.append(next(iter(pool._executor._processes)))
        assert pids[0] == pids[1] != pids[2], pids
    finally:
        pool.shutdown()
