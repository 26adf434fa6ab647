"""genmanip_runtime.testing: the isolated environment and the throwaway TLS files."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
from genmanip_runtime.config import config_path, load_config
from genmanip_runtime.testing import ISOLATED_UNSET, isolate_environment, make_tls_files


def test_isolate_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ISOLATED_UNSET, "MY_PACKAGE_DIR"):
        monkeypatch.setenv(var, "from-the-developer")
    isolate_environment(monkeypatch, tmp_path, unset=["MY_PACKAGE_DIR"])
    assert not any(var in os.environ for var in (*ISOLATED_UNSET, "MY_PACKAGE_DIR"))
    assert config_path() == tmp_path / "empty-config.toml"
    assert load_config() == {}
    assert os.environ["XDG_CACHE_HOME"] == str(tmp_path / "cache")
    assert os.environ["XDG_CONFIG_HOME"] == str(tmp_path / "xdg-config")


def test_make_tls_files(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path / "tls")
    assert {p.name for p in (tmp_path / "tls").iterdir()} == {"ca.pem", "server.pem", "server.key"}
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    client = ssl.create_default_context(cafile=str(files.ca))
    assert client.cert_store_stats()["x509_ca"] == 1
