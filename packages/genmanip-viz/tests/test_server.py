from __future__ import annotations

import http.client
import os
import re
import socket
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
from genmanip_viz.errors import PortInUseError
from genmanip_viz.server import VizServer, bind_socket

from .conftest import XSS_INSTRUCTION, XSS_TASK


def _raw_get(server: VizServer, path: str, host: str | None = None) -> tuple[int, bytes]:
    """GET with the path sent verbatim (requests would normalize ``..``)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or f"localhost:{server.port}")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _keys(server: VizServer) -> dict[str, str]:
    html = requests.get(server.base_url + "/", timeout=30).text
    return {
        m.group(2): m.group(1) for m in re.finditer(r'href="/run/([0-9a-f]{12})">([^<]+)</a>', html)
    }


def test_runs_page_lists_both_layouts_escaped(server: VizServer) -> None:
    r = requests.get(server.base_url + "/", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert set(_keys(server)) == {"run_a", "run_b", "srv_run"}
    assert "66.7%" in r.text  # run_a: 4 of 6
    assert "live" in r.text and "/live/" in r.text
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_run_page_tables_dots_failures_and_compare(server: VizServer) -> None:
    keys = _keys(server)
    r = requests.get(f"{server.base_url}/run/{keys['run_a']}", timeout=30)
    assert r.status_code == 200
    html = r.text
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count('class="dot ') == 6
    assert "ebench/table" in html and "ebench/xss" in html  # suites
    fail = requests.get(f"{server.base_url}/run/{keys['run_a']}?failures=1", timeout=30).text
    # failures: lift seed 2 (score 0) and push seed 0 (score 0.5)
    assert fail.count('class="dot ') == 2
    cmp = requests.get(
        f"{server.base_url}/run/{keys['run_a']}?compare={keys['run_b']}", timeout=30
    ).text
    assert "4 shared episodes" in cmp
    assert "+100.0 pp" in cmp and "Flipped seeds (3)" in cmp
    assert (
        requests.get(
            f"{server.base_url}/run/{keys['run_a']}?compare=ffffffffffff", timeout=30
        ).status_code
        == 404
    )


@pytest.mark.slow
def test_episode_page_and_recording(server: VizServer) -> None:
    keys = _keys(server)
    url = f"{server.base_url}/episode/{keys['run_a']}/{quote(XSS_TASK)}/0"
    r = requests.get(url, timeout=30)
    assert r.status_code == 200
    assert (
        "<script>alert(" not in r.text
        and "&lt;/script&gt;&lt;script&gt;alert(&#x27;instr&#x27;)" in r.text
    )
    assert "<img src=x" not in r.text
    rrd = re.search(r'data-rrd="([^"]+)"', r.text)
    assert rrd is not None
    rrd_url = rrd.group(1).replace("&amp;", "&")
    assert rrd_url.endswith("/recording.rrd")
    got = requests.get(server.base_url + rrd_url, timeout=120)
    assert got.status_code == 200 and got.content[:4] == b"RRF2"
    lift = requests.get(
        f"{server.base_url}/episode/{keys['run_a']}/ebench/table/lift/1", timeout=30
    ).text
    assert 'id="prev"' in lift and 'id="next"' in lift
    assert f"/episode/{keys['run_a']}/ebench/table/lift/0" in lift
    assert f"/episode/{keys['run_a']}/ebench/table/lift/2" in lift


@pytest.mark.parametrize(
    "path",
    [
        "/rrd/{k}/../../../../etc/passwd",
        "/rrd/{k}/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/rrd/{k}/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd/recording.rrd",
        "/rrd/{k}//etc/passwd/recording.rrd",
        "/rrd/{k}/%2Fetc%2Fpasswd/recording.rrd",
        "/episode/{k}/ebench/table/lift/0%00",
        "/episode/{k}/../../../etc/passwd",
        "/viewer/..%2F..%2Fetc%2Fpasswd",
        "/viewer/%2e%2e",
        "/static/..%2Fserver.py",
        "/static/../../__init__.py",
        "/live/{k}/..%2F..%2F/state.json",
        "/live/{k}/1/..%2F..%2Fsecret.jpg",
        "/live/{k}/%2e%2e/left_camera.jpg",
        "/run/../../etc",
    ],
)
def test_no_path_leaves_the_root(server: VizServer, path: str) -> None:
    k = _keys(server)["srv_run"]
    status, body = _raw_get(server, path.format(k=k))
    assert status in (400, 404), (status, body[:200])
    assert b"root:" not in body and b"import" not in body


def test_symlink_out_of_root_is_not_served(tree: Path, viz_cache: Path, tmp_path: Path) -> None:
    srv = next(p for p in tree.rglob("srv_run") if p.is_dir())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stolen.jpg").write_bytes(b"\xff\xd8secret")
    link = srv / ".live" / "1" / "stolen.jpg"
    os.symlink(outside / "stolen.jpg", link)
    wlink = srv / ".live" / "evil"
    os.symlink(outside, wlink)
    try:
        with VizServer(tree, cache_dir=viz_cache, warm=False) as s:
            s.app.state.viz.index.wait_for_scan()  # type: ignore[attr-defined]
            k = _keys(s)["srv_run"]
            assert (
                requests.get(f"{s.base_url}/live/{k}/1/stolen.jpg", timeout=30).status_code == 404
            )
            assert (
                requests.get(f"{s.base_url}/live/{k}/evil/stolen.jpg", timeout=30).status_code
                == 404
            )
            ok = requests.get(f"{s.base_url}/live/{k}/1/left_camera.jpg", timeout=30)
            assert ok.status_code == 200 and ok.content[:2] == b"\xff\xd8"
    finally:
        link.unlink()
        wlink.unlink()


def test_live_page_and_endpoints(server: VizServer) -> None:
    k = _keys(server)["srv_run"]
    page = requests.get(f"{server.base_url}/live/{k}", timeout=30)
    assert page.status_code == 200
    assert (
        'data-src="/live/' in page.text
        and "left_camera.jpg" in page.text
        and "top_camera.jpg" in page.text
    )
    st = requests.get(f"{server.base_url}/live/{k}/1/state.json", timeout=30)
    assert st.status_code == 200 and st.json()["step"] == 7
    assert st.json()["instruction"] == XSS_INSTRUCTION  # JSON data, rendered via textContent
    img = requests.get(f"{server.base_url}/live/{k}/1/top_camera.jpg", timeout=30)
    assert img.status_code == 200 and img.headers["content-type"] == "image/jpeg"
    assert img.headers["cache-control"] == "no-store"
    assert requests.get(f"{server.base_url}/live/{k}/2/state.json", timeout=30).status_code == 404
    assert requests.get(f"{server.base_url}/live/{k}/1/nope.jpg", timeout=30).status_code == 404


def test_only_get_and_no_cors(server: VizServer) -> None:
    r = requests.post(server.base_url + "/", data=b"x", timeout=30)
    assert r.status_code == 405
    r = requests.options(
        server.base_url + "/", headers={"Origin": "http://evil.example"}, timeout=30
    )
    assert r.status_code == 405 and "access-control-allow-origin" not in {
        k.lower() for k in r.headers
    }
    r = requests.get(server.base_url + "/", headers={"Origin": "http://evil.example"}, timeout=30)
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}


def test_loopback_rejects_foreign_host_header(server: VizServer) -> None:
    # Browsers reach 0.0.0.0 as this machine, yet a page can name it: refused like any name.
    for bad in ("evil.example:80", f"0.0.0.0:{server.port}", "localhost.evil.example"):
        assert _raw_get(server, "/", host=bad)[0] == 421, bad
    # The one loopback rule (genmanip_runtime.netpolicy): all of 127.0.0.0/8, not only .1.
    for ok in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "localhost",
               f"127.0.0.2:{server.port}", f"[::1]:{server.port}", f"LOCALHOST:{server.port}"):
        assert _raw_get(server, "/", host=ok)[0] == 200, ok


def test_token_cookie_flow(tree: Path, viz_cache: Path) -> None:
    with VizServer(tree, token="s3cret-tok", cache_dir=viz_cache, warm=False) as s:
        base = f"http://127.0.0.1:{s.port}"
        r = requests.get(base + "/", timeout=30, allow_redirects=False)
        assert r.status_code == 401 and "s3cret-tok" not in r.text
        assert requests.get(base + "/?access_token=wrong", timeout=30).status_code == 401
        sess = requests.Session()
        r = sess.get(
            base + "/run/x?access_token=s3cret-tok&failures=1", timeout=30, allow_redirects=False
        )
        assert r.status_code == 303 and r.headers["location"] == "/run/x?failures=1"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        r = sess.get(base + "/", timeout=30)
        assert r.status_code == 200 and "Runs" in r.text
        r = requests.get(base + "/", headers={"Authorization": "Bearer s3cret-tok"}, timeout=30)
        assert r.status_code == 200
        # every route is protected, including the viewer files and recordings
        assert requests.get(base + "/viewer/index.html", timeout=30).status_code == 401
        assert requests.get(base + "/static/app.js", timeout=30).status_code == 401


@pytest.mark.slow
def test_viewer_assets_served_offline(server: VizServer) -> None:
    r = requests.get(server.base_url + "/viewer/index.html", timeout=120)
    assert r.status_code == 200
    assert "re_viewer.js" in r.text and "fonts.googleapis" not in r.text
    assert "'wasm-unsafe-eval'" in r.headers["content-security-policy"]
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    w = requests.get(server.base_url + "/viewer/re_viewer_bg.wasm", timeout=120, stream=True)
    assert w.status_code == 200 and w.headers["content-type"] == "application/wasm"
    assert (
        w.headers.get("content-encoding") == "gzip"
        and int(w.headers["rerun-final-length"]) > 1_000_000
    )
    w.close()
    assert requests.get(server.base_url + "/viewer/sw.js", timeout=30).status_code == 404


def test_bind_socket_tries_next_ports() -> None:
    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        nxt = bind_socket("127.0.0.1", port, tries=5)
        assert port < nxt.getsockname()[1] <= port + 4
        nxt.close()
        with pytest.raises(PortInUseError):
            bind_socket("127.0.0.1", port, tries=1)
    finally:
        first.close()
    s = socket.socket()
    s.close()


def test_scan_failure_is_reported_not_hidden(
    tmp_path: Path, viz_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from genmanip_results import discovery as results

    def boom(self: object, **kw: object) -> list[object]:
        raise OSError("disk on fire")

    monkeypatch.setattr(results.RunScanner, "scan", boom)
    with VizServer(tmp_path, cache_dir=viz_cache, warm=False) as s:
        r = requests.get(s.base_url + "/", timeout=30)
    assert r.status_code == 500 and "disk on fire" in r.text
