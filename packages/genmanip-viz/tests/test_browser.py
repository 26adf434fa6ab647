"""A real headless Chromium opens the three pages and replays an episode in the Rerun web viewer.

Needs Debian's chromium at /usr/bin/chromium (``apt-get install -y chromium``); driven through the
DevTools protocol by Playwright (its own browser downloads are not used). Screenshots go to
``$GMP_SCREENSHOT_DIR`` (default: a tmp dir) for humans to look at.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_viz.server import VizServer
from PIL import Image

CHROMIUM = os.environ.get("GMP_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # WebGL through SwiftShader: the viewer needs a GL context and there is no GPU here.
    "--enable-unsafe-swiftshader",
]  # fmt: skip

# Generous: loading and compiling the 43 MB viewer Wasm under SwiftShader on a busy 2-core box.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(
        CHROMIUM
    ):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: install it with "
            "`apt-get update && apt-get install -y chromium` (Debian) or set GMP_CHROMIUM"
        )
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("GMP_SCREENSHOT_DIR") or tmp_path / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


def replay_in_browser(
    ctx: Any, server: VizServer, shots: Path, run_label: str, prefix: str
) -> dict[str, Any]:
    """Runs page -> run page -> first episode; returns what the test asserts on."""
    t0 = time.monotonic()
    mark = lambda what: print(f"{prefix}{what}: {time.monotonic() - t0:.1f}s")  # noqa: E731
    page = ctx.new_page()
    page_errors: list[str] = []
    console_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    # Frames (the viewer iframe) report their errors through the same page events.
    page.goto(server.base_url + "/", wait_until="load")
    assert page.locator("table#runs tbody tr").count() >= 1
    page.screenshot(path=str(shots / f"{prefix}1-runs.png"), full_page=True)
    mark("runs")

    page.click(f"table#runs a:text-is('{run_label}')")
    page.wait_for_load_state("load")
    assert page.locator("a.dot").count() >= 1
    page.screenshot(path=str(shots / f"{prefix}2-run.png"), full_page=True)

    with page.expect_response(
        lambda r: r.url.endswith("/recording.rrd"), timeout=180_000
    ) as rrd_info:
        page.locator("a.dot").first.click()
    rrd = rrd_info.value
    rrd.finished()
    mark("rrd")
    status = rrd.status
    body_size = len(rrd.body())
    page.wait_for_function(
        "() => { const f = document.getElementById('viewer');"
        " return !!(f && f.contentDocument && f.contentDocument.querySelector('canvas')); }",
        timeout=120_000,
    )
    mark("canvas")
    # Wait until a decoded video frame is on screen: the synthetic cameras show a yellow square
    # (250, 250, 40) that nothing else in the UI has. Proves WebCodecs decoded the H.264 asset.
    box = page.locator("#viewer").bounding_box()
    assert box is not None
    clip = {"x": box["x"], "y": box["y"], "width": box["width"], "height": box["height"] * 0.6}
    yellow = 0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        png = page.screenshot(clip=clip, timeout=180_000)
        img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)
        yellow = int(((img[..., 0] > 200) & (img[..., 1] > 200) & (img[..., 2] < 120)).sum())
        if yellow > 500:
            break
        page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / f"{prefix}3-episode.png"), timeout=180_000)
    mark("shot")
    canvas_size = page.evaluate(
        "() => { const c = document.getElementById('viewer').contentDocument.querySelector('canvas');"
        " return [c.width, c.height]; }"
    )
    title = page.title()
    page.close()
    return {
        "video_pixels": yellow,
        "status": status,
        "size": body_size,
        "page_errors": page_errors,
        "console_errors": console_errors,
        "canvas": canvas_size,
        "title": title,
    }


def test_replay_episodes_in_chromium(
    browser: Any, tree: Path, viz_cache: Path, shots: Path
) -> None:
    with VizServer(tree, cache_dir=viz_cache) as server:
        server.app.state.viz.index.wait_for_scan()  # type: ignore[attr-defined]
        got = replay_in_browser(browser, server, shots, "run_a", "")
        assert got["status"] == 200 and got["size"] > 10_000
        assert got["page_errors"] == []
        assert got["canvas"][0] > 100 and got["canvas"][1] > 100
        assert got["video_pixels"] > 500, "no decoded camera frame became visible in the viewer"
        # (nothing exempt: the viewer's calls home are answered offline, see the test below)
        assert got["console_errors"] == []
        assert (shots / "3-episode.png").stat().st_size > 10_000

        # The server layout (mp4 + meta_record.pkl) replays too.
        snap = server.app.state.viz.index.snapshot()  # type: ignore[attr-defined]
        srv = next(v for v in snap.runs if v.info.run_id == "srv_run")
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        with page.expect_response(
            lambda r: r.url.endswith("/recording.rrd"), timeout=180_000
        ) as info:
            page.goto(f"{server.base_url}/episode/{srv.key}/{srv.order[0]}")
        assert info.value.status == 200
        page.wait_for_function(
            "() => { const f = document.getElementById('viewer');"
            " return !!(f && f.contentDocument && f.contentDocument.querySelector('canvas')); }",
            timeout=120_000,
        )
        page.wait_for_timeout(3000)

        # The live page shows the worker's newest frames and its state.
        page.goto(f"{server.base_url}/live/{srv.key}")
        page.wait_for_function(
            "() => { const imgs = [...document.querySelectorAll('img.livecam')];"
            " return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0)"
            " && document.getElementById('live-step').textContent === '7'; }",
            timeout=60_000,
        )
        assert "50.0%" in (page.text_content("#live-sr") or "")
        page.screenshot(path=str(shots / "4-live.png"), full_page=True)
        page.close()
        assert errors == []


def _live_run(results: Path, pid: int) -> Path:
    """A run being recorded by process ``pid`` (run.json's running segment, as gmp eval writes
    it), with one finished episode and one being recorded; its files are a minute old."""
    import datetime as dt
    import json
    import socket

    from genmanip_results.testing import write_client_episode

    run = results / "ebench" / "following"
    write_client_episode(run, "ebench/t/a", "0", steps=3, videos=False)
    write_client_episode(run, "ebench/t/a", "1", steps=2, videos=False, complete=False)
    host = socket.gethostname()
    started = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
    (run / "run.json").write_text(json.dumps({
        "run_id": "following", "benchmark": "ebench", "total_episodes": 2,
        "segments": [{"id": f"{host}:{pid}:{started.isoformat()}", "host": host,
                      "started": started.isoformat(), "outcome": "running"}],
    }))  # fmt: skip
    old = time.time() - 60
    for d, _dirs, files in os.walk(run):
        for name in [*files, "."]:
            os.utime(Path(d) / name, (old, old))
    return run


def test_pages_log_no_console_errors(browser: Any, tmp_path: Path, viz_cache: Path, shots: Path) -> None:
    """Runs page, run page, two episode pages (the viewer replaying, then left mid-load), and a live
    run's page following the run: not one console error or page error in any frame. The viewer's
    own calls home (telemetry, update check) are answered offline instead of failing: before,
    each episode page logged five ``Failed to fetch`` errors."""
    import subprocess
    import sys

    from genmanip_results.testing import write_client_run

    results = tmp_path / "client_results"
    write_client_run(results, "ebench", "quiet", tasks={"ebench/t/a": [1.0, 0.0, 1.0]}, steps=12)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _live_run(results, sleeper.pid)
        with VizServer(tmp_path, cache_dir=viz_cache, warm=False) as server:
            server.app.state.viz.index.wait_for_scan()  # type: ignore[attr-defined]
            page = browser.new_page()
            errors: list[str] = []
            offline: list[str] = []
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("console", lambda m: errors.append(f"{m.type}: {m.text}") if m.type == "error"
                    else offline.append(m.text) if "the viewer stays offline" in m.text else None)

            page.goto(server.base_url + "/", wait_until="load")
            assert page.locator("table#runs tbody tr").count() == 2
            page.click("table#runs a:text-is('quiet')")
            page.wait_for_load_state("load")
            assert page.locator("#dot-legend").is_visible()
            with page.expect_response(lambda r: r.url.endswith("/recording.rrd"), timeout=180_000):
                page.locator("a.dot").first.click()
            page.wait_for_function(
                "() => { const f = document.getElementById('viewer');"
                " return !!(f && f.contentDocument && f.contentDocument.querySelector('canvas')); }",
                timeout=180_000,
            )
            # The viewer calls home once it runs: wait until it did (answered offline, or, without
            # that, refused by the CSP with errors in the console).
            deadline = time.monotonic() + 120
            while not offline and not errors:
                assert time.monotonic() < deadline, "the viewer never tried to call home"
                page.wait_for_timeout(200)
            assert errors == []
            assert page.locator("#files a", has_text="episode directory").count() == 1
            page.screenshot(path=str(shots / "errors-1-episode.png"))
            # Leave while the next episode's viewer is still loading: nothing it had in flight
            # may log an error.
            page.click("#next")
            page.wait_for_load_state("load")
            page.click("header nav a:text-is('runs')")
            page.wait_for_load_state("load")

            # A live run's page follows the run without a reload.
            page.click("table#runs a:text-is('following')")
            page.wait_for_load_state("load")
            badge = page.locator('.runhead [data-field="state"]')
            assert badge.get_attribute("data-state") == "live"
            page.evaluate("() => { window.__sameDocument = true; }")
            sleeper.kill()
            sleeper.wait(30)
            page.wait_for_function(
                "() => document.querySelector('.runhead [data-field=\"state\"]')"
                ".getAttribute('data-state') === 'interrupted'",
                timeout=30_000,
            )
            assert badge.text_content() == "interrupted"
            assert page.evaluate("() => window.__sameDocument === true")  # updated in place
            page.screenshot(path=str(shots / "errors-2-followed.png"), full_page=True)
            page.goto(server.base_url + "/", wait_until="load")
            page.close()
            assert errors == []
    finally:
        sleeper.kill()
        sleeper.wait(30)
