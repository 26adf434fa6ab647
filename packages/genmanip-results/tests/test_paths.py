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
    create_exclusive,
    is_within,
    open_within,
    read_bytes_within,
    safe_component,
    safe_file,
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


# --- safe_file: a wire-supplied name becomes a file name where the path is built -------------

_HOSTILE_NAMES = [
    "../x", "../../etc/passwd", "/abs", "a/b", "", ".", "..", ".hidden", "-rf", "a\x00b", "a\nb",
    "a\\b", "c" * 129, "d" * 300, "left camera", "\u2024\u2024", "\uff0e\uff0e", "..\u2215x",
    "cam\u202egpj", "caf\u00e9",
]


@pytest.mark.parametrize("name", _HOSTILE_NAMES)
def test_safe_file_refuses_every_hostile_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafePathError) as ei:
        safe_file(tmp_path, name, suffix=".mp4", field="camera")
    assert str(ei.value).startswith("camera:")
    assert list(tmp_path.iterdir()) == []


def test_safe_file_builds_plain_names_and_refuses_a_symlink_out(tmp_path: Path) -> None:
    d = tmp_path / "ep"
    d.mkdir()
    assert safe_file(d, "left_camera", suffix=".mp4") == d / "left_camera.mp4"
    assert safe_file(d, "obs_camera_2@v1.x", suffix=".jpegs") == d / "obs_camera_2@v1.x.jpegs"
    (tmp_path / "user.mp4").write_bytes(b"user")
    (d / "top_camera.mp4").symlink_to(tmp_path / "user.mp4")
    with pytest.raises(UnsafePathError, match=r"^camera: 'top_camera'"):
        safe_file(d, "top_camera", suffix=".mp4", field="camera")
    (d / "inner.mp4").write_bytes(b"ok")
    (d / "alias.mp4").symlink_to(d / "inner.mp4")  # inside: fine
    assert safe_file(d, "alias", suffix=".mp4") == d / "alias.mp4"


# --- open_within / read_bytes_within: the one way a results reader opens a file --------------


@pytest.fixture
def secret_tree(tmp_path: Path) -> dict[str, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"TOPSECRET")
    root = tmp_path / "root"
    (root / "ep").mkdir(parents=True)
    (root / "ep" / "result.json").write_bytes(b'{"score": 1}')
    return {"tmp": tmp_path, "outside": outside, "root": root, "secret": outside / "secret.txt"}


def test_open_within_reads_files_and_inside_links(secret_tree: dict[str, Path]) -> None:
    root = secret_tree["root"]
    assert read_bytes_within(root / "ep" / "result.json", root) == b'{"score": 1}'
    (root / "ep" / "alias.json").symlink_to(root / "ep" / "result.json")
    assert read_bytes_within(root / "ep" / "alias.json", root) == b'{"score": 1}'
    with open_within(root / "ep" / "result.json", root) as fh:
        assert fh.read(2) == b'{"'


@pytest.mark.parametrize("how", ["absolute", "relative", "chain", "dir component", "root link"])
def test_open_within_refuses_every_link_out(secret_tree: dict[str, Path], how: str) -> None:
    root, secret = secret_tree["root"], secret_tree["secret"]
    ep = root / "ep"
    if how == "absolute":
        path = ep / "steps.jsonl"
        path.symlink_to(secret)
    elif how == "relative":
        path = ep / "steps.jsonl"
        path.symlink_to(Path("../../outside/secret.txt"))
    elif how == "chain":  # a link to a link inside the root that leads out
        (ep / "hop.json").symlink_to(secret)
        path = ep / "run.json"
        path.symlink_to(ep / "hop.json")
    elif how == "dir component":  # a symlinked episode directory
        (root / "linked").symlink_to(secret_tree["outside"], target_is_directory=True)
        path = root / "linked" / "secret.txt"
    else:  # the file is fine, but is given through a path that is not under the root at all
        path = secret
    with pytest.raises(UnsafePathError, match="resolves outside the results root"):
        read_bytes_within(path, root, field=path.name)


def test_open_within_catches_a_directory_swapped_after_the_check(
    secret_tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between resolving and opening, a directory on the way becomes a symlink out: the descriptor
    actually opened is checked (``/proc/self/fd``), so its bytes are never returned."""
    import genmanip_results.paths as paths_mod

    root, outside = secret_tree["root"], secret_tree["outside"]
    (root / "d").symlink_to(outside, target_is_directory=True)
    real = paths_mod._real

    def stale(path: str | os.PathLike[str], field: str) -> str:
        # what realpath saw before the swap: a plain directory "d" under the root
        p = os.fspath(path)
        return p if p.endswith("secret.txt") else real(path, field)

    monkeypatch.setattr(paths_mod, "_real", stale)
    with pytest.raises(UnsafePathError):
        read_bytes_within(root / "d" / "secret.txt", root)


def test_open_within_refuses_non_regular_files_without_blocking(secret_tree: dict[str, Path]) -> None:
    root = secret_tree["root"]
    fifo = root / "ep" / "steps.jsonl"
    os.mkfifo(fifo)  # a FIFO would block a plain open() forever
    with pytest.raises(OSError, match="not a regular file"):
        read_bytes_within(fifo, root)
    with pytest.raises(OSError):
        read_bytes_within(root / "ep", root)  # a directory
    with pytest.raises(FileNotFoundError):
        read_bytes_within(root / "ep" / "missing.json", root)
    with pytest.raises(UnsafePathError):
        read_bytes_within(str(root / "ep" / "a\x00b"), root)


# --- create_exclusive: a writer never overwrites or follows what is there ---------------------


def test_create_exclusive_never_overwrites_or_follows(secret_tree: dict[str, Path]) -> None:
    root, secret = secret_tree["root"], secret_tree["secret"]
    ep = root / "ep"
    with create_exclusive(ep / "steps.jsonl", within=root) as fh:
        fh.write(b"row\n")
    assert (ep / "steps.jsonl").read_bytes() == b"row\n"
    with pytest.raises(FileExistsError):
        create_exclusive(ep / "steps.jsonl", within=root)
    (ep / "left.jpegs").symlink_to(secret)
    with pytest.raises(FileExistsError):
        create_exclusive(ep / "left.jpegs", within=root)  # a symlink: not followed
    (root / "out").symlink_to(secret_tree["outside"], target_is_directory=True)
    with pytest.raises(UnsafePathError):
        create_exclusive(root / "out" / "new.jpegs", within=root)
    assert secret.read_bytes() == b"TOPSECRET"
    assert sorted(p.name for p in secret_tree["outside"].iterdir()) == ["secret.txt"]
