"""On a results tree produced by the real pieces: the testbed server + ``gmp eval`` recording
(client layout) and the testbed's own server layout (``save_process``)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from genmanip_results.discovery import find_runs
from genmanip_results.video import probe_video
from genmanip_runtime.console import Console
from genmanip_viz.recording import build_recording
from genmanip_viz.server import VizServer
from rerun.chunk import RrdReader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from genmanip_eval.cli import evaluate
    from genmanip_eval.runner import EvalConfig
    from genmanip_testbed import serve_testbed

    root = tmp_path_factory.mktemp("produced")
    with serve_testbed(tasks=("testbed/reach/easy",), results_root=root, save_process=True) as tb:
        cfg = EvalConfig(
            url=tb.url, worker_ids=["0", "1"], processes=1, policy="expert",
            results_dir=str(root / "client_results"), live_every=5,
        )  # fmt: skip
        summary = evaluate(cfg, Console(io.StringIO()), label="test")
        assert summary.complete
    yield root


def _temporal_rows(rrd: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for chunk in RrdReader(str(rrd)).store().stream():
        if not chunk.is_static:
            out[str(chunk.entity_path)] = out.get(str(chunk.entity_path), 0) + chunk.num_rows
    return out


def test_recordings_match_what_eval_recorded(produced: Path) -> None:
    runs = [r for r in find_runs(produced / "client_results") if r.layout == "client"]
    assert runs and runs[0].n_complete >= 2
    for ep in runs[0].episodes:
        assert ep.complete and ep.videos
        rows = [
            json.loads(line)
            for line in Path(ep.steps_file).read_text().splitlines()
            if line.strip()
        ]  # type: ignore[arg-type]
        n_obs = len({r["frame"] for r in rows if r["state"] is not None})
        rrd = build_recording(ep)
        got = _temporal_rows(rrd)
        assert got["/action/arm"] == len(rows)
        for cam, mp4 in ep.videos.items():
            n_frames = probe_video(mp4)[0]
            assert got[f"/cameras/{cam}"] == min(n_obs, n_frames)
        assert got["/state/joints"] == n_obs


def test_server_layout_recordings_from_testbed(produced: Path) -> None:
    from genmanip_protocol.codec import safe_loads

    runs = [r for r in find_runs(produced) if r.layout == "server"]
    assert runs, "the testbed with save_process writes the server layout under saved/eval_results"
    ep = runs[0].episodes[0]
    meta = safe_loads(Path(ep.meta_record).read_bytes())  # type: ignore[arg-type]
    got = _temporal_rows(build_recording(ep))
    assert got["/state/joints"] == len(meta["joint_positions"])
    assert got["/action/arm"] == len(meta["model_output"])
    for cam, mp4 in ep.videos.items():
        assert got[f"/cameras/{cam}"] == probe_video(mp4)[0]


def test_browser_pages_on_produced_tree(produced: Path, viz_cache: Path) -> None:
    with VizServer(produced, cache_dir=viz_cache, warm=False) as s:
        s.app.state.viz.index.wait_for_scan()  # type: ignore[attr-defined]
        html = requests.get(s.base_url + "/", timeout=30).text
        keys = re.findall(r'href="/run/([0-9a-f]{12})"', html)
        layouts = re.findall(r'<td data-v="(client|server)" class="muted">', html)
        assert set(layouts) == {"client", "server"}
        for key in keys:
            page = requests.get(f"{s.base_url}/run/{key}", timeout=30)
            assert page.status_code == 200
        client_key = keys[layouts.index("client")]
        run_html = requests.get(f"{s.base_url}/run/{client_key}", timeout=30).text
        ep = re.findall(r'href="(/episode/[^"]+)"', run_html)[0]
        ep_html = requests.get(s.base_url + ep, timeout=30).text
        rrd = re.search(r'data-rrd="([^"]+)"', ep_html)
        assert rrd is not None
        assert requests.get(s.base_url + rrd.group(1), timeout=300).status_code == 200
        # the live frames gmp eval --live-every wrote are served
        live = requests.get(f"{s.base_url}/live/{client_key}", timeout=30).text
        m = re.search(r'data-state="([^"]+)"', live)
        assert m is not None
        state = requests.get(s.base_url + m.group(1), timeout=30).json()
        assert "step" in state and "sr" in state
        src = re.search(r'data-src="([^"]+)"', live)
        assert src is not None
        img = requests.get(s.base_url + src.group(1), timeout=30)
        assert img.status_code == 200 and img.content[:2] == b"\xff\xd8"
