"""A resumed run keeps its story: the same policy unless asked, every invocation in ``run.json``,
the final table over the whole run (issue 19, "resume that keeps the run's story")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from genmanip_eval import EvalConfig
from genmanip_eval.cli import PolicyChanged, evaluate
from genmanip_protocol.errors import ExitCode
from genmanip_runtime.console import Console
from genmanip_testbed import serve_testbed


def test_resume_refuses_another_policy_and_keeps_every_invocation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    res = str(tmp_path / "res")
    with serve_testbed(tasks="testbed/reach/easy", num_steps=4, run_id="story") as tb:
        first = EvalConfig(url=tb.url, run_id="story", worker_ids=["0"], policy="zero",
                           results_dir=res, max_episodes=3)
        s1 = evaluate(first, Console(sys.stderr))
        assert len(s1.episodes) == 3
        capsys.readouterr()
        other = EvalConfig(url=tb.url, run_id="story", worker_ids=["0"], policy="expert", results_dir=res)
        with pytest.raises(PolicyChanged) as info:
            evaluate(other, Console(sys.stderr))
        assert info.value.exit_code == ExitCode.REFUSED
        assert "was evaluated with policy zero" in str(info.value) and "runs expert" in str(info.value)
        allowed = EvalConfig(url=tb.url, run_id="story", worker_ids=["0"], policy="expert",
                             results_dir=res, allow_policy_change=True)
        s2 = evaluate(allowed, Console(sys.stderr))
    out, err = capsys.readouterr()
    assert s2.complete and len(s2.episodes) == 8 - 3
    # the table covers the whole run, and says what this invocation added
    assert "8 finished episodes in all; this invocation added 5" in err
    assert out.splitlines()[-1].split()[:2] == ["all", "8"], out
    run_json = json.loads(next(Path(res).rglob("run.json")).read_text())
    segs = run_json["segments"]
    assert [s["policy"]["spec"] for s in segs] == ["zero", "expert"]
    assert [s["outcome"] for s in segs] == ["stopped", "complete"]
    assert [s["episodes"] for s in segs] == [3, 5]
    assert all(s["started"] <= s["finished"] for s in segs)
    # episode lines are numbered within the whole job
    assert "episode 4/8: " in err and "episode 1/8: " not in err
