"""``gmp policy serve`` in its own process, driven by ``gmp eval --policy ws://...``: the same
per-seed results as ``--policy expert`` in-process; Ctrl-C stops the server with exit 130."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from genmanip.cli.main import main
from genmanip_testbed import serve_testbed


def _per_seed(results: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for f in sorted(results.rglob("episode_result.json")):
        for seed, r in json.loads(f.read_text()).items():
            out[f"{f.parent.name}/{seed}"] = {"score": r["score"], "sr": r["sr"]}
    return out


def _eval(tmp: Path, name: str, policy: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, float]]:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=12, results_root=tmp / f"srv-{name}", run_id="r1") as tb:
        code = main(["eval", "--url", tb.url, "--policy", policy, *args, "--worker-ids", "0,1",
                     "--results-dir", str(tmp / name)])
    err = capsys.readouterr().err
    assert code == 0, err
    return _per_seed(tmp / name)


def test_gmp_eval_against_gmp_policy_serve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "genmanip", "policy", "serve", "--policy", "expert",
         "--policy-arg", "noise=0", "--port", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"policy server (ws://127\.0\.0\.1:\d+)", line)
        assert m, line + proc.stderr.read()
        local = _eval(tmp_path, "local", "expert", ["--policy-arg", "noise=0"], capsys)
        remote = _eval(tmp_path, "remote", m.group(1), [], capsys)
        assert local and remote == local
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and out == ""
