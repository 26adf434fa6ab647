"""``gmp eval --policy ws://...``'s runner against a policy server in another process: the same
per-seed results as the policy in-process, on a testbed job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from genmanip_eval.runner import EvalConfig, run_eval
from genmanip_testbed import serve_testbed


def _results(tmp: Path, name: str, policy: str, args: dict[str, str]) -> dict[tuple[str, str], tuple[float, float]]:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=12, results_root=tmp / name, run_id="r1") as tb:
        cfg = EvalConfig(url=tb.url, policy=policy, policy_args=args, worker_ids=["0", "1"], record=False)
        summary = run_eval(cfg)
    assert summary.complete, summary
    return {(e["task_name"], str(e["seed"])): (float(e["score"]), float(e["sr"])) for e in summary.episodes}


def test_remote_expert_matches_in_process(server_proc: Callable[..., Any], tmp_path: Path) -> None:
    # noise=0: the expert is deterministic whichever worker runs which episode.
    srv = server_proc(policy="expert", policy_arg=["noise=0"])
    local = _results(tmp_path, "local", "expert", {"noise": "0"})
    remote = _results(tmp_path, "remote", srv.url, {})
    assert local and remote == local


def test_a_policy_server_that_dies_mid_run_stops_the_run_and_the_run_resumes(
    server_proc: Callable[..., Any], tmp_path: Path
) -> None:
    import pytest
    from genmanip_eval.errors import PolicyError

    res = tmp_path / "res"
    with serve_testbed(tasks=("testbed/reach/easy",), num_steps=8, results_root=tmp_path / "srv",
                       run_id="r2", faults="latency=20ms") as tb:
        srv = server_proc(policy="expert", policy_arg=["noise=0"])
        stepped = 0

        def emit(kind: str, payload: dict[str, Any]) -> None:
            nonlocal stepped
            if kind == "steps":
                stepped += int(payload["n"])
                if stepped == 5:  # mid-episode (8 steps each): the policy server dies
                    srv.proc.kill()

        cfg = EvalConfig(url=tb.url, run_id="r2", policy=srv.url, worker_ids=["0", "1"],
                         results_dir=str(res))
        with pytest.raises(PolicyError) as info:
            run_eval(cfg, emit=emit)
        assert "policy server" in str(info.value).lower()
        first = tb.stats.snapshot()
        # A new policy server; the same run resumes with exactly the missing episodes.
        srv2 = server_proc(policy="expert", policy_arg=["noise=0"])
        summary = run_eval(EvalConfig(url=tb.url, run_id="r2", policy=srv2.url, worker_ids=["0", "1"],
                                      results_dir=str(res)))
        end = tb.stats.snapshot()
    assert summary.complete
    results = sorted(res.rglob("result.json"))
    assert len(results) == 8  # every episode of the job, each recorded once
    # No step was sent twice: every recorded episode has exactly the actions of the attempt the
    # server scored (the testbed counts the actions applied to each attempt of each episode).
    attempts = end["steps_by_attempt"]
    for result in results:
        d = result.parent
        eid = "/".join(d.relative_to(res).parts)
        rows = len((d / "steps.jsonl").read_text().splitlines())
        assert rows == attempts[eid][-1], (eid, rows, attempts[eid])
    assert sum(first["steps_by_worker"].values()) > 0
