from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from genmanip_results.testing import (
    robot_cameras,
    server_run_dir,
    write_client_episode,
    write_server_episode,
)


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
        lambda root: write_client_episode(
            root / "bench" / "run1",
            "bench/suite/task_a",
            "000",
            steps=48,
            chunk=4,
            cameras=robot_cameras("manip/lift2/R5a"),
            extra_frames=1,
            instruction="pick up the red block and place it in the bowl",
        ),
    )
    dst = tmp_path / "results"
    shutil.copytree(src, dst, symlinks=True)
    return dst / "bench" / "run1" / "bench" / "suite" / "task_a" / "000"


@pytest.fixture
def franka_server_episode(_episode_store: Path, tmp_path: Path) -> Path:
    src = _cached(
        _episode_store,
        "franka_srv",
        lambda root: write_server_episode(
            server_run_dir(root, "ebench", "srv1"),
            "ebench/table_top/peg",
            "000",
            score=0.5,
            steps=20,
            robot_id="manip/franka/panda_hand",
            instruction="insert the peg",
            cameras={"obs_camera": (160, 120), "realsense": (160, 120)},
        ),
    )
    dst = tmp_path / "project"
    shutil.copytree(src, dst, symlinks=True)
    return (
        dst / "saved" / "eval_results" / "ebench" / "srv1" / "ebench" / "table_top" / "peg" / "000"
    )


class Commands:
    """``gmp plot`` and ``gmp clean`` without the meta package (which holds their parser): the
    handlers called the way gmp calls them, with the parser's default for every flag not given
    and a console on the current stderr. A GenmanipError propagates (gmp would print it and exit
    with its ``exit_code``): the tests check both."""

    @staticmethod
    def plot(
        *episodes: str | Path,
        run: list[str | Path] | None = None,
        jobs: int | None = None,
        out: str | Path | None = None,
        video: bool = True,
    ) -> int:
        from genmanip_artifacts.cli import plot
        from genmanip_runtime.console import Console

        return plot(
            episodes=[str(e) for e in episodes],
            run=None if run is None else [str(r) for r in run],
            jobs=jobs,
            out=None if out is None else str(out),
            video=video,
            console=Console(),
        )

    @staticmethod
    def clean_kwargs(root: str | Path = ".", **flags: object) -> dict[str, object]:
        """The keyword arguments of ``gmp clean --root ROOT`` plus ``flags`` (``yes=True``,
        ``cache_dir=...``), without ``console``: JSON-able, for a child process too."""
        kwargs: dict[str, object] = {"root": str(root), "plots": False, "results": False,
                                     "all": False, "force": False, "yes": False,
                                     "dry_run": False, "cache_dir": None, "videos": False}
        unknown = set(flags) - set(kwargs)
        assert not unknown, f"gmp clean has no flag for {sorted(unknown)}"
        kwargs.update({k: str(v) if isinstance(v, Path) else v for k, v in flags.items()})
        return kwargs

    @classmethod
    def clean(cls, root: str | Path = ".", **flags: object) -> int:
        from genmanip_artifacts.cli import clean
        from genmanip_runtime.console import Console

        return clean(**cls.clean_kwargs(root, **flags), console=Console())  # type: ignore[arg-type]


@pytest.fixture
def cmd() -> type[Commands]:
    """:class:`Commands`: ``cmd.plot(EPISODE_DIR, out=...)``, ``cmd.clean(ROOT, yes=True)``."""
    return Commands
