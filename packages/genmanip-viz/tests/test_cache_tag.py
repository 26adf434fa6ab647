"""The viewer's cache lives in gmp's cache directory, tagged as gmp's when viz creates it, so that
``gmp clean`` (which empties only a tagged cache directory) can prove the directory is gmp's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from genmanip_results.layout import CACHE_DIR_TAG
from genmanip_results.provenance import is_gmp_cache_dir
from genmanip_runtime.testing import isolate_environment
from genmanip_viz.assets import cache_root, ensure_cache_root
from genmanip_viz.tls import ensure_certificate


def _tagged(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return is_gmp_cache_dir(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("via", ["GMP_CACHE_DIR", "XDG_CACHE_HOME"])
def test_a_cache_viz_creates_is_tagged_as_gmps(
    via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_environment(monkeypatch, tmp_path)
    if via == "GMP_CACHE_DIR":
        monkeypatch.setenv("GMP_CACHE_DIR", str(tmp_path / "gmp-cache"))
        gmp_cache = tmp_path / "gmp-cache"
    else:
        gmp_cache = tmp_path / "cache" / "genmanip"
    assert not gmp_cache.exists()
    # The HTTPS certificate is the first thing `gmp viz --host 0.0.0.0` writes to the cache.
    cert, key = ensure_certificate("192.168.7.9")
    assert cert.parent == key.parent == cache_root() == gmp_cache / "viz"
    assert (gmp_cache / CACHE_DIR_TAG).is_file()
    assert _tagged(gmp_cache)
    assert ensure_cache_root() == gmp_cache / "viz"  # again: nothing changes
    assert _tagged(gmp_cache)


def test_an_existing_directory_is_not_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache directory viz did not create (the user's own) is used but never tagged: only a
    directory gmp created carries the tag; a directory the caller names is used as it is."""
    isolate_environment(monkeypatch, tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("user data")
    monkeypatch.setenv("GMP_CACHE_DIR", str(mine))
    root = ensure_cache_root()
    assert root == mine / "viz" and root.is_dir()
    assert not (mine / CACHE_DIR_TAG).exists() and not _tagged(mine)
    chosen = tmp_path / "chosen" / "deeper"
    assert ensure_cache_root(chosen) == chosen and chosen.is_dir()
    assert not (tmp_path / "chosen" / CACHE_DIR_TAG).exists()
    assert not (chosen / CACHE_DIR_TAG).exists()
