"""genmanip_results.layout's name builders and their parser: the recorder's notes."""

from __future__ import annotations

from pathlib import Path

import pytest
from genmanip_results.layout import (
    AWAITING_NOTE_GLOB,
    PENDING_NOTE_GLOB,
    awaiting_note_name,
    note_pid,
    pending_note_name,
)


@pytest.mark.parametrize("make", [awaiting_note_name, pending_note_name])
@pytest.mark.parametrize("pid", [1, 4242, 4194304])
def test_note_pid_reads_back_the_pid_of_a_note_name(make: object, pid: int) -> None:
    assert note_pid(make(pid)) == str(pid)  # type: ignore[operator]


@pytest.mark.parametrize("name", [
    "",
    ".pending_result.json",      # prefix and suffix overlap: no pid part
    ".awaiting_result.json",
    ".pending_result..json",     # an empty pid part
    ".pending_result.42",        # no suffix
    "pending_result.42.json",    # no leading dot
    ".other_note.42.json",
    "result.json",
    "42",
])
def test_note_pid_of_a_malformed_name_is_none(name: str) -> None:
    assert note_pid(name) is None


def test_note_pid_keeps_a_dotted_or_non_numeric_part_whole() -> None:
    # (the old parsing, name.split(".")[2], read "1.2" as pid 1: a live process's pid, maybe)
    assert note_pid(".pending_result.1.2.json") == "1.2"
    assert note_pid(".awaiting_result.abc.json") == "abc"


def test_note_pid_reads_every_name_the_globs_find(tmp_path: Path) -> None:
    names = [awaiting_note_name(7), pending_note_name(8), ".pending_result.x.y.json"]
    for n in names:
        (tmp_path / n).write_text("{}")
    found = sorted(p.name for g in (AWAITING_NOTE_GLOB, PENDING_NOTE_GLOB) for p in tmp_path.glob(g))
    assert sorted(names) == found
    assert sorted(note_pid(n) for n in found) == ["7", "8", "x.y"]  # type: ignore[type-var]
