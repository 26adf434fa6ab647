"""`gmp compare` and `gmp report` on two runs recorded for real: the testbed served over HTTP on
127.0.0.1, `genmanip_eval.run_eval` with the "zero" policy (A) and the "expert" policy (B) on the
same tasks and seeds. The numbers are checked against an independent computation from the
result files (exact binomial via math.comb for McNemar, Wilson from its formula); the report is
opened in the real headless Chromium with the network off, and its screenshot is kept in
``$GMP_SCREENSHOT_DIR`` (default: the test's tmp dir)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval.runner import EvalConfig, run_eval
from genmanip_results.discovery import load_run
from genmanip_testbed import serve_testbed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHROMIUM = os.environ.get("GMP_CHROMIUM", "/usr/bin/chromium")
TASKS = "testbed/reach"


def gmp(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "genmanip", *args], capture_output=True, text=True, env=full_env,
        stdin=subprocess.DEVNULL, timeout=300, check=False, cwd=cwd,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("compare")
    out: dict[str, Path] = {"base": base}
    for policy in ("zero", "expert"):
        with serve_testbed(tasks=(TASKS,), run_id=f"{policy}_run",
                           results_root=base / "server" / policy) as tb:
            summary = run_eval(EvalConfig(url=tb.url, policy=policy, worker_ids=["0", "1"],
                                          results_dir=str(base / "client_results")))
        assert summary.complete
        out[policy] = Path(summary.run_dirs[0])
    return out


def _results(run_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(task, seed) -> result.json, read straight from the files (not through discovery)."""
    out = {}
    for f in run_dir.rglob("result.json"):
        r = json.loads(f.read_text())
        out[(r["task_name"], str(r["seed"]))] = r
    return out


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def _mcnemar(b: int, c: int) -> float:
    m = b + c
    return 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m)


def test_compare_json_matches_an_independent_computation(runs: dict[str, Path]) -> None:
    res = gmp("compare", str(runs["zero"]), str(runs["expert"]), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    ra, rb = _results(runs["zero"]), _results(runs["expert"])
    keys = sorted(set(ra) & set(rb))
    assert len(keys) == 16 and out["overall"]["pairs"] == 16
    succ = lambda r: abs(float(r["score"]) - 1.0) < 1e-6  # noqa: E731 - the documented success rule
    groups: dict[str, list[tuple[str, str]]] = {"overall": keys}
    for k in keys:
        groups.setdefault(k[0], []).append(k)
    by_task = {t["task"]: t for t in out["tasks"]}
    assert set(by_task) == set(groups) - {"overall"}
    for name, ks in groups.items():
        got = out["overall"] if name == "overall" else by_task[name]
        a = [succ(ra[k]) for k in ks]
        b = [succ(rb[k]) for k in ks]
        a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
        b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
        n = len(ks)
        assert got["pairs"] == n
        assert got["table"]["a_only"] == a_only and got["table"]["b_only"] == b_only
        assert got["mcnemar_p"] == pytest.approx(_mcnemar(a_only, b_only), rel=1e-12)
        assert got["a"]["ci95"] == pytest.approx(list(_wilson(sum(a), n)))
        assert got["b"]["ci95"] == pytest.approx(list(_wilson(sum(b), n)))
        assert got["difference"] == pytest.approx((b_only - a_only) / n)
        lo, hi = got["difference_ci95"]
        assert -1 <= lo <= got["difference"] <= hi <= 1
        flipped = {(f["task"], f["seed"]) for f in got["flipped"]}
        assert flipped == {k for k, x, y in zip(ks, a, b, strict=True) if x != y}
        scores = [float(rb[k]["score"]) - float(ra[k]["score"]) for k in ks]
        assert got["score"]["difference"] == pytest.approx(sum(scores) / n)
    # The expert beats the zero policy on this testbed: a claim overall, and the sequential test
    # says "better" (B = expert) within the 16 pairs.
    assert out["overall"]["table"]["b_only"] > out["overall"]["table"]["a_only"]
    assert out["overall"]["claim"] == "better"
    assert out["sequential"]["decision"] == "better"
    assert out["multiplicity"].startswith("Holm")
    # Holm over the tasks, recomputed.
    ps = sorted((t["mcnemar_p"], t["task"]) for t in out["tasks"])
    running = 0.0
    for i, (p, task) in enumerate(ps):
        running = max(running, min(1.0, (len(ps) - i) * p))
        assert by_task[task]["p_holm"] == pytest.approx(running)


def test_compare_by_run_id_table_and_unpaired(runs: dict[str, Path], tmp_path: Path) -> None:
    # Run ids resolve under the current directory's results trees (client_results/).
    res = gmp("compare", "zero_run", "expert_run", cwd=runs["base"], env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\x1b" not in res.stderr
    assert "overall" in res.stdout and "sequential verdict" in res.stdout
    assert "Holm" in res.stdout and "Newcombe" in res.stdout
    assert "comparing" in res.stderr and "comparing" not in res.stdout
    # An episode only B has is counted apart, never paired.
    copy = tmp_path / "client_results" / "testbed"
    shutil.copytree(runs["zero"], copy / "zero_run")
    shutil.copytree(runs["expert"], copy / "expert_run")
    victim = next((copy / "zero_run").rglob("result.json")).parent
    shutil.rmtree(victim)
    res = gmp("compare", str(copy / "zero_run"), str(copy / "expert_run"), "--json")
    out = json.loads(res.stdout)
    assert out["overall"]["pairs"] == 15 and out["overall"]["only_b"] == 1
    assert gmp("compare", "no_such_run", "expert_run", cwd=runs["base"]).returncode == 4


def test_report_is_self_contained_and_renders_offline(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    res = gmp("report", str(runs["zero"]), str(runs["expert"]), "-o", str(out),
              "--viz-root", str(runs["base"]))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    html = out.read_text(encoding="utf-8")
    size = out.stat().st_size
    n_eps = len(load_run(runs["zero"]).episodes) + len(load_run(runs["expert"]).episodes)
    assert size < 40_000 + 8_000 * n_eps, size  # bounded: small thumbnails, inline SVG
    # No reference the browser would load: every src is a data: URL; links are relative (the
    # episode directories) or the gmp viz pages (anchors, never fetched); no CSS import or url().
    srcs = re.findall(r'\ssrc="([^"]*)"', html)
    assert srcs and all(u.startswith("data:image/jpeg;base64,") for u in srcs)
    for href in re.findall(r'\shref="([^"]*)"', html):
        assert href.startswith("http://127.0.0.1:55077/episode/") or "://" not in href, href
    for forbidden in ("@import", "url(", "<script", "<link", "<iframe"):
        assert forbidden not in html, forbidden
    for href in re.findall(r'href="([^":]*)/"', html):  # episode directory links resolve
        assert (out.parent / href.replace("%2F", "/")).is_dir(), href
    assert html.count("data:image/jpeg;base64,") >= 1
    assert "Paired comparison" in html and "Capability / generalization profile" in html

    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"Chromium not found at {CHROMIUM}: `apt-get install -y chromium` or set GMP_CHROMIUM")
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("GMP_SCREENSHOT_DIR") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        try:
            ctx = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
            page = ctx.new_page()
            page.on("request", lambda r: requests.append(r.url))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(out.as_uri(), wait_until="load")
            assert page.title().startswith("gmp report")
            assert page.locator("h2").count() >= 6
            assert page.locator("svg.plot").count() >= 2
            loaded = page.evaluate(
                "() => [...document.images].every(i => i.complete && i.naturalWidth === 160)")
            assert loaded
            page.screenshot(path=str(shots / "report.png"), full_page=True)
            page.emulate_media(media="print")
            page.screenshot(path=str(shots / "report-print.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    # The only network-visible request is the file itself (data: images are not requests).
    assert [u for u in requests if not u.startswith("data:")] == [out.as_uri()]
    assert (shots / "report.png").stat().st_size > 10_000
