from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from genmanip_results.discovery import (
    RunScanner,
    find_episode_dirs,
    find_runs,
    is_episode_dir,
    is_run_dir,
    load_episode,
    load_run,
    read_locks,
)
from genmanip_runtime.atomic import atomic_write_json

NOW = 1_800_000_000.0  # a fixed "now" so staleness is exact
T_A = "ebench/table_top_manip/peg_in_hole"
T_B = "ebench/mobile/open_drawer"


def _w(path: Path, content: str | bytes | dict | list, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, (dict, list)):
        content = json.dumps(content)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _age(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def _age_dirs(top: Path, t: float) -> None:
    for d, _dirs, _files in os.walk(top, topdown=False):
        _age(Path(d), t)


def build_server_run(project: Path) -> Path:
    """saved/eval_results/ebench/run1 with: 2 complete, 1 corrupt, 1 running (fresh lock),
    1 stale lock without an episode dir, a done-but-not-removed lock."""
    run = project / "saved" / "eval_results" / "ebench" / "run1"
    ta = run / T_A
    _w(
        ta / "000" / "result_info.json",
        {"score": 1.0, "success_rate": 1, "log_info": {"metric_score": [[[1.0]]]}},
        NOW - 500,
    )
    _w(ta / "000" / "left_camera.mp4", b"\x00mp4", NOW - 500)
    _w(ta / "000" / "top_camera.mp4", b"\x00mp4", NOW - 500)
    _w(ta / "000" / "meta_record.pkl", b"pkl", NOW - 500)
    _w(ta / "000" / "episode.rrd", b"rrd", NOW - 500)
    _w(ta / "001" / "result_info.json", {"score": 0.5, "success_rate": 0}, NOW - 400)
    _w(ta / "002" / "result_info.json", b"{not json", NOW - 300)
    # running now: dir with temp frames, fresh lock
    (ta / "003" / "abcdef0123").mkdir(parents=True)
    _w(
        ta / "003.lock",
        {
            "worker_id": "1",
            "timestamp": NOW - 10,
            "pid": 4242,
            "host": "gpu1",
            "task_name": T_A,
            "seed": "003",
        },
        NOW - 10,
    )
    # done but lock not yet removed: stale regardless of age
    _w(ta / "001.lock", {"worker_id": "0", "timestamp": NOW - 1, "pid": 1, "host": "gpu1"}, NOW - 1)
    tb = run / T_B
    # crashed server: lock untouched for 400 s, no episode dir yet
    _w(tb / "000.lock", "", NOW - 400)
    _w(
        run / "progress.json",
        {f"*(3/4){T_A}": {"score": 0.5, "sr": 0.25}, f"*{T_B}": {"score": 0.0, "sr": 0.0}},
        NOW - 300,
    )
    _age_dirs(run, NOW - 600)
    _age(run, NOW - 100)
    return run


def build_client_runs(project: Path) -> tuple[Path, Path]:
    root = project / "client_results"
    run = root / "ebench" / "crun"
    _w(
        run / "run.json",
        {
            "run_id": "crun",
            "benchmark": "ebench",
            "total_episodes": 3,
            "started": "2027-01-15T08:00:00+00:00",
            "workers": ["0"],
        },
    )
    ta = run / T_A
    _w(ta / "episode_result.json", {"000": {"score": 1.0, "sr": 1.0}})
    _w(ta / "episode_result.lock", "")
    ep = ta / "000"
    _w(ep / "steps.jsonl", "{}\n" * 5)
    _w(ep / "left_camera.mp4", b"x")
    _w(
        ep / "result.json",
        {
            "episode_id": f"ebench/crun/{T_A}/000",
            "task_name": T_A,
            "seed": "000",
            "score": 1.0,
            "sr": 1.0,
            "steps": 5,
            "robot_id": "manip/lift2/R5a",
            "instruction": "insert the peg",
        },
    )
    # being recorded: INCOMPLETE, 2 complete rows and a partial third
    ep1 = ta / "001"
    _w(ep1 / "steps.jsonl", '{"step":0}\n{"step":1}\n{"st', NOW - 5)
    _w(ep1 / "INCOMPLETE", "", NOW - 5)
    _age_dirs(run, NOW - 700)
    _age(ep1, NOW - 5)
    # a second benchmark, recorded by the reference client: no run.json
    old = root / "other" / "r0"
    _w(old / "other" / "t" / "000" / "result.json", {"score": 0.0, "sr": 0.0})
    _w(old / "other" / "t" / "000" / "merged_abcd1234.mp4", b"x")
    _age_dirs(old, NOW - 800)
    return run, old


def test_server_run_exact(tmp_path: Path) -> None:
    run_dir = build_server_run(tmp_path)
    run = load_run(run_dir, now=NOW)
    assert run.layout == "server"
    assert (run.benchmark, run.run_id, run.key) == ("ebench", "run1", "ebench/run1")
    assert [(e.task_name, e.seed) for e in run.episodes] == [
        (T_A, "000"),
        (T_A, "001"),
        (T_A, "002"),
        (T_A, "003"),
    ]
    e0, e1, e2, e3 = run.episodes
    assert e0.complete and e0.score == 1.0 and e0.success is True
    assert e0.episode_id == f"ebench/run1/{T_A}/000"
    assert e0.videos == {
        "left_camera": e0.path / "left_camera.mp4",
        "top_camera": e0.path / "top_camera.mp4",
    }
    assert e0.meta_record == e0.path / "meta_record.pkl"
    assert e0.rrd == e0.path / "episode.rrd"
    assert e0.steps is None and e0.steps_file is None and e0.error is None
    assert e1.complete and e1.score == 0.5 and e1.success is False
    assert not e2.complete and e2.score is None and e2.success is None
    assert e2.error is not None and e2.error.startswith("result_info.json: invalid JSON")
    assert not e3.complete and e3.error is None and e3.videos == {}
    assert [(li.task_name, li.seed, li.stale) for li in run.locks] == [
        (T_B, "000", True),
        (T_A, "001", True),
        (T_A, "003", False),
    ]
    fresh = run.locks[2]
    assert (fresh.worker_id, fresh.pid, fresh.host, fresh.timestamp) == (
        "1",
        4242,
        "gpu1",
        NOW - 10,
    )
    assert run.locks[0].worker_id is None and run.locks[0].pid is None
    assert run.live is True
    assert run.total_episodes is None  # T_B has no (done/total) yet
    assert set(run.metric) == {T_A, T_B}
    assert run.metric[T_A].done == 3 and run.metric[T_A].total == 4
    assert (run.n_complete, run.n_success) == (2, 1)
    assert run.success_rate == 0.5 and run.mean_score == 0.75
    assert list(run.tasks()) == [T_A]
    assert run.created == NOW - 600 and run.updated == NOW - 1
    assert run.manifest is None and run.submitted is None and run.errors == []


def test_lock_staleness_rules(tmp_path: Path) -> None:
    run_dir = build_server_run(tmp_path)
    locks = read_locks(run_dir, now=NOW)
    assert [(li.seed, li.stale) for li in locks] == [("000", True), ("001", True), ("003", False)]
    # 301 s later the running episode's lock is stale too
    later = read_locks(run_dir, now=NOW + 291)
    assert [li.stale for li in later] == [True, True, True]
    # a custom window
    assert [li.stale for li in read_locks(run_dir, now=NOW, stale_after=5)] == [True, True, True]
    assert load_run(run_dir, now=NOW + 400).live is False


def test_client_runs_and_project_root(tmp_path: Path) -> None:
    server_run = build_server_run(tmp_path)
    crun_dir, old_dir = build_client_runs(tmp_path)
    _age(old_dir / "other" / "t" / "000", NOW - 50_000)
    _age(old_dir / "other" / "t" / "000" / "result.json", NOW - 50_000)
    runs = find_runs(tmp_path, now=NOW)
    assert [r.path for r in runs] == [crun_dir, server_run, old_dir]
    crun = runs[0]
    assert crun.layout == "client"
    assert crun.manifest is not None and crun.manifest["workers"] == ["0"]
    assert crun.total_episodes == 3
    e0, e1 = crun.episodes
    assert e0.complete and e0.steps == 5 and e0.success
    assert e0.instruction == "insert the peg" and e0.robot_id == "manip/lift2/R5a"
    assert e0.steps_file == e0.path / "steps.jsonl"
    assert e0.videos == {"left_camera": e0.path / "left_camera.mp4"}
    assert not e1.complete and e1.steps == 2 and e1.error is None
    assert crun.live is True  # INCOMPLETE written 5 s ago
    assert crun.locks == []  # episode_result.lock is not an episode lock
    old = runs[2]
    assert (old.benchmark, old.run_id, old.layout) == ("other", "r0", "client")
    assert old.episodes[0].videos == {
        "merged_abcd1234": old.episodes[0].path / "merged_abcd1234.mp4"
    }
    assert old.live is False


def test_find_runs_accepts_every_root_level(tmp_path: Path) -> None:
    server_run = build_server_run(tmp_path)
    crun, old = build_client_runs(tmp_path)
    results_root = tmp_path / "client_results"
    assert {r.path for r in find_runs(results_root, now=NOW)} == {crun, old}
    assert [r.path for r in find_runs(results_root / "ebench", now=NOW)] == [crun]
    assert [r.path for r in find_runs(crun, now=NOW)] == [crun]
    assert [r.path for r in find_runs(server_run.parent, now=NOW)] == [server_run]
    assert [r.path for r in find_runs(tmp_path / "saved" / "eval_results", now=NOW)] == [server_run]
    assert find_runs(tmp_path / "missing") == []


def test_created_from_manifest_and_sorting(tmp_path: Path) -> None:
    crun, _ = build_client_runs(tmp_path)
    run = load_run(crun, now=NOW)
    import datetime as dt

    assert run.created == dt.datetime(2027, 1, 15, 8, tzinfo=dt.timezone.utc).timestamp()


def test_predicates(tmp_path: Path) -> None:
    server_run = build_server_run(tmp_path)
    crun, old = build_client_runs(tmp_path)
    assert is_run_dir(server_run) and is_run_dir(crun) and is_run_dir(old)
    assert not is_run_dir(server_run.parent)
    assert not is_run_dir(tmp_path / "client_results")
    assert not is_run_dir(crun / T_A / "000")
    assert is_episode_dir(crun / T_A / "000")
    assert is_episode_dir(server_run / T_A / "003")  # running: sibling lock
    assert not is_episode_dir(server_run / T_A)
    assert find_episode_dirs(server_run) == [
        server_run / T_A / s for s in ("000", "001", "002", "003")
    ]


def test_server_run_without_markers_is_found(tmp_path: Path) -> None:
    # a server run whose first episode is still running: no progress.json, no result_info.json
    run = tmp_path / "saved" / "eval_results" / "ebench" / "fresh"
    _w(run / T_A / "000.lock", {"worker_id": "0", "timestamp": NOW}, NOW)
    (run / T_A / "000").mkdir()
    runs = find_runs(tmp_path, now=NOW)
    assert [r.path for r in runs] == [run]
    assert runs[0].layout == "server" and runs[0].live
    assert [(e.seed, e.complete, e.layout) for e in runs[0].episodes] == [("000", False, "server")]


def test_load_episode_standalone(tmp_path: Path) -> None:
    server_run = build_server_run(tmp_path)
    ep = load_episode(server_run / T_A / "001")
    assert (ep.benchmark, ep.run_id, ep.task_name, ep.seed) == ("ebench", "run1", T_A, "001")
    assert ep.score == 0.5 and ep.layout == "server"
    ep2 = load_episode(server_run / T_A / "000", run_dir=server_run)
    assert ep2.success is True


def test_bad_result_values_never_raise(tmp_path: Path) -> None:
    run = tmp_path / "r" / "ebench" / "x"
    _w(run / "run.json", {"run_id": "x"})
    _w(run / "ebench" / "t" / "000" / "result.json", [1, 2])
    _w(run / "ebench" / "t" / "001" / "result.json", {"score": "high"})
    _w(run / "ebench" / "t" / "002" / "result.json", b"\xff\xfe")
    _w(run / "ebench" / "t" / "003" / "result.json", {"score": 0.0, "sr": 0.0, "steps": 7})
    info = load_run(run, now=NOW)
    errs = [e.error for e in info.episodes]
    assert errs[0] == "result.json: expected a JSON object, got list"
    assert errs[1] == "result.json: 'score' is not a number ('high')"
    assert errs[2] is not None and errs[2].startswith("result.json: invalid JSON")
    assert errs[3] is None
    assert [e.complete for e in info.episodes] == [False, False, False, True]
    assert info.n_complete == 1 and info.n_success == 0 and info.success_rate == 0.0


def test_corrupt_run_level_files_are_reported(tmp_path: Path) -> None:
    run = tmp_path / "ebench" / "bad"
    _w(run / "run.json", "{")
    _w(run / "submitted.flag", "not json")
    _w(run / "ebench" / "t" / "000" / "result.json", {"score": 1.0})
    info = load_run(run, now=NOW)
    assert info.manifest is None and info.submitted == {}
    assert len(info.errors) == 2 and info.errors[0].startswith("run.json: invalid JSON")
    assert info.n_success == 1


def test_submitted_flag(tmp_path: Path) -> None:
    server_run = build_server_run(tmp_path)
    _w(server_run / "submitted.flag", {"submission_name": "s", "leaderboard_name": "l"})
    assert load_run(server_run, now=NOW).submitted == {
        "submission_name": "s",
        "leaderboard_name": "l",
    }


def test_result_json_metric_gives_total(tmp_path: Path) -> None:
    run = tmp_path / "saved" / "eval_results" / "ebench" / "done"
    _w(run / "result.json", {f"(2/2){T_A}": {"score": 1.0, "sr": 1.0}, f"(1/1){T_B}": 0.5})
    for s in ("000", "001"):
        _w(run / T_A / s / "result_info.json", {"score": 1.0, "success_rate": 1})
    _w(run / T_B / "000" / "result_info.json", {"score": 0.5, "success_rate": 0})
    info = load_run(run, now=NOW)
    assert info.total_episodes == 3
    assert info.metric[T_B].score == 0.5 and info.metric[T_B].complete
    assert info.layout == "server" and not info.live


def test_symlinks_outside_root_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    _w(outside / "ebench" / "t" / "000" / "result_info.json", {"score": 1.0})
    _w(outside / "secret.mp4", b"secret")
    root = tmp_path / "proj" / "saved" / "eval_results"
    run = root / "ebench" / "r"
    _w(run / "progress.json", {})
    _w(run / "ebench" / "t" / "001" / "result_info.json", {"score": 0.0})
    # a task dir that is a symlink out of the root, an mp4 symlink out, and an inside symlink
    (run / "ebench" / "escape").symlink_to(outside / "ebench" / "t")
    (run / "ebench" / "t" / "001" / "left_camera.mp4").symlink_to(outside / "secret.mp4")
    _w(tmp_path / "proj" / "shared" / "top_camera.mp4", b"ok")
    (run / "ebench" / "t" / "001" / "top_camera.mp4").symlink_to(
        tmp_path / "proj" / "shared" / "top_camera.mp4"
    )
    # run-level files that are symlinks out of the root are not read
    _w(outside / "run.json", {"run_id": "stolen"})
    (run / "run.json").symlink_to(outside / "run.json")
    # a link loop inside the root must not hang
    (run / "ebench" / "t" / "loop").symlink_to(run / "ebench")
    with caplog.at_level(logging.WARNING, logger="genmanip_results.discovery"):
        runs = find_runs(tmp_path / "proj", now=NOW)
    assert len(runs) == 1
    assert runs[0].manifest is None and runs[0].run_id == "r"
    assert runs[0].errors == ["run.json: symlink leads outside the results root"]
    eps = runs[0].episodes
    assert [(e.task_name, e.seed) for e in eps] == [("ebench/t", "001")]
    assert set(eps[0].videos) == {"top_camera"}
    assert "outside" in caplog.text and "symlink" in caplog.text
    # a run dir given directly: its own root is the containment boundary
    assert set(load_run(run, now=NOW).episodes[0].videos) == set()


def test_symlinked_dirs_inside_a_run_are_not_followed(tmp_path: Path) -> None:
    # `inner -> ebench` would otherwise list the same episodes again under made-up task names
    run = tmp_path / "saved" / "eval_results" / "ebench" / "r"
    _w(run / "progress.json", {})
    _w(run / "ebench" / "t" / "000" / "result_info.json", {"score": 1.0})
    (run / "inner").symlink_to(run / "ebench")
    (run / "ebench" / "t" / "001").symlink_to(run / "ebench" / "t" / "000")
    (run_info,) = find_runs(tmp_path, now=NOW)
    assert [(e.task_name, e.seed) for e in run_info.episodes] == [("ebench/t", "000")]


def test_hidden_dirs_and_nested_task_names(tmp_path: Path) -> None:
    run = tmp_path / "ebench" / "r"
    _w(run / "run.json", {})
    _w(run / ".trash" / "ebench" / "t" / "000" / "result.json", {"score": 1.0})
    _w(run / "ebench" / "a" / "b" / "c" / "d" / "007" / "result.json", {"score": 1.0})
    _w(run / "ebench" / "a" / "12" / "x" / "000" / "result.json", {"score": 0.0})
    info = load_run(run, now=NOW)
    assert [(e.task_name, e.seed) for e in info.episodes] == [
        ("ebench/a/12/x", "000"),
        ("ebench/a/b/c/d", "007"),
    ]


def test_run_scanner_incremental(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_server_run(tmp_path)
    crun, _ = build_client_runs(tmp_path)
    scanner = RunScanner(tmp_path)
    first = scanner.scan(now=NOW)
    assert sum(len(r.episodes) for r in first) == 7

    from genmanip_results import discovery as results_mod

    calls: list[Path] = []
    real_build = results_mod._build_episode

    def counting(ep_dir: Path, *a: object, **k: object):  # type: ignore[no-untyped-def]
        calls.append(ep_dir)
        return real_build(ep_dir, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(results_mod, "_build_episode", counting)
    second = scanner.scan(now=NOW)
    # only incomplete episodes are re-read
    assert sorted(p.name for p in calls) == ["001", "002", "003"]
    assert [r.path for r in second] == [r.path for r in first]
    assert [[e for e in r.episodes] for r in second] == [[e for e in r.episodes] for r in first]

    # finishing the recording episode and adding a new one is seen
    calls.clear()
    ep1 = crun / T_A / "001"
    _w(ep1 / "result.json", {"score": 1.0, "sr": 1.0, "steps": 2})
    (ep1 / "INCOMPLETE").unlink()
    _w(crun / T_A / "002" / "INCOMPLETE", "")
    third = scanner.scan(now=NOW)
    c = next(r for r in third if r.path == crun)
    assert [(e.seed, e.complete) for e in c.episodes] == [
        ("000", True),
        ("001", True),
        ("002", False),
    ]
    # complete ones stay cached once read
    calls.clear()
    scanner.scan(now=NOW)
    assert "000" not in {p.name for p in calls if p.parent == crun / T_A}
    # a deleted run disappears
    import shutil

    shutil.rmtree(crun)
    assert crun not in [r.path for r in scanner.scan(now=NOW)]


def test_scanner_sees_rewritten_result(tmp_path: Path) -> None:
    run = tmp_path / "ebench" / "r"
    _w(run / "run.json", {})
    ep = run / "ebench" / "t" / "000"
    res = _w(ep / "result.json", {"score": 0.0})
    _age(ep, time.time() - 100)  # old enough to be cached
    scanner = RunScanner(run)
    assert scanner.scan(now=NOW)[0].episodes[0].score == 0.0
    atomic_write_json(res, {"score": 1.0})  # writers replace result files atomically
    assert scanner.scan(now=NOW)[0].episodes[0].score == 1.0


def test_scanner_does_not_cache_racy_dirs(tmp_path: Path) -> None:
    # a directory modified "just now" may change again within the same mtime tick: never cached
    run = tmp_path / "ebench" / "r"
    _w(run / "run.json", {})
    res = _w(run / "ebench" / "t" / "000" / "result.json", {"score": 0.0})
    scanner = RunScanner(run)
    assert scanner.scan(now=NOW)[0].episodes[0].score == 0.0
    mt = (res.parent).stat().st_mtime_ns
    _w(res, {"score": 1.0})  # in-place rewrite, then force the same directory mtime
    os.utime(res.parent, ns=(mt, mt))
    assert scanner.scan(now=NOW)[0].episodes[0].score == 1.0


def test_real_clock_default(tmp_path: Path) -> None:
    run = tmp_path / "saved" / "eval_results" / "ebench" / "live"
    _w(run / T_A / "000.lock", {"worker_id": "0", "timestamp": time.time()})
    (run / T_A / "000").mkdir()
    assert load_run(run).live is True


def test_scanner_concurrent_scans_agree(tmp_path: Path) -> None:
    import threading

    build_server_run(tmp_path)
    build_client_runs(tmp_path)
    scanner = RunScanner(tmp_path)
    expected = [(r.path, len(r.episodes)) for r in find_runs(tmp_path, now=NOW)]
    results: list[list[tuple[Path, int]]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                results.append([(r.path, len(r.episodes)) for r in scanner.scan(now=NOW)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 20 and all(r == expected for r in results)


def test_a_runs_policy_and_every_policy_of_a_resumed_run(tmp_path: Path) -> None:
    import json

    from genmanip_results.discovery import policy_label, run_policy

    run = tmp_path / "client_results" / "testbed" / "pol"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "policy": {"spec": "mypol:make", "args": {"ckpt": "b.pt"}},
        "segments": [{"id": "1", "policy": {"spec": "mypol:make", "args": {"ckpt": "a.pt"}}},
                     {"id": "2", "policy": {"spec": "mypol:make", "args": {"ckpt": "b.pt"}}}],
    }))
    info = load_run(run)
    pol = run_policy(info)
    assert pol is not None and pol["spec"] == "mypol:make" and len(pol["all"]) == 2
    assert policy_label(pol) == "mypol:make ckpt=b.pt (+1 more)"
    assert policy_label(None) == "-"
