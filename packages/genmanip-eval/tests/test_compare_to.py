"""``gmp eval --compare-to RUN --stop-when-decided``: the sequential test decides while the run goes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval import EvalConfig, run_eval
from genmanip_eval.cli import eval_exit_code
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow


def _run(tmp: Path, policy: str, run_id: str, **extra: Any) -> Any:
    events: list[tuple[str, dict[str, Any]]] = []
    with serve_testbed(tasks="testbed/reach", run_id=run_id) as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], policy=policy, results_dir=str(tmp),
                         run_id=run_id, **extra)
        summary = run_eval(cfg, emit=lambda k, p: events.append((k, p)))
    return cfg, summary, events


def test_a_clearly_better_policy_stops_early_and_an_a_a_pair_runs_to_the_budget(tmp_path: Path) -> None:
    _, base, _ = _run(tmp_path, "zero", "base")
    n = len(base.episodes)
    assert base.complete and n >= 12
    cfg, better, events = _run(tmp_path, "expert", "better", compare_to="base", stop_when_decided=True)
    comp = better.comparison
    assert comp is not None and comp["decision"] == "better"
    assert len(better.episodes) < n and not better.complete  # stopped on the decision
    assert comp["saved"] >= 1 and comp["decided_at"] <= len(better.episodes)
    assert [k for k, _ in events].count("decided") == 1
    assert eval_exit_code(cfg, better) == 0  # a decided stop is a success, not "incomplete"
    run_json = json.loads(next((tmp_path / "testbed" / "better").glob("run.json")).read_text())
    assert run_json["comparison"]["decision"] == "better" and run_json["compare_to"] == "base"

    cfg, same, _ = _run(tmp_path, "zero", "same", compare_to="base", stop_when_decided=True)
    assert same.complete and len(same.episodes) == n  # nothing to decide: the full budget
    assert same.comparison is not None and same.comparison["decision"] is None
    assert same.comparison["n"] == n and same.comparison["unpaired"] == 0


def test_stop_when_decided_needs_a_run_to_compare_with() -> None:
    from genmanip_eval.cli import EvalFlags, eval_config
    from genmanip_eval.errors import GenmanipEvalError
    from genmanip_runtime.console import Console
    from test_cli import EVAL

    with pytest.raises(GenmanipEvalError, match="--compare-to"):
        flags = EvalFlags.of({**EVAL, "stop_when_decided": True})
        eval_config(Console(), flags,
                    url="http://127.0.0.1:1", token=None, ca_cert=None, run_id=None)
