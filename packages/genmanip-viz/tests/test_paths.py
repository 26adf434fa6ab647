from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from genmanip_viz.errors import UnsafePathError
from genmanip_viz.paths import is_within, resolve_within, safe_component, safe_relative


@pytest.mark.parametrize(
    "rel",
    [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "a//b",
        "a/./b",
        ".",
        "..",
        "a\x00b",
        "a\\b",
        "C:/x",
        "c:",
        "a/\n",
        "",
        "a/" + "x" * 256,
    ],
)
def test_safe_relative_rejects(rel: str) -> None:
    with pytest.raises(UnsafePathError) as ei:
        safe_relative(rel, field="episode")
    assert str(ei.value).startswith("episode:")


def test_safe_relative_accepts_nested_task_paths() -> None:
    assert safe_relative("ebench/table_top/peg in hole/000") == PurePosixPath(
        "ebench/table_top/peg in hole/000"
    )
    assert safe_relative("a/<b>/c").parts == ("a", "<b>", "c")


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "-x", "a/b", "a\x00", "a b", "x" * 200])
def test_safe_component_rejects(name: str) -> None:
    with pytest.raises(UnsafePathError):
        safe_component(name, field="camera")


def test_safe_component_accepts() -> None:
    assert safe_component("left_camera") == "left_camera"
    assert safe_component("worker-0.1") == "worker-0.1"


def test_resolve_within_refuses_symlink_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key.txt").write_text("secret")
    os.symlink(outside, root / "a" / "link")
    assert resolve_within(root, "a") == root / "a"
    with pytest.raises(UnsafePathError):
        resolve_within(root, "a/link/key.txt")
    assert not is_within(root / "a" / "link" / "key.txt", root)
    assert is_within(root / "a", root)
    assert not is_within(tmp_path, root)
