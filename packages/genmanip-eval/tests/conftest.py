from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_testbed import serve_testbed

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # Helper policies live next to the tests; spawned worker processes inherit sys.path.
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture()
def smoke(tmp_path: Path) -> Iterator[object]:
    """A testbed with the smoke task set (1 task, 2 episodes of 6 steps), both wires."""
    with serve_testbed(tasks=("testbed/smoke",), num_steps=6, results_root=tmp_path / "server") as tb:
        yield tb


@pytest.fixture()
def reach(tmp_path: Path) -> Iterator[object]:
    """A testbed with 8 short episodes (2 tasks x 4 seeds, 5 steps each)."""
    with serve_testbed(tasks=("testbed/reach/easy",), num_steps=5, results_root=tmp_path / "server") as tb:
        yield tb


def pytest_configure(config: pytest.Config) -> None:
    sys.path.insert(0, str(HERE))
