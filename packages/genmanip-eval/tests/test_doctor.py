"""``gmp doctor`` against the testbed: advice follows the measurements, broken policies are flagged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval.doctor import SCHEMA, DoctorConfig, Report, run_doctor
from genmanip_eval.doctor.cli import doctor, render_text
from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.console import Console
from genmanip_testbed import serve_testbed


@pytest.fixture()
def tb(tmp_path: Path) -> Iterator[Any]:
    """A testbed whose episodes outlast the probe (lift tasks, 60 steps)."""
    with serve_testbed(tasks=("testbed/all",), num_steps=60, results_root=tmp_path / "server") as server:
        yield server


def _doctor(url: str, **kw: Any) -> Report:
    return run_doctor(DoctorConfig(url=url, probe_steps=kw.pop("probe_steps", 6), **kw))


def _handler(url: str, capsys: pytest.CaptureFixture[str], **kw: Any) -> tuple[int, str]:
    args: dict[str, Any] = {
        "url": url, "host": None, "port": None, "token": None, "ca_cert": None, "run_id": None,
        "worker_ids": "0", "policy": None, "policy_arg": [], "chunk_size": 1, "robot": None,
        "no_steps": False, "probe_steps": 6, "episode_steps": 300, "as_json": True,
    }
    args.update(kw)
    code = doctor(**args, console=Console(quiet=True))
    return code, capsys.readouterr().out


def test_expert_passes_clean(tb: Any) -> None:
    rep = _doctor(tb.url, policy="expert", worker_ids=["0", "1"])
    assert rep.ids("fail", "warn") == [], render_text(rep)
    assert rep.healthy and rep.exit_code == ExitCode.OK
    assert rep.probe["steps"] == 6 and rep.probe["checked_calls"] == 6
    # the probe worker was released: the server re-queues its seed
    assert tb.stats.requests["/kill"] >= 2
    pol = rep.measurements["policy_ms"]["by_batch"]
    assert set(pol) == {"1", "2"}
    assert {m["codec"] for m in rep.measurements["wire"]} == {"msgpack", "legacy"}
    raw = next(m for m in rep.measurements["wire"] if m["frames"] == "raw")
    jpeg = next(m for m in rep.measurements["wire"] if m["codec"] == "msgpack" and m["frames"] == "jpeg")
    assert raw["reply_bytes"] > 5 * jpeg["reply_bytes"]  # 4 cameras raw vs JPEG


@pytest.mark.parametrize(
    ("spec", "finding"),
    [
        ("doctor_policies:wrong_shape", "contract.shape"),
        ("doctor_policies:nans", "contract.non_finite"),
        ("doctor_policies:closed_gripper", "contract.gripper_polarity"),
        ("doctor_policies:bad_quaternion", "contract.quaternion"),
        ("doctor_policies:constant", "contract.constant"),
        ("doctor_policies:missing_camera", "contract.missing_key"),
    ],
)
def test_broken_policies_are_flagged(tb: Any, spec: str, finding: str) -> None:
    rep = _doctor(tb.url, policy=spec)
    assert finding in rep.ids("fail", "warn"), render_text(rep)
    assert not rep.healthy and rep.exit_code == ExitCode.FAILURE
    f = next(f for f in rep.findings if f.id == finding)
    assert f.evidence and f.fix and f.part == "contract"


def test_missing_key_names_the_key_and_the_keys_present(tb: Any) -> None:
    rep = _doctor(tb.url, policy="doctor_policies:missing_camera")
    f = next(f for f in rep.findings if f.id == "contract.missing_key")
    assert f.data["key"] == "video.front_view"
    assert "video.top_camera_view" in f.data["keys_present"]
    assert "video.top_camera_view" in f.fix


def test_chunk_length_against_chunk_size(tb: Any) -> None:
    rep = _doctor(tb.url, policy="doctor_policies:short_chunks", chunk_size=4)
    f = next(f for f in rep.findings if f.id == "contract.chunk_length")
    assert f.data["lengths"] == [2]


def test_advice_follows_injected_latency(tb: Any) -> None:
    fast = _doctor(tb.url, policy="expert", worker_ids=["0", "1"])
    tb.set_faults({"latency": "200ms"})
    slow = _doctor(tb.url, policy="expert", worker_ids=["0", "1"])
    f_adv, s_adv = fast.advice, slow.advice
    assert s_adv["inputs"]["S_server_ms"] >= 190 > 100 > f_adv["inputs"]["S_server_ms"]
    assert s_adv["current"]["bottleneck"] == "server"
    assert f_adv["current"]["bottleneck"] != "server"
    assert f_adv["current"]["steps_per_s"] > 3 * s_adv["current"]["steps_per_s"]
    # a server-bound run gains from more workers: the advice asks for more of them
    assert s_adv["workers"] > f_adv["workers"]
    assert s_adv["formula"].startswith("steps/s ~= W / (S + N(W) + P(W)/K)")


def test_no_steps_sends_no_step(tb: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _handler(tb.url, capsys, policy="expert", no_steps=True)
    assert tb.stats.requests.get("/step", 0) == 0
    assert tb.stats.requests.get("/reset", 0) == 0
    doc = json.loads(out)
    assert doc["probe"]["no_steps"] is True and doc["probe"]["steps"] == 0
    assert doc["measurements"]["policy_ms"]["synthetic"] is True
    assert "probe.no_steps" in [f["id"] for f in doc["findings"]]
    assert code == doc["exit_code"] == 0


def test_json_schema_and_exit_code(tb: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _handler(tb.url, capsys, policy="doctor_policies:nans")
    doc = json.loads(out)
    assert code == doc["exit_code"] == ExitCode.FAILURE
    assert doc["schema"] == SCHEMA
    assert set(doc) == {"schema", "healthy", "exit_code", "counts", "server", "probe",
                        "measurements", "advice", "findings"}
    assert doc["healthy"] is False and doc["counts"]["fail"] >= 1
    for f in doc["findings"]:
        assert set(f) == {"id", "part", "severity", "title", "evidence", "fix", "data"}
        assert f["severity"] in ("fail", "warn", "info")
    sev = [f["severity"] for f in doc["findings"]]
    assert sev == sorted(sev, key=("fail", "warn", "info").index)  # worst first
    adv = doc["advice"]
    for key in ("formula", "inputs", "current", "recommended", "workers", "chunk_size", "codec",
                "frames", "inference", "steps_per_s", "episodes_per_hour", "bottleneck", "reasons"):
        assert key in adv
    assert doc["server"]["robot_id"] == "manip/lift2/R5a"


def test_text_report_on_stdout(tb: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _handler(tb.url, capsys, policy="expert", as_json=False)
    assert code == 0
    assert "advice" in out and "steps/s" in out and "healthy" in out
    assert "real step(s), released with /kill" in out


def test_unreachable_server_is_its_exit_code() -> None:
    with pytest.raises(GenmanipError) as info:
        _doctor("http://127.0.0.1:9", no_steps=True)
    assert info.value.exit_code == ExitCode.UNREACHABLE
