"""genmanip_results.roots: one rule for where writers record and readers search."""

from __future__ import annotations

from pathlib import Path

import pytest
from genmanip_results import layout
from genmanip_results.discovery import find_runs
from genmanip_results.roots import known_trees, project_trees, resolve_results_root, search_roots


def _client_run(results_root: Path, bench: str = "testbed", run_id: str = "r1") -> Path:
    ep = results_root / bench / run_id / f"{bench}/reach/red" / "000"
    ep.mkdir(parents=True)
    (results_root / bench / run_id / layout.RUN_JSON).write_text(
        f'{{"benchmark": "{bench}", "run_id": "{run_id}"}}'
    )
    (ep / layout.RESULT_JSON).write_text('{"score": 1.0}')
    return results_root / bench / run_id


def test_writer_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(layout.RESULTS_DIR_ENV, raising=False)
    assert resolve_results_root() == tmp_path / layout.CLIENT_RESULTS_DIR
    assert resolve_results_root("") == tmp_path / layout.CLIENT_RESULTS_DIR
    monkeypatch.setenv(layout.RESULTS_DIR_ENV, "env")
    assert resolve_results_root(None) == tmp_path / "env"
    assert resolve_results_root(tmp_path / "flag") == tmp_path / "flag"
    assert resolve_results_root("rel").is_absolute()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_results_root("~/r") == tmp_path / "home" / "r"


def test_project_and_known_trees(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(layout.RESULTS_DIR_ENV, raising=False)
    trees = project_trees(tmp_path)
    assert trees == [
        tmp_path / "saved" / "eval_results",
        tmp_path / "client_results",
        tmp_path / "gmp-demo",
    ]
    assert known_trees(tmp_path) == trees
    monkeypatch.setenv(layout.RESULTS_DIR_ENV, str(tmp_path / "elsewhere"))
    assert known_trees(tmp_path) == [*trees, tmp_path / "elsewhere"]
    monkeypatch.setenv(layout.RESULTS_DIR_ENV, str(tmp_path / "client_results"))
    assert known_trees(tmp_path) == trees  # no duplicate


def test_search_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(layout.RESULTS_DIR_ENV, raising=False)
    assert search_roots() == [tmp_path]
    monkeypatch.setenv(layout.RESULTS_DIR_ENV, str(other))
    assert search_roots(None) == [tmp_path, other]
    assert search_roots("x") == [Path("x")]
    monkeypatch.setenv(layout.RESULTS_DIR_ENV, str(tmp_path / "missing"))
    assert search_roots() == [tmp_path]
    monkeypatch.setenv(layout.RESULTS_DIR_ENV, ".")
    assert search_roots() == [tmp_path]


@pytest.mark.parametrize("tree", ["gmp-demo", "client_results", "saved/eval_results"])
def test_every_writer_default_is_found_from_the_project(tmp_path: Path, tree: str) -> None:
    """The invariant: what a flagless writer records in a directory, discovery of it finds."""
    run = _client_run(tmp_path / tree)
    assert [r.path for r in find_runs(tmp_path)] == [run]


def test_demo_default_is_a_known_tree() -> None:
    assert Path(layout.DEMO_RESULTS_DIR) in project_trees(".")


def test_all_trees_of_a_project_are_searched(tmp_path: Path) -> None:
    a = _client_run(tmp_path / "gmp-demo", run_id="a")
    b = _client_run(tmp_path / "client_results", run_id="b")
    assert {r.path for r in find_runs(tmp_path)} == {a, b}
    # A results root named directly is still a results root (not a project directory).
    assert [r.path for r in find_runs(tmp_path / "gmp-demo")] == [a]
