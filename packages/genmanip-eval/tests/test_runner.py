"""gmp eval's runner end to end: policies per worker, chunk modes, recording, processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval import EvalConfig, PolicyError, WorkerProcessError, run_eval
from genmanip_results.video import probe_video


def _episode_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("steps.jsonl"))


def check_recording(root: Path, stats: dict[str, Any], n_episodes: int) -> None:
    dirs = _episode_dirs(root)
    assert len(dirs) == n_episodes
    for d in dirs:
        res = json.loads((d / "result.json").read_text())
        assert not (d / "INCOMPLETE").exists()
        rows = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines()]
        # One row per executed action, as the server counted them.
        assert len(rows) == res["steps"] == stats["steps_by_episode"][res["episode_id"]]
        assert [r["step"] for r in rows] == list(range(len(rows)))
        frames = 1 + max(r["frame"] for r in rows)
        # (the default --transcode deferred keeps each camera's JPEG frame store; no mp4 yet)
        stores = sorted(p.name for p in d.glob("*.jpegs"))
        assert stores == ["left_camera.jpegs", "overlook_camera.jpegs", "right_camera.jpegs", "top_camera.jpegs"]
        assert not list(d.glob("*.mp4"))
        for store in stores:
            n, _w, _h = probe_video(d / store)
            assert n >= frames  # every observation received is a frame (the last one has no row)
        er = json.loads((d.parent / "episode_result.json").read_text())
        assert er[d.name] == {"score": res["score"], "sr": res["sr"]}


@pytest.mark.parametrize(
    ("codec", "policy", "chunk_size", "step_chunk"),
    [
        ("legacy", "zero", None, False),
        ("msgpack", "expert", None, False),
        ("msgpack", "helper_policies:chunky", 3, False),
        ("legacy", "helper_policies:chunky", 3, True),
    ],
)
def test_run_records_every_step(smoke: Any, tmp_path: Path, codec: str, policy: str,
                                chunk_size: int | None, step_chunk: bool) -> None:
    root = tmp_path / "results"
    events: list[tuple[str, dict[str, Any]]] = []
    cfg = EvalConfig(url=smoke.url, worker_ids=["0", "1"], policy=policy, codec=codec,
                     chunk_size=chunk_size, step_chunk=step_chunk, results_dir=str(root), live_every=2)
    summary = run_eval(cfg, emit=lambda k, p: events.append((k, p)))
    stats = smoke.stats.snapshot()
    assert summary.complete and len(summary.episodes) == 2
    assert summary.steps == sum(stats["steps_by_worker"].values()) == 12
    check_recording(root, stats, 2)
    run_dir = Path(summary.run_dirs[0])
    run = json.loads((run_dir / "run.json").read_text())
    assert run["policy"]["spec"] == policy and run["server_url"] == smoke.url
    assert "genmanip-eval" in " ".join(run["versions"]) and run["finished"]
    assert sorted(run["workers"]) == ["0", "1"]
    assert run["total_episodes"] == 2 and run["benchmark"] == "testbed" and run["run_id"] == run_dir.name
    # The shared results reader sees the run complete.
    from genmanip_results.discovery import find_runs

    (info,) = find_runs(root)
    assert info.layout == "client" and info.n_complete == 2 and info.total_episodes == 2
    assert any((run_dir / ".live" / w / "live.json").is_file() for w in ("0", "1"))
    if chunk_size:
        rows = [json.loads(x) for d in _episode_dirs(root) for x in (d / "steps.jsonl").read_text().splitlines()]
        assert {r["chunk"]["size"] for r in rows} <= {1, 2, 3}
        assert any(r["chunk"]["index"] == 2 for r in rows)
        if not step_chunk:  # client-side replay: later chunk rows point back at the chunk's obs
            assert any(r["obs_timestep"] < r["step"] and r["state"] is None for r in rows)
    assert [k for k, _ in events].count("episode") == 2


def test_no_record_writes_nothing(smoke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = EvalConfig(url=smoke.url, record=False)
    summary = run_eval(cfg)
    assert summary.complete and summary.run_dirs == [] and list(cwd.iterdir()) == []


def test_max_episodes_stops_early(reach: Any, tmp_path: Path) -> None:
    cfg = EvalConfig(url=reach.url, worker_ids=["0"], max_episodes=2, results_dir=str(tmp_path))
    summary = run_eval(cfg)
    assert len(summary.episodes) == 2 and not summary.complete
    # The interrupted episode stays marked incomplete; finished ones are complete.
    assert len(list(tmp_path.rglob("result.json"))) == 2


@pytest.mark.slow
def test_processes_spread_workers(reach: Any, tmp_path: Path) -> None:
    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1", "2", "3"], processes=2, results_dir=str(tmp_path))
    summary = run_eval(cfg)
    stats = reach.stats.snapshot()
    assert summary.complete and len(summary.episodes) == 8
    assert sorted(stats["steps_by_worker"]) == ["0", "1", "2", "3"]
    check_recording(tmp_path, stats, 8)
    run = json.loads((Path(summary.run_dirs[0]) / "run.json").read_text())
    assert sorted(run["workers"]) == ["0", "1", "2", "3"]


@pytest.mark.slow
def test_processes_end_the_segment_once_with_the_whole_runs_totals(reach: Any, tmp_path: Path) -> None:
    # Each process records its share; the invocation (the parent) writes the segment's outcome
    # once, from the merged summary: not the last process's own episodes and steps.
    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1"], processes=2, results_dir=str(tmp_path))
    summary = run_eval(cfg)
    stats = reach.stats.snapshot()
    assert summary.complete and len(summary.episodes) == 8
    by_process = [sum(1 for e in summary.episodes if e["worker_id"] == w) for w in ("0", "1")]
    assert all(0 < n < 8 for n in by_process)  # both processes ran episodes
    (run_dir,) = summary.run_dirs
    (seg,) = json.loads((Path(run_dir) / "run.json").read_text())["segments"]
    assert seg["outcome"] == "complete" and seg["finished"] >= seg["started"]
    assert seg["episodes"] == 8
    assert seg["steps"] == summary.steps == sum(stats["steps_by_worker"].values()) > 0
    assert seg["workers"] == ["0", "1"]


@pytest.mark.slow
def test_dead_worker_process_is_reported(reach: Any, tmp_path: Path) -> None:
    # (killed in its second episode, a second on: the process has reported its run directory)
    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1"], processes=2, policy="helper_policies:killer",
                     policy_args={"at": "8", "wait": "1"}, results_dir=str(tmp_path / "res"))
    with pytest.raises(WorkerProcessError, match="killed by signal SIGKILL"):
        run_eval(cfg, grace_s=5)
    # The invocation failed: its segment says so (not "running", as the dead processes left it).
    (run_json,) = (tmp_path / "res").rglob("run.json")
    (seg,) = json.loads(run_json.read_text())["segments"]
    assert seg["outcome"] == "failed" and seg["episodes"] == 2 and seg["steps"] == 2 * 5 + 2 * 2


@pytest.mark.slow
def test_policy_error_in_process_is_reported(reach: Any, tmp_path: Path) -> None:
    cfg = EvalConfig(url=reach.url, worker_ids=["0", "1"], processes=2, policy="helper_policies:raiser",
                     results_dir=str(tmp_path))
    with pytest.raises(WorkerProcessError, match="policy exploded"):
        run_eval(cfg, grace_s=5)


@pytest.mark.slow
def test_giving_up_in_a_worker_process_keeps_its_hint(tmp_path: Path) -> None:
    from genmanip_testbed import serve_testbed

    faults = {"error_rate": 1.0, "errors": "503", "routes": ["step"]}
    with serve_testbed(tasks="testbed/smoke", faults=faults) as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], processes=2, max_recoveries=1,
                         results_dir=str(tmp_path))
        with pytest.raises(WorkerProcessError, match="HTTP 503") as info:
            run_eval(cfg, grace_s=5)
    assert info.value.hint is not None and "failed 1 time in a row" in info.value.hint


def test_chunk_size_needs_chunk_policy(smoke: Any) -> None:
    # helper_policies:raiser has only get_action (the check comes before its first call).
    with pytest.raises(PolicyError, match="get_action_chunk"):
        run_eval(EvalConfig(url=smoke.url, policy="helper_policies:raiser", chunk_size=4, record=False))
    with pytest.raises(PolicyError, match="get_action_chunk"):
        run_eval(EvalConfig(url=smoke.url, policy="helper_policies:raiser", step_chunk=True, record=False))
