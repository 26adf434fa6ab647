"""The real writers register what they generate, and ``gmp clean`` removes exactly that.

Across packages: the results browser's recording builder (genmanip-viz) and ``gmp plot``
(genmanip-artifacts) write into the same episode directory; clean (genmanip-artifacts) proves
each file through genmanip_results.provenance and leaves the tree as it was before either ran.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from genmanip_artifacts import execute_clean, plan_clean, plot_episode
from genmanip_results.discovery import load_episode
from genmanip_results.testing import write_client_run
from genmanip_viz.recording import RRD_NAME, SIDECAR_NAME, build_recording


def _hashes(base: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(base):
        for n in files:
            p = Path(dirpath, n)
            out[os.path.relpath(p, base)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_viewer_cache_and_plots_are_registered_and_cleaned(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    run = write_client_run(
        root / "client_results", "b", "r", tasks={"t/lift": [1.0]}, steps=12,
        cameras=("left_camera",),
    )  # fmt: skip
    ep_dir = run / "t/lift/0"
    before = _hashes(root)
    build_recording(load_episode(ep_dir))
    plot_episode(ep_dir, video=False)
    made = set(_hashes(root)) - set(before)
    rel = os.path.relpath(ep_dir, root)
    assert {f"{rel}/{n}" for n in (RRD_NAME, SIDECAR_NAME, ".gmp-generated.jsonl")} <= made

    plan = plan_clean(root, plots=True, cache_dir=tmp_path / "cache")
    assert {i.path.name for i in plan.items} == {
        RRD_NAME, SIDECAR_NAME, "state_plot.png", "action_plot.png", "plot.log"
    }  # fmt: skip
    assert plan.refused == []
    report = execute_clean(plan)
    assert report.failed == [] and len(report.removed) == 5
    assert _hashes(root) == before
