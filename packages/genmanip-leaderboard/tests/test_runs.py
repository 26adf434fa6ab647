from __future__ import annotations

import pytest
from genmanip_leaderboard import (
    AmbiguousRunError,
    RunNotFoundError,
    completeness,
    default_roots,
    discover_runs,
    resolve_run,
    results_tree,
    run_summary,
    select_run,
)
from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import load_run


def test_ambiguous_run_id_lists_every_candidate(project, server_run, client_run):
    a = server_run(project, benchmark="testbed", run_id="same")
    b = server_run(project, benchmark="ebench", run_id="same")
    c = client_run(project / "client_results", benchmark="testbed", run_id="same")
    runs = discover_runs([project])
    with pytest.raises(AmbiguousRunError) as ei:
        select_run(runs, "same")
    e = ei.value
    assert e.exit_code == ExitCode.USAGE and len(e.candidates) == 3
    for d in (a, b, c):
        assert str(d) in str(e)
    assert "--benchmark-id" in (e.hint or "")
    assert select_run(runs, "same", "ebench").path == b
    with pytest.raises(AmbiguousRunError):
        select_run(runs, "same", "testbed")


def test_unknown_run_lists_known_ones(project, server_run):
    server_run(project, run_id="r1")
    with pytest.raises(RunNotFoundError) as ei:
        select_run(discover_runs([project]), "r2")
    assert "testbed/r1" in str(ei.value)
    with pytest.raises(RunNotFoundError, match="does not exist"):
        discover_runs([project / "nope"])


def test_resolve_run_by_path_or_id(project, server_run):
    d = server_run(project, run_id="p1")
    assert resolve_run(str(d), project).path == d
    assert resolve_run("p1", project).path == d
    assert resolve_run("testbed/p1", project).path == d  # the readers' <benchmark>/<run_id> too


def test_resolve_run_is_the_readers_rule_said_in_the_leaderboards_terms(project, server_run, monkeypatch):
    from genmanip_results.compare import resolve_run as readers_resolve_run

    a = server_run(project, benchmark="testbed", run_id="dup")
    b = server_run(project, benchmark="ebench", run_id="dup")
    # One rule: what the readers (gmp compare, report, transcode) resolve, the leaderboard does.
    monkeypatch.chdir(project)
    assert resolve_run(str(a)).path == readers_resolve_run(str(a)).path == a
    assert resolve_run("ebench/dup").path == readers_resolve_run("ebench/dup").path == b
    # --benchmark-id narrows a run id; a run directory is taken as given.
    assert resolve_run("dup", project, "ebench").path == b
    assert resolve_run(str(a), project, "ebench").path == a
    with pytest.raises(AmbiguousRunError) as ei:
        resolve_run("dup", project)
    assert ei.value.exit_code == ExitCode.USAGE and "--benchmark-id" in (ei.value.hint or "")
    assert str(a) in str(ei.value) and str(b) in str(ei.value)
    with pytest.raises(RunNotFoundError) as nf:
        resolve_run("nope", project)
    assert nf.value.exit_code == ExitCode.INVALID_INPUT and "ebench/dup" in str(nf.value)
    with pytest.raises(RunNotFoundError, match="benchmark 'other'"):
        resolve_run("dup", project, "other")
    with pytest.raises(RunNotFoundError, match="does not exist"):
        resolve_run("dup", project / "missing")
    with pytest.raises(RunNotFoundError, match="is not a run directory"):
        resolve_run(str(project), project)


def test_results_tree_both_layouts_and_nested_run_ids(project, server_run, client_run):
    d = server_run(project, run_id="r")
    assert results_tree(load_run(d)) == (project / "saved" / "eval_results").resolve()
    c = client_run(project / "client_results")
    assert results_tree(load_run(c)) == (project / "client_results").resolve()
    n = client_run(project / "nested", run_id="group/sub")
    assert load_run(n).run_id == "group/sub"
    assert results_tree(load_run(n)) == (project / "nested").resolve()


def test_completeness_and_summary(project, server_run):
    d = server_run(project, tasks={"testbed/a/x": 3}, done={"testbed/a/x": [0, 1, 2]})
    run = load_run(d)
    comp = completeness(run)
    assert comp.is_complete and comp.expected == 3 and comp.complete == 3
    s = run_summary(run)
    assert s["episodes_done"] == 3 and s["episodes_total"] == 3 and s["submitted"] is False
    assert s["success_rate"] == pytest.approx(2 / 3)


def test_default_roots_include_result_dir_env(tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GENMANIP_RESULT_DIR", str(other))
    assert default_roots(None) == [tmp_path, other]
    assert default_roots("x") == [type(tmp_path)("x")]


def test_list_shows_each_runs_policy_and_every_policy_of_a_resumed_run(project, client_run, capsys):
    import json

    from genmanip_leaderboard.cli import list_runs
    from genmanip_runtime.console import Console

    run_dir = client_run(project / "client_results", benchmark="testbed", run_id="pol")
    rj = run_dir / "run.json"
    data = json.loads(rj.read_text()) if rj.exists() else {}
    data["policy"] = {"spec": "mypol:make", "args": {"ckpt": "b.pt"}}
    data["segments"] = [
        {"id": "1", "policy": {"spec": "mypol:make", "args": {"ckpt": "a.pt"}}},
        {"id": "2", "policy": {"spec": "mypol:make", "args": {"ckpt": "b.pt"}}},
    ]
    rj.write_text(json.dumps(data))
    assert list_runs(root=str(project), as_json=True, console=Console()) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["run_id"] == "pol"]
    assert row["policy"]["spec"] == "mypol:make" and row["policy"]["args"] == {"ckpt": "b.pt"}
    assert [p["args"]["ckpt"] for p in row["policy"]["all"]] == ["a.pt", "b.pt"]
    assert list_runs(root=str(project), as_json=False, console=Console()) == 0
    out = capsys.readouterr().out
    assert "POLICY" in out and "mypol:make ckpt=b.pt (+1 more)" in out
