"""genmanip_results.paths: the one path-safety module (moved here from genmanip_viz.paths)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_protocol.schema import safe_relative_path
from genmanip_results.errors import GenmanipResultsError
from genmanip_results.paths import (
    UnsafePathError,
    is_within,
    safe_component,
    safe_join,
    safe_relative,
)

_UNSAFE = [
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
]


@pytest.mark.parametrize("rel", _UNSAFE)
def test_safe_relative_rejects(rel: str) -> None:
    with pytest.raises(UnsafePathError) as ei:
        safe_relative(rel, field="episode")
    assert str(ei.value).startswith("episode:")
    assert isinstance(ei.value.__cause__, ValidationError)


@pytest.mark.parametrize("rel", [*_UNSAFE, "ok/path", "a/<b>/c", "x" * 255])
def test_safe_relative_is_exactly_the_wire_rule(rel: str) -> None:
    """No second rule: safe_relative accepts what safe_relative_path accepts, nothing else."""
    try:
        wire: PurePosixPath | None = safe_relative_path(rel, field="f")
    except ValidationError:
        wire = None
    try:
        ours: PurePosixPath | None = safe_relative(rel, field="f")
    except UnsafePathError:
        ours = None
    assert ours == wire


def test_safe_relative_accepts_nested_task_paths() -> None:
    assert safe_relative("ebench/table_top/peg in hole/000") == PurePosixPath(
        "ebench/table_top/peg in hole/000"
    )
    assert safe_relative("a/<b>/c").parts == ("a", "<b>", "c")


@pytest.mark.parametrize(
    "name", ["", ".", "..", ".hidden", "-x", "a/b", "a\x00", "a b", "x" * 200, "cam\n"]
)
def test_safe_component_rejects(name: str) -> None:
    with pytest.raises(UnsafePathError) as ei:
        safe_component(name, field="camera")
    assert str(ei.value).startswith("camera:")


def test_safe_component_accepts() -> None:
    assert safe_component("left_camera") == "left_camera"
    assert safe_component("worker-0.1") == "worker-0.1"
    assert safe_component("x" * 128) == "x" * 128


def test_error_is_typed() -> None:
    assert issubclass(UnsafePathError, GenmanipResultsError)
    assert UnsafePathError.exit_code == ExitCode.REFUSED


def test_safe_join_refuses_symlink_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key.txt").write_text("secret")
    os.symlink(outside, root / "a" / "link")
    assert safe_join(root, "a") == root / "a"
    assert safe_join(root, "a", "b/c") == root / "a" / "b" / "c"  # need not exist
    with pytest.raises(UnsafePathError, match="points outside"):
        safe_join(root, "a/link/key.txt")
    with pytest.raises(UnsafePathError):
        safe_join(root, "a", "../../secret")
    assert not is_within(root / "a" / "link" / "key.txt", root)
    assert is_within(root / "a", root)
    assert is_within(root, root)
    assert not is_within(tmp_path, root)


def test_is_within_is_by_component_not_by_prefix(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "rootx").mkdir()
    assert not is_within(tmp_path / "rootx", tmp_path / "root")
    assert is_within(tmp_path / "root" / "missing" / "deeper", tmp_path / "root")


def test_is_within_of_the_parent_allows_a_link_itself(tmp_path: Path) -> None:
    """The caller that only ever removes a link (gmp clean) checks the link's parent."""
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path, root / "up")
    assert not is_within(root / "up", root)
    assert is_within((root / "up").parent, root)


def test_is_within_bad_names_are_not_within(tmp_path: Path) -> None:
    assert not is_within(str(tmp_path / "a\x00b"), tmp_path)
