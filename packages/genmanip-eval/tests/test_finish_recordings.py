"""Resuming a run whose job is complete (``gmp eval --run-id R``, exit 0) still finishes what a
stopped invocation left of its recordings: here, the last episode's result, which the server
still holds because the client was stopped after the server ended the episode and before the
result came back."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

from genmanip_eval import EvalClient, EvalConfig, Interrupted, ZeroPolicy
from genmanip_eval.cli import evaluate
from genmanip_runtime.console import Console
from genmanip_testbed import serve_testbed

NUM_STEPS = 6
RUN = "fin1"


def _step_until_stopped(c: EvalClient, out: dict[str, Any]) -> None:
    pol = ZeroPolicy()
    try:
        e = c.reset()
        while not c.done:
            e, _ = c.step(pol.get_action(e["0"]["obs"]))
    except BaseException as exc:
        out["error"] = exc


def test_resuming_a_complete_run_collects_the_result_a_stopped_client_left(tmp_path: Path) -> None:
    res = tmp_path / "results"
    # Slow background resets: after the last episode ends, its result stays with the server for 3 s.
    with serve_testbed(tasks=("testbed/smoke",), num_steps=NUM_STEPS, results_root=tmp_path / "srv",
                       reset_delay=3.0, run_id=RUN) as tb:
        last = res / "testbed" / RUN / "testbed" / "smoke" / "red_block_easy" / "001"
        c = EvalClient(tb.url, ["0"], run_id=RUN, record=True, results_dir=str(res))
        out: dict[str, Any] = {}
        t = threading.Thread(target=_step_until_stopped, args=(c, out), daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        # The server ended the last episode; the client waits for its result: stop it now.
        while not list(last.glob(".awaiting_result.*.json")):
            assert time.monotonic() < deadline and t.is_alive(), out
            time.sleep(0.01)
        c.interrupt()
        t.join(30)
        assert isinstance(out.get("error"), Interrupted)
        c.close()
        assert (last / "INCOMPLETE").exists() and not (last / "result.json").exists()
        tb.wait_finalizes()

        err = io.StringIO()
        cfg = EvalConfig(url=tb.url, run_id=RUN, worker_ids=["0"], policy="zero", results_dir=str(res))
        summary = evaluate(cfg, Console(err))
        snap = tb.stats.snapshot()
    assert summary.complete, err.getvalue()
    said = err.getvalue()
    assert "nothing left to evaluate" in said
    assert "finished the recordings of 1 episode(s) a stopped invocation left" in said, said
    result = json.loads((last / "result.json").read_text())
    assert result["seed"] == "001" and result["steps"] == NUM_STEPS
    assert not (last / "INCOMPLETE").exists() and not list(last.glob(".*_result.*.json"))
    assert sorted(json.loads((last.parent / "episode_result.json").read_text())) == ["000", "001"]
    assert snap["steps_by_attempt"][f"testbed/{RUN}/testbed/smoke/red_block_easy/001"] == [NUM_STEPS]
