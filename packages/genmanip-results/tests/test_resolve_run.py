"""``compare.resolve_run``: the readers' one way from ``RUN`` to a run (``gmp compare``, ``gmp
report``, ``gmp transcode``, ``gmp eval --compare-to``, the leaderboard's bundle), and what it says
when ``RUN`` names no single run."""

from __future__ import annotations

from pathlib import Path

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_results.compare import AmbiguousRun, RunNotFound, resolve_run
from genmanip_results.errors import GenmanipResultsError
from genmanip_results.testing import make_client_run, make_server_run


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A results root where run id ``dup`` is in two benchmarks and ``solo`` in one."""
    r = tmp_path / "results"
    make_client_run(r, benchmark="testbed", run_id="dup")
    make_client_run(r, benchmark="ebench", run_id="dup")
    make_client_run(r, benchmark="testbed", run_id="solo")
    return r


def test_ambiguous_run_id_lists_each_candidate_as_what_to_type(root: Path) -> None:
    with pytest.raises(AmbiguousRun) as ei:
        resolve_run("dup", root)
    e = ei.value
    assert isinstance(e, RunNotFound) and isinstance(e, GenmanipResultsError)
    assert e.exit_code == ExitCode.INVALID_INPUT
    assert sorted(e.candidates) == ["ebench/dup", "testbed/dup"]
    assert sorted(e.paths) == [root / "ebench" / "dup", root / "testbed" / "dup"]
    assert "'dup' is ambiguous" in str(e)
    for key in ("testbed/dup", "ebench/dup"):
        assert key in str(e) and repr(key) in (e.hint or "")
    # ... and what it tells the user to type works.
    for key in e.candidates:
        assert resolve_run(key, root).key == key


def test_benchmark_id_narrows_a_run_id_to_that_benchmark(root: Path) -> None:
    assert resolve_run("dup", root, benchmark_id="ebench").path == root / "ebench" / "dup"
    assert resolve_run("dup", root, benchmark_id="testbed").path == root / "testbed" / "dup"
    assert resolve_run("testbed/dup", root, benchmark_id="testbed").path == root / "testbed" / "dup"
    # A run directory is taken as given.
    assert resolve_run(str(root / "ebench" / "dup"), root, benchmark_id="testbed").benchmark == "ebench"


@pytest.mark.parametrize(("spec", "benchmark"), [("dup", "other"), ("solo", "ebench"), ("ebench/dup", "testbed")])
def test_benchmark_id_without_a_match_is_run_not_found(root: Path, spec: str, benchmark: str) -> None:
    with pytest.raises(RunNotFound) as ei:
        resolve_run(spec, root, benchmark_id=benchmark)
    assert not isinstance(ei.value, AmbiguousRun)
    assert f"no run {spec!r} of benchmark {benchmark!r}" in str(ei.value)
    assert "testbed/solo" in str(ei.value)  # the runs there are


def test_the_same_key_in_two_layouts_points_at_the_run_directory(tmp_path: Path) -> None:
    a = make_server_run(tmp_path, benchmark="testbed", run_id="same")
    b = make_client_run(tmp_path / "client_results", benchmark="testbed", run_id="same")
    with pytest.raises(AmbiguousRun) as ei:
        resolve_run("testbed/same", tmp_path)
    assert ei.value.candidates == ["testbed/same", "testbed/same"]
    assert str(a) in str(ei.value) and str(b) in str(ei.value)
    assert ei.value.hint == "give the run directory"  # (a key both share would not pick one)
