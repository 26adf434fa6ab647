"""Every ``bench/*.py`` script runs to the end at a tiny size and prints its table.

The figures in docs/ are only as good as the scripts that print them: this keeps the scripts from
rotting between measurements. Nothing here times anything (benchmarks are not timed tests).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "codec.py": ["--repeats", "2"],
    "plots.py": ["--steps", "50", "--baseline-frames", "5", "--repeats", "1"],
    "protocol_core.py": ["3", "3"],
    "ray_launcher.py": ["--episodes", "2", "--num-steps", "3", "--repeats", "1"],
    "recording_cost.py": ["--steps", "5", "--episodes", "1", "--workers", "2", "--viz-steps", "8"],
    "sequential_test.py": ["--sims", "20", "--seeds", "40"],
    "step_overhead.py": ["--steps", "10"],
    "testbed.py": ["--steps", "3"],
    "transport.py": ["--calls", "10"],
    "viz.py": ["--steps", "30", "--runs", "3", "--episodes", "2", "--repeats", "1", "--samples", "2"],
    "zero_idle.py": ["--episodes", "4", "--num-steps", "3", "--workers", "2"],
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_bench_script_is_covered() -> None:
    scripts = {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(TINY)


@pytest.mark.parametrize("script", sorted(TINY))
def test_bench_script_runs_and_prints_a_table(script: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *TINY[script]],
        cwd=tmp_path, capture_output=True, text=True, timeout=280, check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("|")]
    assert len(rows) >= 3 and any(set(r) <= set("|-: ") for r in rows), p.stdout[-2000:]
