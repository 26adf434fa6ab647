"""Item 9: the results browser under attack.

* >= 200 path-escape attempts over real HTTP against every route that takes a path-like part:
  ``..`` plain, percent-encoded, double-encoded, overlong UTF-8, backslashes, absolute paths, NUL,
  Unicode look-alikes, and symlinks inside the root pointing at a secret file outside it. Nothing
  outside the root is ever served (the secret's content never appears in any body), and the
  server keeps answering.
* HTML/JS injection through run ids, task names and instructions: every page's HTML carries the
  payloads escaped only, and a real headless Chromium opening the pages never executes them
  (each payload would set ``window.__pwned``/``document.title``).
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genmanip_results.testing import write_client_run, write_live_worker
from genmanip_viz.server import VizServer

pytestmark = pytest.mark.slow

SECRET = "TOPSECRET-" + secrets.token_hex(8)

#: payloads that would run script if a page put them into HTML unescaped
XSS_RUN_ID = "run<img src=x onerror=window.__pwned=1>"
XSS_RUN_ID2 = '"><svg onload=window.__pwned=2>'
XSS_TASK = "ebench/xss/<script>window.__pwned=3<\\/script>/'\"><img src=x onerror=window.__pwned=4>"
XSS_INSTRUCTION = ("</script><script>window.__pwned=5</script><img src=x onerror=window.__pwned=6>"
                   "\u2028\u2029{{constructor.constructor('window.__pwned=7')()}} javascript:window.__pwned=8")
RAW_MARKERS = ["<img src=x", "<svg onload", "<script>window.__pwned"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("viz-attack")
    outside = base / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(SECRET + "\n", encoding="utf-8")
    # an episode-looking directory outside the root, reachable only through a symlink
    write_client_run(outside / "results", "ebench", "stolen", tasks={"ebench/t/x": [1.0]},
                     instruction=SECRET, videos=False)
    root = base / "project"
    results = root / "client_results"
    write_client_run(results, "ebench", "run_ok", tasks={"ebench/table/lift": [1.0, 0.0]},
                     instruction=XSS_INSTRUCTION)
    write_client_run(results, "ebench", XSS_RUN_ID, tasks={XSS_TASK: [1.0]}, instruction=XSS_INSTRUCTION)
    write_client_run(results, "ebench", XSS_RUN_ID2, tasks={"ebench/a/b": [0.0]}, instruction=XSS_INSTRUCTION)
    run_ok = results / "ebench" / "run_ok"
    live = write_live_worker(run_ok, "1", episode_id="ebench/run_ok/ebench/table/lift/0",
                             instruction=XSS_INSTRUCTION)
    # symlinks inside the root pointing out
    (run_ok / "ebench" / "table" / "lift" / "evil").symlink_to(outside / "results" / "ebench" / "stolen" / "ebench" / "t" / "x" / "0")
    (run_ok / "ebench" / "table" / "lift" / "0" / "secret.mp4").symlink_to(secret)
    (results / "ebench" / "linked_run").symlink_to(outside / "results" / "ebench" / "stolen")
    for cam in ("left_camera", "top_camera"):
        p = live / f"{cam}.jpg"
        if p.exists():
            p.unlink()
        p.symlink_to(secret)
    (live / "live.json").unlink()
    (live / "live.json").symlink_to(secret)
    (live.parent / "2").symlink_to(outside)
    with VizServer(root, warm=False, scan_interval=0.5, cache_dir=base / "cache") as srv:
        srv.app.state.viz.index.wait_for_scan()  # type: ignore[attr-defined]
        yield {"server": srv, "root": root, "outside": outside, "secret": secret}


def _get(srv: VizServer, path: str) -> tuple[int, bytes]:
    """GET with the path sent verbatim (no client-side normalization of ``..``)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", f"localhost:{srv.port}")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _run_keys(srv: VizServer) -> dict[str, str]:
    import html as _html

    status, body = _get(srv, "/")
    assert status == 200
    text = body.decode()
    return {_html.unescape(m.group(2)): m.group(1)
            for m in re.finditer(r'href="/run/([0-9a-f]{12})">([^<]+)</a>', text)}


def _traversals(secret: Path) -> list[str]:
    rel_to_secret = "../" * 12 + str(secret).lstrip("/")
    abs_secret = str(secret)
    dot = [
        "..", "%2e%2e", "%2E%2E", ".%2e", "%2e.", "%252e%252e", "%25252e%25252e", "%c0%ae%c0%ae",
        "%e0%80%ae%e0%80%ae", "\uff0e\uff0e", "%ef%bc%8e%ef%bc%8e", "....", "..%00", "..;",
    ]
    sep = ["/", "%2f", "%2F", "%252f", "\\", "%5c", "%255c", "%c0%af", "/./", "//"]
    out = []
    target = str(secret).lstrip("/")
    for d in dot:
        for s in sep:
            out.append((d + s) * 12 + target.replace("/", s))
    out += [
        rel_to_secret, abs_secret, "/" + abs_secret, "%2f" + abs_secret.lstrip("/").replace("/", "%2f"),
        "file://" + abs_secret, "C:\\Windows\\win.ini", "..\\..\\..\\etc\\passwd", "/etc/passwd",
        "%00/etc/passwd", "ok%00.." + abs_secret, "evil/result.json", "evil", "../outside/secret.txt",
        "ebench/table/lift/evil/result.json", "ebench/table/lift/0/secret.mp4", "linked_run/run.json",
    ]
    return out


def test_path_escapes_never_serve_outside_the_root(world: dict[str, Any]) -> None:
    srv: VizServer = world["server"]
    keys = _run_keys(srv)
    key = keys["run_ok"]
    attempts = 0
    leaks = []
    statuses: dict[int, int] = {}
    templates = [
        "/episode/{key}/{p}", "/rrd/{key}/{p}", "/run/{p}", "/viewer/{p}", "/static/{p}",
        "/live/{p}", "/live/{key}/{p}/state.json", "/live/{key}/1/{p}.jpg", "/{p}",
    ]
    for p in _traversals(world["secret"]):
        for t in templates:
            path = t.format(key=key, p=p)
            # the request line cannot carry raw spaces/controls: percent-encode those bytes only
            path = "".join(c if 32 < ord(c) < 127 else "".join(f"%{b:02x}" for b in c.encode()) for c in path)
            status, body = _get(srv, path)
            attempts += 1
            statuses[status] = statuses.get(status, 0) + 1
            if SECRET.encode() in body:
                leaks.append(f"{status} {path}")
    # symlinks inside the root that point out: the live files, the episode, the run
    for path in (f"/live/{key}/1/left_camera.jpg", f"/live/{key}/1/top_camera.jpg",
                 f"/live/{key}/1/state.json", f"/live/{key}/2/state.json", f"/live/{key}",
                 f"/episode/{key}/ebench/table/lift/evil", f"/rrd/{key}/ebench/table/lift/evil",
                 f"/run/{key}", "/"):
        status, body = _get(srv, path)
        attempts += 1
        if SECRET.encode() in body:
            leaks.append(f"{status} {path} (symlink)")
    if "linked_run" in keys:
        status, body = _get(srv, f"/run/{keys['linked_run']}")
        attempts += 1
        if SECRET.encode() in body:
            leaks.append(f"{status} /run/<linked_run> (symlinked run dir)")
    print(f"\nviz path-escape attempts: {attempts}, statuses {dict(sorted(statuses.items()))}, leaks {len(leaks)}")
    assert attempts >= 200
    assert not leaks, "\n".join(leaks[:20])
    assert statuses.get(500, 0) == 0, statuses  # refused, not crashed
    # still serving normally afterwards
    assert _get(srv, "/")[0] == 200
    assert _get(srv, f"/run/{key}")[0] == 200


def test_injection_is_escaped_in_every_page(world: dict[str, Any]) -> None:
    srv: VizServer = world["server"]
    keys = _run_keys(srv)
    assert XSS_RUN_ID in keys and XSS_RUN_ID2 in keys  # listed, with the names shown as text
    pages = ["/"]
    for name in ("run_ok", XSS_RUN_ID, XSS_RUN_ID2):
        pages.append(f"/run/{keys[name]}")
        status, body = _get(srv, f"/run/{keys[name]}")
        for m in re.finditer(r'href="(/episode/[^"]+)"', body.decode()):
            pages.append(m.group(1).replace("&amp;", "&"))
    pages.append(f"/live/{keys['run_ok']}")
    seen_episode = False
    for page in pages:
        status, body = _get(srv, page)
        text = body.decode("utf-8", "replace")
        assert status in (200, 404), (page, status)
        for marker in RAW_MARKERS:
            assert marker not in text, f"{page}: raw {marker!r} in the HTML"
        seen_episode |= page.startswith("/episode/") and status == 200
    assert seen_episode


CHROMIUM = os.environ.get("GMP_CHROMIUM", "/usr/bin/chromium")


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_injection_never_executes_in_chromium(world: dict[str, Any], tmp_path: Path) -> None:
    if not shutil.which(CHROMIUM) and not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium (or set GMP_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    srv: VizServer = world["server"]
    keys = _run_keys(srv)
    urls = [srv.base_url + "/"]
    for name in (XSS_RUN_ID, XSS_RUN_ID2, "run_ok"):
        urls.append(f"{srv.base_url}/run/{keys[name]}")
    urls.append(f"{srv.base_url}/live/{keys['run_ok']}")
    _status, body = _get(srv, f"/run/{keys[XSS_RUN_ID]}")
    ep = re.search(r'href="(/episode/[^"]+)"', body.decode())
    assert ep is not None
    urls.append(srv.base_url + ep.group(1).replace("&amp;", "&"))
    dialogs: list[str] = []
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        try:
            page = ctx.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            for url in urls:
                page.goto(url, wait_until="domcontentloaded", timeout=120_000)
                page.wait_for_timeout(300)
                pwned = page.evaluate("() => [window.__pwned === undefined ? null : window.__pwned, document.title]")
                assert pwned[0] is None, f"{url}: payload {pwned[0]} executed"
                assert "PWNED" not in pwned[1]
                # the hostile text is on the page, as text
                if "/run/" in url and keys[XSS_RUN_ID] in url:
                    assert "onerror" in page.inner_text("body")
        finally:
            ctx.close()
    assert dialogs == []
