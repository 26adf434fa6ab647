"""The viewer page answers its own calls to other origins offline (the browser test shows the
console stays clean); a viewer cache made before that patch is patched in place, once."""

from __future__ import annotations

from pathlib import Path

from genmanip_viz.assets import VIEWER_FILES, ensure_viewer_assets, rerun_version

UNPATCHED = (
    "<!doctype html><html><head>"
    '<link rel="stylesheet" href="https://fonts.googleapis.com/css2?family=Inter">'
    "<title>Rerun Viewer</title></head><body>"
    '<script src="re_viewer.js"></script><script>start()</script></body></html>'
)


def _old_cache(tmp_path: Path) -> Path:
    dest = tmp_path / f"rerun-web-{rerun_version()}"
    dest.mkdir(parents=True)
    for name in (*VIEWER_FILES, "re_viewer_bg.wasm.gz"):
        (dest / name).write_text("x")
    (dest / "index.html").write_text(UNPATCHED)
    return dest


def test_a_cached_viewer_page_is_patched_once(tmp_path: Path) -> None:
    dest = _old_cache(tmp_path)
    assert ensure_viewer_assets(cache_dir=tmp_path) == dest
    page = (dest / "index.html").read_text()
    assert "fonts.googleapis.com" not in page
    # The offline fetch is the page's first script, before the viewer's.
    first = page.index("<script")
    assert page.index("window.fetch = function") > first
    assert page.index("window.fetch = function") < page.index('<script src="re_viewer.js">')
    assert 'url.origin === window.location.origin' in page and "status: 503" in page
    mtime = (dest / "index.html").stat().st_mtime_ns
    ensure_viewer_assets(cache_dir=tmp_path)
    again = (dest / "index.html").read_text()
    assert again == page and again.count("window.fetch = function") == 1
    assert (dest / "index.html").stat().st_mtime_ns == mtime  # not rewritten
