"""Fixtures: light run trees of both layouts (:mod:`genmanip_results.testing`), an isolated
environment and throwaway TLS files (:mod:`genmanip_runtime.testing`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from genmanip_results.layout import RESULTS_DIR_ENV
from genmanip_results.testing import make_client_run, make_server_run
from genmanip_runtime.testing import TLSFiles, isolate_environment, make_tls_files


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    return p


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never read the developer's config file, cache or tokens.
    isolate_environment(monkeypatch, tmp_path, unset=[RESULTS_DIR_ENV])


@pytest.fixture
def server_run():
    """The :func:`make_server_run` builder."""
    return make_server_run


@pytest.fixture
def client_run():
    """The :func:`make_client_run` builder."""
    return make_client_run


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost (trustme)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))
