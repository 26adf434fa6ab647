"""``gmp report``'s comparison says which run is subtracted from which, and its links to ``gmp
viz`` address runs by the one run key (:func:`genmanip_results.discovery.run_key`)."""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

from genmanip_artifacts.report import build_report
from genmanip_results.discovery import load_run
from genmanip_results.testing import write_client_run

MINUS = "\N{MINUS SIGN}"  # the label's sign, as rendered from &minus;


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "proj" / "client_results"
    a = write_client_run(results, "bench", "a", tasks={"bench/t/x": [1.0, 0.0, 0.0, 0.0]},
                         videos=False, start=1.0)  # fmt: skip
    b = write_client_run(results, "bench", "b", tasks={"bench/t/x": [1.0, 1.0, 1.0, 0.0]},
                         videos=False, start=2.0)  # fmt: skip
    return a, b


def test_the_delta_is_labelled_b_minus_a(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    out = tmp_path / "report.html"
    build_report([load_run(a), load_run(b)], out, thumbnails=False)
    page = html.unescape(out.read_text(encoding="utf-8"))
    m = re.search(r"<b id=compare-delta>(.*?)</b>", page)
    assert m is not None
    # A = bench/a (1 of 4), B = bench/b (3 of 4): B - A = +50 points, and it says so.
    assert m.group(1) == f"Δ success (B {MINUS} A): +50.0 pp"
    assert "A = bench/a, B = bench/b" in page
    assert f"<th class=num>Δ success (B {MINUS} A) pp [95%]</th>" in page


def test_viz_links_use_the_run_key_of_the_path_under_the_viz_root(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    out = tmp_path / "report.html"
    build_report([load_run(a), load_run(b)], out, thumbnails=False,
                 viz_url="http://127.0.0.1:1/", viz_root=tmp_path / "proj")  # fmt: skip
    links = set(re.findall(r'href="http://127\.0\.0\.1:1/episode/([0-9a-f]{12})/([^"]+)"',
                           out.read_text(encoding="utf-8")))  # fmt: skip
    key_a = hashlib.sha256(b"client_results/bench/a").hexdigest()[:12]
    key_b = hashlib.sha256(b"client_results/bench/b").hexdigest()[:12]
    assert links == {(key_a, "bench/t/x/1"), (key_a, "bench/t/x/2"), (key_a, "bench/t/x/3"),
                     (key_b, "bench/t/x/3")}  # fmt: skip
