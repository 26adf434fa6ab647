"""genmanip_results.fdwalk: the one no-follow descriptor walk (gmp clean, bundles)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from genmanip_results.fdwalk import (
    MAX_DEPTH,
    RemovalVetoed,
    WalkRefused,
    ident,
    list_dir,
    lstat_at,
    open_dir_at,
    open_dirs,
    open_file_at,
    open_file_in,
    open_top,
    read_file_at,
    remove_at,
    remove_tree,
    walk,
)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    top = tmp_path / "top"
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "precious.txt").write_text("keep")
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f.txt").write_text("f")
    (top / "a" / "g.txt").write_text("g")
    (top / "z.txt").write_text("z")
    (top / "link_dir").symlink_to(outside, target_is_directory=True)
    (top / "link_file").symlink_to(outside / "deep" / "precious.txt")
    os.mkfifo(top / "fifo")
    return top, outside


def test_walk_lists_everything_and_enters_only_real_directories(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    fd = open_top(top)
    try:
        listings = list(walk(fd))
    finally:
        os.close(fd)
    assert [ls.rel for ls in listings] == [(), ("a",), ("a", "b")]
    kinds = {e.rel: e.kind for ls in listings for e in ls.entries}
    assert kinds[("link_dir",)] == "symlink" and kinds[("link_file",)] == "symlink"
    assert kinds[("fifo",)] == "other" and kinds[("a", "b", "f.txt")] == "file"
    assert [e.name for e in listings[0].entries] == sorted(e.name for e in listings[0].entries)


def test_prune_and_descend(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    fd = open_top(top)
    try:
        seen = []
        for ls in walk(fd, descend=lambda e: e.name != "b"):
            seen.append(ls.rel)
        assert seen == [(), ("a",)]
        seen = []
        for ls in walk(fd):
            ls.prune.add("a")
            seen.append(ls.rel)
        assert seen == [()]
    finally:
        os.close(fd)


def test_too_deep_is_skipped_and_reported_with_bounded_descriptors(tmp_path: Path) -> None:
    top = tmp_path / "top"
    d = top
    for _ in range(MAX_DEPTH + 20):
        d = d / "d"
    d.mkdir(parents=True)
    for i in range(300):  # wide too: pending siblings must not hold descriptors
        (top / f"w{i:03d}").mkdir()
    skipped: list[tuple[tuple[str, ...], str]] = []
    base = _open_fds()
    peak = 0
    fd = open_top(top)
    try:
        n = 0
        for _ in walk(fd, on_skip=lambda rel, why: skipped.append((rel, why))):
            peak = max(peak, _open_fds())
            n += 1
    finally:
        os.close(fd)
    assert n == MAX_DEPTH + 1 + 300
    assert len(skipped) == 1 and "deeper than" in skipped[0][1]
    assert peak - base <= MAX_DEPTH + 5
    assert _open_fds() == base


def test_stopping_early_closes_descriptors(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    base = _open_fds()
    fd = open_top(top)
    for ls in walk(fd):
        if ls.rel == ("a",):
            break
    os.close(fd)
    import gc

    gc.collect()
    assert _open_fds() == base


def test_open_dir_at_refuses_symlinks_and_replacements(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    fd = open_top(top)
    try:
        with pytest.raises(WalkRefused, match="symlink"):
            open_dir_at(fd, "link_dir")
        a_ident = ident(lstat_at(fd, "a"))
        os.rename(top / "a", top / "a_old")
        (top / "a").mkdir()  # another directory under the same name
        with pytest.raises(WalkRefused, match="replaced"):
            open_dir_at(fd, "a", expect=a_ident)
        sub = open_dirs(fd, ("a_old", "b"))
        assert lstat_at(sub, "f.txt").st_size == 1
        os.close(sub)
        with pytest.raises(WalkRefused):
            open_dirs(fd, ("link_dir", "deep"))
    finally:
        os.close(fd)


def test_open_top_no_follow(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    with pytest.raises(WalkRefused):
        open_top(top / "link_dir", follow=False)
    os.close(open_top(top / "link_dir"))  # the caller's named path may be a link


@pytest.mark.timeout(20)
def test_open_file_at_only_opens_regular_files(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    fd = open_top(top)
    try:
        with pytest.raises(WalkRefused, match="symlink"):
            open_file_at(fd, "link_file")
        with pytest.raises(WalkRefused, match="regular"):
            open_file_at(fd, "fifo")  # no reader hangs on a FIFO
        with pytest.raises(WalkRefused, match="regular"):
            open_file_at(fd, "a")
        z = ident(lstat_at(fd, "z.txt"))
        os.close(open_file_at(fd, "z.txt", expect=z))
        (top / "z.txt").rename(top / "z.old")  # kept alive: its inode cannot be reused
        (top / "z.txt").write_text("other")
        with pytest.raises(WalkRefused, match="replaced"):
            open_file_at(fd, "z.txt", expect=z)
        f = open_file_in(fd, ("a", "b", "f.txt"))
        assert os.read(f, 10) == b"f"
        os.close(f)
        with pytest.raises(WalkRefused):
            open_file_in(fd, ("link_dir", "deep", "precious.txt"))
        assert read_file_at(fd, "link_file", limit=100) is None
        assert read_file_at(fd, "z.txt", limit=2) is None  # larger than the limit
        assert read_file_at(fd, "z.txt", limit=100) == b"other"
    finally:
        os.close(fd)


def test_remove_tree_never_follows_a_symlink(tmp_path: Path) -> None:
    top, outside = _tree(tmp_path)
    (top / "a" / "b" / "inner_link").symlink_to(outside, target_is_directory=True)
    fd = open_top(top)
    try:
        remove_tree(fd, "a", expect=ident(lstat_at(fd, "a")))
        remove_at(fd, "link_dir", kind="symlink")
    finally:
        os.close(fd)
    assert not (top / "a").exists() and not (top / "link_dir").exists()
    assert (outside / "deep" / "precious.txt").read_text() == "keep"


def test_remove_at_checks_identity_and_kind(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    fd = open_top(top)
    try:
        z = ident(lstat_at(fd, "z.txt"))
        (top / "z.txt").rename(top / "z.old")
        (top / "z.txt").write_text("user's new file")
        with pytest.raises(WalkRefused):
            remove_at(fd, "z.txt", expect=z)
        with pytest.raises(WalkRefused, match="now a symlink"):
            remove_at(fd, "link_dir", kind="dir")
    finally:
        os.close(fd)
    assert (top / "z.txt").read_text() == "user's new file"


def test_remove_tree_veto_stops(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    (top / "a" / "b" / "x.lock").write_text("")
    fd = open_top(top)
    try:
        with pytest.raises(RemovalVetoed, match="live"):
            remove_tree(fd, "a", veto=lambda e: "live lock" if e.name == "x.lock" else None)
    finally:
        os.close(fd)
    assert (top / "a" / "b" / "x.lock").exists()


def test_list_dir_prefixes_rel(tmp_path: Path) -> None:
    top, _ = _tree(tmp_path)
    fd = open_top(top)
    try:
        sub = open_dir_at(fd, "a")
        ls = list_dir(sub, ("a",))
        assert [e.rel for e in ls.entries] == [("a", "b"), ("a", "g.txt")]
        assert ls.fd == sub
        os.close(sub)
    finally:
        os.close(fd)
