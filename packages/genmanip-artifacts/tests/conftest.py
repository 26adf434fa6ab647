from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from genmanip_artifacts._synthetic import write_client_episode, write_server_episode


@pytest.fixture(scope="session")
def _episode_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("episodes")


def _cached(store: Path, name: str, make) -> Path:  # type: ignore[no-untyped-def]
    """Build an episode once per session (videos take a moment), hand out fresh copies."""
    src = store / name
    if not src.exists():
        make(src)
    return src


@pytest.fixture
def lift2_episode(_episode_store: Path, tmp_path: Path) -> Path:
    """A chunked (4) lift2 client-layout episode: 4 cameras, 48 steps, 12 frames + 1 trailing."""
    src = _cached(
        _episode_store,
        "lift2",
        lambda root: write_client_episode(root, n_steps=48, chunk=4, extra_frames=1),
    )
    dst = tmp_path / "results"
    shutil.copytree(src, dst, symlinks=True)
    return dst / "bench" / "run1" / "bench" / "suite" / "task_a" / "000"


@pytest.fixture
def franka_server_episode(_episode_store: Path, tmp_path: Path) -> Path:
    src = _cached(_episode_store, "franka_srv", lambda root: write_server_episode(root, n_steps=20))
    dst = tmp_path / "project"
    shutil.copytree(src, dst, symlinks=True)
    return (
        dst / "saved" / "eval_results" / "ebench" / "srv1" / "ebench" / "table_top" / "peg" / "000"
    )
