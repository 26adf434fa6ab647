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


# =============================================================================================
# The viewer served files outside the root through symlinks inside it (issue "Hostile input,
# for real", class 8): a result.json that was a symlink to an outside file had its content shown
# on the episode page (the instruction was re-read by name after the scan had skipped the link).
# Now every file viz opens goes through genmanip_results.paths.open_within (checked where it is
# opened). Every input name, both layouts, every route, and the .rrd build; plus the build
# pool's threads over many builds (it grew by four per build).
# =============================================================================================

import json  # noqa: E402 - this block is kept apart from the one above
import pickle  # noqa: E402
import time  # noqa: E402

from genmanip_results.testing import write_server_run  # noqa: E402

LINK_SECRET = "LINKSECRET-" + secrets.token_hex(8)

#: (layout, file name in the episode directory) linked to an outside secret of matching kind
LINKED_INPUTS: list[tuple[str, str]] = [
    ("client", "result.json"), ("client", "steps.jsonl"), ("client", "left_camera.mp4"),
    ("client", ".genmanip_vis.rrd"), ("client", ".genmanip_vis.rrd.json"),
    ("server", "result_info.json"), ("server", "meta_record.pkl"), ("server", "left_camera.mp4"),
    ("server", "episode.rrd"),
]


@pytest.fixture(scope="module")
def linked_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("viz-links")
    outside = base / "outside"
    outside.mkdir()
    payload = {"score": 1.0, "instruction": LINK_SECRET, "robot_id": LINK_SECRET, "run_id": LINK_SECRET,
               "benchmark": LINK_SECRET}
    kinds = {
        "json": json.dumps(payload).encode(),
        "jsonl": (json.dumps({"step": 0, "robot_id": LINK_SECRET}) + "\n").encode(),
        "pkl": pickle.dumps(payload),
        "bin": LINK_SECRET.encode() * 32,
    }
    for kind, data in kinds.items():
        (outside / f"secret.{kind}").write_bytes(data)

    def kind_of(name: str) -> str:
        return {"result.json": "json", "result_info.json": "json", "steps.jsonl": "jsonl",
                "meta_record.pkl": "pkl", ".genmanip_vis.rrd.json": "json"}.get(name, "bin")

    root = base / "project"
    client = write_client_run(root / "client_results", "ebench", "clinks",
                              tasks={"ebench/t/a": [1.0] * 6}, steps=4)
    server = write_server_run(root, "ebench", "slinks", tasks={"ebench/k/d": [1.0] * 5}, steps=4)
    seeds: dict[tuple[str, str], str] = {}
    counters = {"client": 0, "server": 0}
    for layout, name in LINKED_INPUTS:
        seed = str(counters[layout])
        counters[layout] += 1
        ep = (client / "ebench/t/a" if layout == "client" else server / "ebench/k/d") / seed
        target = ep / name
        if target.exists() or target.is_symlink():
            target.unlink()
        target.symlink_to(outside / f"secret.{kind_of(name)}")
        seeds[(layout, name)] = seed
    # a run whose manifest is a link out, a symlinked episode directory and a symlinked task dir
    linked = write_client_run(root / "client_results", "ebench", "manifestlink",
                              tasks={"ebench/t/b": [1.0]}, steps=3, videos=False)
    (linked / "run.json").unlink()
    (linked / "run.json").symlink_to(outside / "secret.json")
    stolen = write_client_run(outside / "elsewhere", "ebench", "stolen", tasks={"ebench/t/x": [1.0]},
                              instruction=LINK_SECRET, steps=3)
    (client / "ebench/t/a/9").symlink_to(stolen / "ebench/t/x/0", target_is_directory=True)
    (client / "ebench/t/linkedtask").symlink_to(stolen / "ebench/t/x", target_is_directory=True)
    with VizServer(root, warm=False, scan_interval=0.5, cache_dir=base / "cache", workers=1) as srv:
        srv.app.state.viz.index.wait_for_scan()
        yield {"server": srv, "seeds": seeds, "outside": outside, "client": client, "srvrun": server}


def test_linked_inputs_are_never_served_by_any_route(linked_world: dict[str, Any]) -> None:
    srv: VizServer = linked_world["server"]
    keys = _run_keys(srv)
    assert {"clinks", "slinks"} <= set(keys), keys
    paths = ["/"]
    for run, task, n in (("clinks", "ebench/t/a", 6), ("slinks", "ebench/k/d", 5)):
        k = keys[run]
        paths += [f"/run/{k}", f"/run/{k}?failures=1", f"/live/{k}", f"/live/{k}/0/state.json",
                  f"/live/{k}/0/left_camera.jpg"]
        for seed in [*map(str, range(n)), "9"]:
            paths += [f"/episode/{k}/{task}/{seed}", f"/rrd/{k}/{task}/{seed}/recording.rrd"]
        paths += [f"/episode/{k}/ebench/t/linkedtask/0", f"/rrd/{k}/ebench/t/linkedtask/0/recording.rrd"]
    for name, k in keys.items():
        if name not in ("clinks", "slinks"):
            paths += [f"/run/{k}", f"/episode/{k}/ebench/t/b/0", f"/rrd/{k}/ebench/t/b/0/recording.rrd"]
    leaks: list[str] = []
    statuses: dict[int, int] = {}
    for path in paths:
        status, body = _get(srv, path)
        statuses[status] = statuses.get(status, 0) + 1
        if LINK_SECRET.encode() in body:
            leaks.append(f"{status} {path}")
    print(f"\nviz linked-input requests: {len(paths)}, statuses {dict(sorted(statuses.items()))}, "
          f"leaks {len(leaks)}")
    assert not leaks, "\n".join(leaks)
    assert statuses.get(500, 0) == 0, statuses
    # a linked cache was replaced by a real build (the link, not its target)
    ep = linked_world["client"] / "ebench/t/a" / linked_world["seeds"][("client", ".genmanip_vis.rrd")]
    assert not (ep / ".genmanip_vis.rrd").is_symlink()
    assert (linked_world["outside"] / "secret.bin").read_bytes() == LINK_SECRET.encode() * 32
    assert sorted(p.name for p in linked_world["outside"].iterdir() if p.is_file()) == [
        "secret.bin", "secret.json", "secret.jsonl", "secret.pkl"]


def test_rrd_builds_keep_the_build_process_bounded(linked_world: dict[str, Any], tmp_path: Path) -> None:
    """32 recordings built through the server's pool (one build process): its thread count stays
    flat (before the fix: +4 per build, 14 -> 142 over 32 builds)."""
    srv: VizServer = linked_world["server"]
    write_client_run(linked_world["client"].parent.parent, "ebench", "many",
                     tasks={"ebench/t/m": [1.0] * 32}, steps=3, size=(32, 24))
    srv.app.state.viz.index.request_scan()
    deadline = time.monotonic() + 60
    while "many" not in _run_keys(srv) and time.monotonic() < deadline:
        time.sleep(0.3)
    key = _run_keys(srv)["many"]
    pool = srv.app.state.viz.pool
    counts = []
    for seed in range(32):
        status, body = _get(srv, f"/rrd/{key}/ebench/t/m/{seed}/recording.rrd")
        assert status == 200 and body[:4] == b"RRF2", (seed, status)
        (pid,) = list(pool._executor._processes)
        counts.append(len(os.listdir(f"/proc/{pid}/task")))
    print(f"\nbuild process threads over 32 builds: first {counts[0]}, max {max(counts)}, last {counts[-1]}")
    assert max(counts) - counts[0] <= 2, counts
