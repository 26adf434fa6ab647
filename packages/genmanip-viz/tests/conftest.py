from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_results.testing import write_client_run, write_live_worker, write_server_run
from genmanip_viz.server import VizServer

#: Hostile strings that must come out of every page escaped.
XSS_TASK = "ebench/xss/<img src=x onerror=alert(1)>"
XSS_INSTRUCTION = "</script><script>alert('instr')</script> & <b>bold</b>"


@pytest.fixture(scope="session")
def viz_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One viewer-asset cache for the whole session (the extraction takes a few seconds)."""
    return tmp_path_factory.mktemp("viz-cache")


@pytest.fixture(scope="session")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project root with both layouts: two client runs sharing seeds, one server run with a running
    episode (fresh lock) and a live worker, hostile task names and instructions."""
    root = tmp_path_factory.mktemp("project")
    results = root / "client_results"
    write_client_run(
        results, "ebench", "run_a",
        tasks={"ebench/table/lift": [1.0, 1.0, 0.0], "ebench/table/push": [0.5, 1.0], XSS_TASK: [1.0]},
        instruction=XSS_INSTRUCTION, start=1_700_000_000.0,
    )  # fmt: skip
    write_client_run(
        results, "ebench", "run_b",
        tasks={"ebench/table/lift": [1.0, 0.0, 1.0], "ebench/table/push": [1.0, float("nan")]},
        start=1_700_000_100.0,
    )  # fmt: skip
    srv = write_server_run(
        root, "ebench", "srv_run", tasks={"ebench/kitchen/open_drawer": [1.0, 0.25, float("nan")]}
    )
    write_live_worker(
        srv,
        "1",
        episode_id="ebench/srv_run/ebench/kitchen/open_drawer/2",
        instruction=XSS_INSTRUCTION,
    )
    return root


def _keep_live(tree: Path) -> None:
    """The tree is made once a session; its running server episode (a lock, a live worker) is
    live only while those are fresh (a lock: 300 s untouched, live frames: 60 s). Touch them, as
    the running server would, so a test sees the tree as it was made, however long the tests
    before it took."""
    for p in [*tree.rglob("*.lock"), *(f for f in tree.rglob("*") if ".live" in f.parts and f.is_file())]:
        os.utime(p)


@pytest.fixture
def server(tree: Path, viz_cache: Path) -> Iterator[VizServer]:
    _keep_live(tree)
    with VizServer(tree, cache_dir=viz_cache, warm=False, scan_interval=0.5) as s:
        s.app.state.viz.index.wait_for_scan()  # type: ignore[attr-defined]
        yield s
