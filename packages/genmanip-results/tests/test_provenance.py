"""genmanip_results.provenance: what makes a generated file provably gmp's."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from genmanip_results import provenance
from genmanip_results.fdwalk import lstat_at, open_top
from genmanip_results.layout import CACHE_DIR_TAG, GENERATED_MANIFEST
from genmanip_results.provenance import (
    CATEGORY_PLOTS,
    ensure_cache_dir,
    is_gmp_cache_dir,
    is_gmp_tmp_name,
    prune_manifest,
    read_manifest,
    register_generated,
    register_partial,
    write_generated,
)


def _manifest(d: Path) -> provenance.Manifest:
    fd = open_top(d)
    try:
        return read_manifest(fd)
    finally:
        os.close(fd)


def _proves(d: Path, name: str, category: str = CATEGORY_PLOTS) -> bool:
    fd = open_top(d)
    try:
        return read_manifest(fd).proves(name, lstat_at(fd, name), category)
    finally:
        os.close(fd)


def test_written_file_is_proven_until_it_changes(tmp_path: Path) -> None:
    p = write_generated(tmp_path / "state_plot.png", b"png", category=CATEGORY_PLOTS, by="t")
    assert _proves(tmp_path, "state_plot.png")
    assert not _proves(tmp_path, "state_plot.png", "viewer-cache")
    rec = _manifest(tmp_path).records["state_plot.png"]
    assert rec.by == "t" and rec.size == 3 and not rec.partial
    os.utime(p, (1, 1))  # touched: no longer the file gmp wrote
    assert not _proves(tmp_path, "state_plot.png")
    write_generated(p, b"png2", category=CATEGORY_PLOTS)  # rewritten by gmp: the newest record
    assert _proves(tmp_path, "state_plot.png")


def test_register_reports_what_it_could_not_record(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert not register_generated(tmp_path / "missing.png", category=CATEGORY_PLOTS)
    assert not register_generated(tmp_path / "d", category=CATEGORY_PLOTS)  # not a file
    assert not register_generated(tmp_path / "nodir" / "x", category=CATEGORY_PLOTS)
    (tmp_path / "a.png").write_bytes(b"a")
    (tmp_path / GENERATED_MANIFEST).symlink_to(tmp_path / "elsewhere.jsonl")
    assert not register_generated(tmp_path / "a.png", category=CATEGORY_PLOTS)
    assert not (tmp_path / "elsewhere.jsonl").exists()  # never written through a symlink


def test_partial_is_proven_only_when_created_after_its_record(tmp_path: Path) -> None:
    part = tmp_path / "x.mp4.part"
    assert register_partial(part, category=CATEGORY_PLOTS)
    part.write_bytes(b"half")
    assert _proves(tmp_path, part.name)
    os.utime(part, (1, 1))
    assert not _proves(tmp_path, part.name)


def test_concurrent_writers_lose_no_record(tmp_path: Path) -> None:
    def writer(k: int) -> None:
        for i in range(40):
            write_generated(tmp_path / f"f{k}_{i}.png", b"x" * i, category=CATEGORY_PLOTS)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(_proves(tmp_path, f"f{k}_{i}.png") for k in range(6) for i in range(40))
    lines = (tmp_path / GENERATED_MANIFEST).read_text().splitlines()
    assert all(json.loads(x)["v"] == 1 for x in lines)


def test_manifest_is_compacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "COMPACT_AT", 2000)
    p = tmp_path / "plot.log"
    for i in range(100):
        write_generated(p, str(i).encode(), category=CATEGORY_PLOTS)
    assert (tmp_path / GENERATED_MANIFEST).stat().st_size < 2400
    assert _proves(tmp_path, "plot.log")
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_prune_removes_only_a_manifest_that_proves_nothing(tmp_path: Path) -> None:
    a = write_generated(tmp_path / "a.png", b"a", category=CATEGORY_PLOTS)
    b = write_generated(tmp_path / "b.png", b"b", category=CATEGORY_PLOTS)
    fd = open_top(tmp_path)
    try:
        a.unlink()
        assert not prune_manifest(fd)
        b.write_bytes(b"user's now")
        assert prune_manifest(fd)
        assert not prune_manifest(fd)
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["b.png"]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        (".result.json.0123456789ab.tmp", True),
        (".a b.0123456789ab.tmp", True),
        ("..0123456789ab.tmp", False),
        (".x.0123456789AB.tmp", False),
        (".x.0123456789a.tmp", False),
        ("x.0123456789ab.tmp", False),
        (".x.abc.tmp", False),
        ("old.tmp", False),
        (".x.0123456789ab.tmp.swp", False),
    ],
)
def test_tmp_name_pattern(name: str, ok: bool) -> None:
    assert is_gmp_tmp_name(name) is ok


def test_cache_dir_tag(tmp_path: Path) -> None:
    d = ensure_cache_dir(tmp_path / "x" / "cache")
    text = (d / CACHE_DIR_TAG).read_text()
    assert text.startswith("Signature: 8a477f597d28d172789f06886806bc55\n")
    fd = open_top(d)
    try:
        assert is_gmp_cache_dir(fd)
    finally:
        os.close(fd)
    other = tmp_path / "other"
    other.mkdir()
    (other / CACHE_DIR_TAG).write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    fd = open_top(other)
    try:
        assert not is_gmp_cache_dir(fd)
    finally:
        os.close(fd)
