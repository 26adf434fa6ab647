"""Time-of-check/time-of-use: a thread keeps swapping a directory for a symlink to a user's
directory while ``gmp clean`` plans and deletes, many rounds. The user's directory holds genuine
gmp outputs (provable *there*), so only the no-follow descriptor walk keeps them alive: nothing
outside the root may ever be deleted, and every user file stays byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_artifacts import execute_clean, plan_clean
from genmanip_results.provenance import (
    CATEGORY_PLOTS,
    CATEGORY_VIEWER_CACHE,
    ensure_cache_dir,
    write_generated,
)

ROUNDS_S = 2.5  # wall time per scenario
MIN_ROUNDS = 20
GENERATED = {
    "state_plot.png": CATEGORY_PLOTS,
    "action_plot.png": CATEGORY_PLOTS,
    "plot.log": CATEGORY_PLOTS,
    ".genmanip_vis.rrd": CATEGORY_VIEWER_CACHE,
}


def _fill(d: Path, tag: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, category in GENERATED.items():
        if not (d / name).exists():
            write_generated(d / name, f"{tag}:{name}".encode(), category=category, by="test")


def _hashes(base: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for dirpath, _dirnames, filenames in os.walk(base):
        for n in filenames:
            p = Path(dirpath, n)
            out[os.path.relpath(p, base)] = (
                "link" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
            )
    return out


class Swapper(threading.Thread):
    """Swaps ``target`` (a real directory) for a symlink to ``victim`` and back, forever, holding
    ``lock`` during each swap (so the test can refill the real directory between swaps)."""

    def __init__(self, target: Path, victim: Path, lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.target, self.victim, self.lock = target, victim, lock
        self.hidden = target.with_name(target.name + ".real")
        self.stop = threading.Event()
        self.swaps = 0

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                os.rename(self.target, self.hidden)
                os.symlink(self.victim, self.target, target_is_directory=True)
                time.sleep(0.0002)
                os.unlink(self.target)
                os.rename(self.hidden, self.target)
                self.swaps += 1
            time.sleep(0)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    # Hand the GIL over often, so the swapper really interleaves with the walk.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def _scenario(tmp_path: Path, level: str) -> tuple[Path, Path, Path, Path, list[Path]]:
    """(root, cache, swapped directory, victim, directories to refill)."""
    root = tmp_path / "proj"
    cache = ensure_cache_dir(tmp_path / "cache")
    run = root / "client_results" / "bench" / "r1"
    (run).mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "benchmark": "bench"}))
    eps = [run / "bench" / "t" / f"{i:03d}" for i in range(3)]
    for ep in eps:
        ep.mkdir(parents=True)
        (ep / "result.json").write_text(json.dumps({"score": 1.0, "sr": 1.0}))
    victim = tmp_path / "home" / "user"
    if level == "episode":
        swapped = eps[1]
    elif level == "task":
        swapped = run / "bench" / "t"
    else:  # gmp's cache subdirectory whose contents clean empties
        swapped = cache / "meshes"
        swapped.mkdir(parents=True)
    # The victim mirrors whatever the swapped directory holds, as genuine gmp outputs.
    for sub in ("", "000", "001", "002"):
        _fill(victim / sub, "victim")
        (victim / sub / "thesis.tex").parent.mkdir(parents=True, exist_ok=True)
        (victim / sub / "thesis.tex").write_text("the user's own work")
    return root, cache, swapped, victim, eps


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", ["episode", "task", "cache"])
def test_swapping_a_directory_for_a_symlink_never_deletes_outside(
    tmp_path: Path, level: str, fast_switching: None
) -> None:
    root, cache, swapped, victim, eps = _scenario(tmp_path, level)
    outside = tmp_path / "home"
    before = _hashes(outside)
    lock = threading.Lock()
    swapper = Swapper(swapped, victim, lock)

    def refill() -> None:
        with lock:  # the swapped directory is real while the lock is held
            for ep in eps:
                _fill(ep, "gmp")
            if level == "cache":
                (swapped / "pack").mkdir(exist_ok=True)
                (swapped / "pack" / "mesh.obj").write_text("mesh")
                (swapped / "top.obj").write_text("mesh")

    refill()
    swapper.start()
    rounds = removed = refusals = 0
    deadline = time.monotonic() + ROUNDS_S
    try:
        while time.monotonic() < deadline or rounds < MIN_ROUNDS:
            refill()
            plan = plan_clean(root, plots=True, all_caches=True, cache_dir=cache)
            report = execute_clean(plan)
            removed += len(report.removed)
            refusals += len(report.failed) + len(report.refused)
            rounds += 1
            assert _hashes(outside) == before, f"round {rounds}: a user file changed"
    finally:
        swapper.stop.set()
        swapper.join(10)
    assert _hashes(outside) == before
    assert rounds >= MIN_ROUNDS and swapper.swaps > rounds
    assert removed > 0  # the rounds did delete gmp's own files inside the root
    # Every failure was reported, not raised; gmp's files inside the root are still cleanable.
    refill()
    report = execute_clean(plan_clean(root, plots=True, all_caches=True, cache_dir=cache))
    assert report.failed == [] and report.removed
