"""The episode page links the episode's plots (made by genmanip-artifacts, the real writer), its
videos, ``steps.jsonl`` and its directory; only what exists, every file served through the same
path-safety as the rest of the viewer (nothing hidden, nothing through a symlink out, never as
HTML). Also the run page's dot legend and the labelled sign of the comparison."""

from __future__ import annotations

import hashlib
import html as htmllib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from genmanip_artifacts import plot_episode
from genmanip_results.layout import (
    ACTION_PLOT,
    MERGED_VIDEO,
    PLOT_IMAGES,
    PLOT_LOG,
    STATE_PLOT,
    STEPS_JSONL,
)
from genmanip_results.testing import write_client_episode, write_client_run
from genmanip_viz.server import VizServer

SECRET = b"TOPSECRET-episode-files-93ad"
CAMS = {"left_camera": (64, 48), "top_camera": (64, 48)}
MINUS = "\N{MINUS SIGN}"  # the label's sign, as rendered from &minus;


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, viz_cache: Path) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("episode-files")
    (base / "outside").mkdir()
    secret = base / "outside" / "secret.txt"
    secret.write_bytes(SECRET)
    results = base / "project" / "client_results"
    run = write_client_run(results, "ebench", "files", tasks={"ebench/t/a": [1.0, 0.0]},
                           steps=6, cameras=CAMS)  # fmt: skip
    plotted, bare = run / "ebench/t/a/0", run / "ebench/t/a/1"
    written = plot_episode(plotted)  # gmp plot's writer, into the episode directory
    no_video = write_client_episode(run, "ebench/t/a", "2", steps=4, videos=False)
    (plotted / ".hidden-note").write_bytes(SECRET)
    (plotted / "stolen.txt").symlink_to(secret)
    (plotted / "evil.html").write_bytes(b"<script>alert(1)</script>")
    (plotted / "evil.svg").write_bytes(b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>')
    with VizServer(base / "project", warm=False, scan_interval=0.5, cache_dir=viz_cache) as srv:
        srv.app.state.viz.index.wait_for_scan()
        key = next(v.key for v in srv.app.state.viz.index.snapshot().runs if v.info.run_id == "files")
        yield {"srv": srv, "key": key, "plotted": plotted, "bare": bare, "no_video": no_video,
               "written": written, "root": base / "project", "run": run}  # fmt: skip


def _get(srv: VizServer, path: str) -> requests.Response:
    return requests.get(srv.base_url + path, timeout=60)


def _files_links(page: str) -> dict[str, str]:
    """Link text -> href of the episode page's files line."""
    m = re.search(r'<p class="files" id="files">(.*?)</p>', page, re.S)
    assert m is not None, "the episode page has no files line"
    return {
        htmllib.unescape(text): htmllib.unescape(href)
        for href, text in re.findall(r'<a href="([^"]+)">([^<]+)</a>', m.group(1))
    }


def test_the_plot_writer_and_the_page_use_the_layout_names(world: dict[str, Any]) -> None:
    r = world["written"]
    assert (r.state_plot.name, r.action_plot.name, r.video.name) == (STATE_PLOT, ACTION_PLOT, MERGED_VIDEO)
    assert (world["plotted"] / PLOT_LOG).is_file()
    assert PLOT_IMAGES == (STATE_PLOT, ACTION_PLOT)


def test_the_episode_page_links_what_the_episode_has(world: dict[str, Any]) -> None:
    srv, key = world["srv"], world["key"]
    links = _files_links(_get(srv, f"/episode/{key}/ebench/t/a/0").text)
    base = f"/file/{key}"
    assert links == {
        "state plot": f"{base}/{STATE_PLOT}/ebench/t/a/0",
        "action plot": f"{base}/{ACTION_PLOT}/ebench/t/a/0",
        "left_camera.mp4": f"{base}/left_camera.mp4/ebench/t/a/0",
        "top_camera.mp4": f"{base}/top_camera.mp4/ebench/t/a/0",
        MERGED_VIDEO: f"{base}/{MERGED_VIDEO}/ebench/t/a/0",
        STEPS_JSONL: f"{base}/{STEPS_JSONL}/ebench/t/a/0",
        "episode directory": f"/files/{key}/ebench/t/a/0",
    }
    expected = {
        STATE_PLOT: ("image/png", world["plotted"] / STATE_PLOT),
        ACTION_PLOT: ("image/png", world["plotted"] / ACTION_PLOT),
        "left_camera.mp4": ("video/mp4", world["plotted"] / "left_camera.mp4"),
        MERGED_VIDEO: ("video/mp4", world["plotted"] / MERGED_VIDEO),
        STEPS_JSONL: ("text/plain", world["plotted"] / STEPS_JSONL),
    }
    for name, (media, path) in expected.items():
        got = _get(srv, f"{base}/{name}/ebench/t/a/0")
        assert got.status_code == 200, name
        assert got.headers["content-type"].startswith(media), (name, got.headers["content-type"])
        assert hashlib.sha256(got.content).digest() == hashlib.sha256(path.read_bytes()).digest()
    # Without plots: no plot links; without mp4s: no video links (only what exists).
    bare = _files_links(_get(srv, f"/episode/{key}/ebench/t/a/1").text)
    assert set(bare) == {"left_camera.mp4", "top_camera.mp4", STEPS_JSONL, "episode directory"}
    none = _files_links(_get(srv, f"/episode/{key}/ebench/t/a/2").text)
    assert set(none) == {STEPS_JSONL, "episode directory"}


def test_the_directory_page_lists_only_servable_files(world: dict[str, Any]) -> None:
    srv, key = world["srv"], world["key"]
    page = _get(srv, f"/files/{key}/ebench/t/a/0")
    assert page.status_code == 200
    listed = re.findall(r'<td data-v="[^"]*"><a href="([^"]+)">([^<]+)</a></td>', page.text)
    names = [n for _, n in listed]
    visible = sorted(
        p.name for p in world["plotted"].iterdir()
        if not p.name.startswith(".") and p.is_file() and not p.is_symlink()
    )  # fmt: skip
    assert names == visible and "stolen.txt" not in names and ".hidden-note" not in names
    assert str(world["plotted"]) in htmllib.unescape(page.text)
    for href, _ in listed:
        assert _get(srv, htmllib.unescape(href)).status_code == 200, href


@pytest.mark.parametrize(
    "name",
    [".hidden-note", "stolen.txt", "..", "%2e%2e", "..%2F..%2Foutside%2Fsecret.txt", "nope.png",
     ".genmanip_vis.rrd"],
)  # fmt: skip
def test_unsafe_or_missing_files_are_not_served(world: dict[str, Any], name: str) -> None:
    srv, key = world["srv"], world["key"]
    got = _get(srv, f"/file/{key}/{name}/ebench/t/a/0")
    assert got.status_code == 404 and SECRET not in got.content


def test_markup_in_a_results_tree_is_never_served_as_markup(world: dict[str, Any]) -> None:
    srv, key = world["srv"], world["key"]
    for name in ("evil.html", "evil.svg"):
        got = _get(srv, f"/file/{key}/{name}/ebench/t/a/0")
        assert got.status_code == 200
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.headers["content-disposition"] == f'attachment; filename="{name}"'
        assert got.headers["x-content-type-options"] == "nosniff"
    # an episode that is not in the index
    assert _get(srv, f"/file/{key}/{STEPS_JSONL}/ebench/t/a/9").status_code == 404
    assert _get(srv, f"/files/{key}/ebench/t/a/9").status_code == 404


def test_the_run_page_explains_its_dots(world: dict[str, Any]) -> None:
    srv, key = world["srv"], world["key"]
    page = _get(srv, f"/run/{key}").text
    legend = re.search(r'<p class="legend" id="dot-legend">(.*?)</p>', page, re.S)
    assert legend is not None
    text = re.sub(r"<[^>]+>", "", legend.group(1))
    for words in ("success", "failure", "partial score", "running or incomplete", "score"):
        assert words in text
    for cls in ("dot s10 ok", "dot s5 fail", "dot s0 fail", "dot pending"):
        assert f'class="swatch {cls}"' in legend.group(1)
    # every dot of the page is of a kind the legend shows: ok or fail by score band, or pending
    for cls in re.findall(r'<a class="dot ([^"]+)"', page):
        assert re.fullmatch(r"s\d+ (ok|fail)|pending", cls), cls
    assert page.count('<a class="dot ') == 3  # the legend's samples are no episode links


def test_the_comparison_says_which_run_is_subtracted(server: VizServer) -> None:
    snap = server.app.state.viz.index.snapshot()
    keys = {v.info.run_id: v.key for v in snap.runs}
    page = htmllib.unescape(
        _get(server, f"/run/{keys['run_a']}?compare={keys['run_b']}").text
    )
    m = re.search(r'<p class="summary" id="compare-summary">(.*?)</p>', page, re.S)
    assert m is not None
    summary = re.sub(r"<[^>]+>", "", m.group(1))
    assert "A = this run (run_a), B = run_b" in summary
    a = float(re.search(r"success A ([0-9.]+)%", summary).group(1))  # type: ignore[union-attr]
    b = float(re.search(r"· B ([0-9.]+)%", summary).group(1))  # type: ignore[union-attr]
    delta = re.search(rf"Δ success \(B {MINUS} A\): ([+-][0-9.]+) pp", summary)
    assert delta is not None
    d = float(delta.group(1))
    assert d == pytest.approx(b - a, abs=0.11) and d != 0
    head = re.search(r'<table class="sortable" id="compare"><thead>(.*?)</thead>', page, re.S)
    assert head is not None
    assert "A: this run" in head.group(1) and "B: run_b" in head.group(1)
    assert f"Δ success (B {MINUS} A)" in head.group(1)


def test_the_reports_links_open_the_episodes_in_viz(world: dict[str, Any], tmp_path: Path) -> None:
    """gmp report and gmp viz compute the run key in one place (genmanip_results.discovery)."""
    from genmanip_artifacts.report import build_report
    from genmanip_results.discovery import load_run

    srv = world["srv"]
    out = tmp_path / "report.html"
    build_report([load_run(world["run"])], out, thumbnails=False, viz_url=srv.base_url,
                 viz_root=world["root"])  # fmt: skip
    links = re.findall(r'href="(' + re.escape(srv.base_url) + r'/episode/[^"]+)"', out.read_text())
    assert links == [f"{srv.base_url}/episode/{world['key']}/ebench/t/a/1"]  # the failed one
    page = requests.get(links[0], timeout=60)
    assert page.status_code == 200 and "ebench/t/a" in page.text
