from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from genmanip_results.discovery import find_runs, load_run
from genmanip_results.stats import wilson_interval
from genmanip_results.testing import write_client_run, write_live_worker
from genmanip_viz.index import (
    ResultsIndex,
    _make_view,
    compare_runs,
    episode_rel,
    group_stats,
    live_workers,
    run_key,
)

from .conftest import XSS_INSTRUCTION, XSS_TASK


def _view(tree: Path, run: str):
    run_dir = next(p for p in tree.rglob(run) if p.is_dir())
    return _make_view(tree, load_run(run_dir), time.time())


def test_wilson_interval_values() -> None:
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4)
    assert hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)


def test_group_stats_of_run_a(tree: Path) -> None:
    v = _view(tree, "run_a")
    st = v.stats
    assert st is not None
    # lift 1,1,0 ; push 0.5,1 ; xss 1  -> 6 complete, successes = 4 (score 0.5 is not a success)
    assert st.n == 6
    assert st.successes == 4
    assert st.sr == pytest.approx(4 / 6)
    assert st.ci == pytest.approx(wilson_interval(4, 6))
    assert st.mean_score == pytest.approx((1 + 1 + 0 + 0.5 + 1 + 1) / 6)
    empty = group_stats([])
    assert empty.n == 0 and empty.sr is None and empty.mean_score is None and empty.ci == (0.0, 1.0)


def test_view_addresses_and_neighbours(tree: Path) -> None:
    v = _view(tree, "run_a")
    assert v.key == run_key(v.rel) and len(v.key) == 12 and v.rel == "client_results/ebench/run_a"
    assert v.order == sorted(v.order, key=lambda r: (r.rsplit("/", 1)[0], int(r.rsplit("/", 1)[1])))
    assert "ebench/table/lift/0" in v.episodes and f"{XSS_TASK}/0" in v.episodes
    prev_rel, next_rel = v.neighbours("ebench/table/lift/1")
    assert (prev_rel, next_rel) == ("ebench/table/lift/0", "ebench/table/lift/2")
    assert v.neighbours(v.order[0])[0] is None and v.neighbours(v.order[-1])[1] is None
    assert v.neighbours("nope/0") == (None, None)
    assert all(episode_rel(e) == r for r, e in v.episodes.items())


def test_compare_runs_on_shared_seeds(tree: Path) -> None:
    a, b = _view(tree, "run_a"), _view(tree, "run_b")
    cmp = compare_runs(a, b)
    # shared complete: lift 0,1,2 and push 0 (push 1 is incomplete in b; xss task only in a)
    assert cmp.shared == 4
    assert cmp.tasks == [
        ("ebench/table/lift", 3, pytest.approx(2 / 3), pytest.approx(2 / 3), pytest.approx(0.0)),
        ("ebench/table/push", 1, 0.0, 1.0, 1.0),
    ]
    assert cmp.flipped == [
        ("ebench/table/lift", "1", True, False),
        ("ebench/table/lift", "2", False, True),
        ("ebench/table/push", "0", False, True),
    ]
    assert cmp.sr_a == pytest.approx(2 / 4) and cmp.sr_b == pytest.approx(3 / 4)


def test_live_workers(tree: Path, tmp_path: Path) -> None:
    srv = next(p for p in tree.rglob("srv_run") if p.is_dir())
    # the session tree may be minutes old by now: judge freshness relative to its files
    now = (srv / ".live" / "1" / "live.json").stat().st_mtime + 1.0
    ws = live_workers(srv, now=now)
    assert [w.worker_id for w in ws] == ["1"]
    assert ws[0].cameras == ("left_camera", "top_camera") and ws[0].fresh
    assert ws[0].state["step"] == 7
    assert live_workers(srv, now=now + 3600)[0].fresh is False
    # hostile names in .live are ignored
    run = write_client_run(tmp_path, "b", "r", tasks={"t/x": [1.0]}, videos=False)
    write_live_worker(run, "ok")
    (run / ".live" / ".hidden").mkdir()
    (run / ".live" / "ok" / "bad name.jpg").write_bytes(b"x")
    assert [(w.worker_id, w.cameras) for w in live_workers(run)] == [
        ("ok", ("left_camera", "top_camera"))
    ]


def test_results_index_is_incremental(tmp_path: Path) -> None:
    root = tmp_path / "res"
    write_client_run(root, "b", "r1", tasks={"t/a": [1.0, 0.0]}, videos=False)
    idx = ResultsIndex(root, min_interval=0.0)
    try:
        snap = idx.wait_for_scan()
        assert snap is not None and [v.info.run_id for v in snap.runs] == ["r1"]
        assert snap.runs[0].stats.n == 2  # type: ignore[union-attr]
        write_client_run(root, "b", "r2", tasks={"t/a": [1.0]}, videos=False, start=time.time() + 5)
        snap = idx.wait_for_scan()
        assert snap is not None and sorted(v.info.run_id for v in snap.runs) == ["r1", "r2"]
        assert set(snap.by_key) == {v.key for v in snap.runs}
        # snapshot() never waits long once a scan exists
        t0 = time.perf_counter()
        assert idx.snapshot(wait=0.0) is not None
        assert time.perf_counter() - t0 < 0.5
    finally:
        idx.close()


def test_discovery_agrees_with_protocol_results(tree: Path) -> None:
    srv_dir = next(p for p in tree.rglob("srv_run") if p.is_dir())
    write_live_worker(  # refresh (same content as conftest writes)
        srv_dir,
        "1",
        episode_id="ebench/srv_run/ebench/kitchen/open_drawer/2",
        instruction=XSS_INSTRUCTION,
    )  #: the session tree may be older than LIVE_FRESH_S
    idx = ResultsIndex(tree)
    try:
        snap = idx.wait_for_scan()
        assert snap is not None
        expected = find_runs(tree)
        assert [str(v.info.path) for v in snap.runs] == [str(r.path) for r in expected]
        assert {v.info.layout for v in snap.runs} == {"client", "server"}
        srv = next(v for v in snap.runs if v.info.run_id == "srv_run")
        assert srv.live and [w.worker_id for w in srv.workers] == ["1"]
        assert srv.stats.n == 2 and srv.stats.successes == 1  # type: ignore[union-attr]
        assert not math.isnan(srv.stats.mean_score or 0.0)  # type: ignore[union-attr]
    finally:
        idx.close()
