"""The real ``gmp`` command end to end, per subcommand (moved here from the packages' own tests:
they need the meta package, which no package's ``test`` extra may pull in).

Fixtures: an isolated environment for every test here and throwaway TLS files
(:mod:`genmanip_runtime.testing`), light run trees of both layouts
(:mod:`genmanip_results.testing`): the same code the packages' own conftests build on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from genmanip_results.layout import RESULTS_DIR_ENV
from genmanip_results.testing import make_client_run, make_server_run
from genmanip_runtime.testing import TLSFiles, isolate_environment, make_tls_files


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never read the developer's config file, cache or tokens (the gmp children inherit this).
    isolate_environment(monkeypatch, tmp_path, unset=[RESULTS_DIR_ENV])


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost (trustme)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project directory (a server-layout results root)."""
    p = tmp_path / "project"
    p.mkdir()
    return p


@pytest.fixture
def server_run() -> Callable[..., Path]:
    """The :func:`genmanip_results.testing.make_server_run` builder."""
    return make_server_run


@pytest.fixture
def client_run() -> Callable[..., Path]:
    """The :func:`genmanip_results.testing.make_client_run` builder."""
    return make_client_run
