"""Every error path gives a typed error whose message says what happened."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from genmanip_eval import EvalClient, ResetTimeout, StepError, StepTimeout, ZeroPolicy
from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_runtime.errors import AuthError, ConnectError
from genmanip_testbed import serve_testbed
from stub_server import EID, PENDING, Hangup, js, obs, pickled, stub_server

FRANKA = {"control_type": "joint_position", "action": [0.0] * 9}


def test_invalid_action_named_and_not_sent(smoke: Any) -> None:
    with EvalClient(smoke.url, ["0"]) as c:
        c.reset()
        before = smoke.stats.snapshot()["requests"].get("/step", 0)
        with pytest.raises(ValidationError) as info:
            c.step({"control_type": "joint_position", "action": [0.0] * 9})
        err = info.value
        assert err.worker == "0" and err.step == 0 and err.field == "action"
        assert "16" in str(err) and "9" in str(err)
        assert err.exit_code == ExitCode.INVALID_INPUT
        assert smoke.stats.snapshot()["requests"].get("/step", 0) == before


def test_server_500_detail_surfaces(smoke: Any) -> None:
    with EvalClient(smoke.url, ["0"], validate=False) as c:
        c.reset()
        with pytest.raises(StepError) as info:
            c.step({"control_type": "joint_position", "action": [0.0] * 9})
        err = info.value
        assert err.status == 500 and err.maybe_executed and err.sent
        assert "ValueError" in err.detail and "POST /step" in str(err)
        assert "may have been applied" in str(err)
        # The episode continues: the next valid step works.
        e, _ = c.step(ZeroPolicy().get_action(c.entries()["0"]["obs"]))
        assert e["0"]["executed_steps"] == 1


def test_step_timeout_is_not_replayed(tmp_path: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), num_steps=6, results_root=tmp_path) as tb:
        with EvalClient(tb.url, ["0"], timeouts={"step": 0.3}, max_recoveries=0) as c:
            e = c.reset()
            tb.set_faults({"latency": "1s"})
            with pytest.raises(StepTimeout) as info:
                c.step(ZeroPolicy().get_action(e["0"]["obs"]))
            err = info.value
            assert "POST /step" in str(err) and "0.3 s" in str(err) and err.maybe_executed
            assert err.exit_code == ExitCode.TIMEOUT
            tb.set_faults(None)
        # Executed at most once on the server: never silently resent.
        assert tb.stats.snapshot()["steps_by_worker"].get("0", 0) <= 1


def test_connection_refused() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with EvalClient(f"http://127.0.0.1:{port}", timeouts={"docs": 0.5}) as c:
        with pytest.raises(ConnectError) as info:
            c.reset()
    assert info.value.exit_code == ExitCode.UNREACHABLE and f"{port}" in str(info.value)


def test_reset_timeout_when_reset_stalls(tmp_path: Any) -> None:
    with serve_testbed(tasks=("testbed/smoke",), faults={"stall_reset": 5}, results_root=tmp_path) as tb:
        with EvalClient(tb.url, ["0"], timeouts={"reset_deadline": 0.5}) as c:
            with pytest.raises(ResetTimeout, match=r"worker\(s\) 0 still reset_pending after 0.5 s"):
                c.reset()


def test_token_required_and_never_shown(tmp_path: Any) -> None:
    secret = "s3cr3t-token-value"
    with serve_testbed(tasks=("testbed/smoke",), token=secret, results_root=tmp_path) as tb:
        with EvalClient(tb.url, ["0"]) as c:
            with pytest.raises(AuthError) as info:
                c.reset()
            assert secret not in str(info.value)
        with EvalClient(tb.url, ["0"], token=secret) as c:
            assert secret not in repr(c)
            e = c.reset()
            assert e["0"]["obs"]["timestep"] == 0


def test_token_from_env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GMP_TOKEN", "envtok")
    with serve_testbed(tasks=("testbed/smoke",), token="envtok", results_root=tmp_path) as tb:
        with EvalClient(tb.url, ["0"]) as c:
            assert c.reset()["0"]["obs"]["timestep"] == 0


@pytest.mark.parametrize("route", ["/protocol", "/docs"])
def test_connect_probe_lost_mid_request_is_asked_again(route: str) -> None:
    # A GET changes nothing on the server: one whose connection died before the reply (a server
    # killed while another worker's lane was already resetting) is asked again, not the end of
    # the run (it once ended a restart ride-through with "GET /protocol: connection lost").
    answered: list[int] = []

    def probe(body: bytes) -> Any:
        answered.append(1)
        if len(answered) == 1:
            raise Hangup
        if route == "/protocol":
            return js({"detail": "Not Found"}, 404)
        return 200, "text/html", b"<html></html>"

    codec = "auto" if route == "/protocol" else "legacy"
    with stub_server({route: probe}) as (url, calls):
        with EvalClient(url, ["0"], codec=codec) as c:
            c.reset()
    assert calls.count(route) == 2 and "/reset_result" in calls


def test_omitted_worker_is_typed_error() -> None:
    with stub_server({"/step": lambda b: pickled({"1": {"obs": obs(1), "metric": None,
                                                        "episode_result": None}})}) as (url, _):
        with EvalClient(url, ["0"]) as c:
            c.reset()
            with pytest.raises(StepError) as info:
                c.step(FRANKA)
    msg = str(info.value)
    assert 'response["0"]' in msg and "missing" in msg and info.value.maybe_executed


def test_garbage_reply_is_typed_error() -> None:
    with stub_server({"/step": lambda b: (200, "application/octet-stream", b"\x80\x05garbage")}) as (url, _):
        with EvalClient(url, ["0"]) as c:
            c.reset()
            with pytest.raises(StepError, match="malformed"):
                c.step(FRANKA)


def test_malicious_pickle_reply_is_refused(tmp_path: Any) -> None:
    import os
    import pickle

    sentinel = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {sentinel}",))

    with stub_server({"/step": lambda b: (200, "application/octet-stream", pickle.dumps({"0": Evil()}))}) as (url, _):
        with EvalClient(url, ["0"]) as c:
            c.reset()
            with pytest.raises(StepError, match="allow-list"):
                c.step(FRANKA)
    assert not sentinel.exists()


def test_float_metric_and_finish() -> None:
    result = {"episode_id": EID, "task_name": "bench/task_a", "seed": "000", "score": 1.0, "sr": 1.0}
    with stub_server({"/step": lambda b: pickled({"0": {"obs": None, "metric": {"bench/task_a": 0.5},
                                                        "episode_result": result}})}) as (url, _):
        with EvalClient(url, ["0"]) as c:
            c.reset()
            e, done = c.step(FRANKA)
            assert done and e["0"]["obs"] is None
            assert c.metrics == {"bench/task_a": {"score": 0.5, "sr": 0.0}}
            assert c.episode_results[0].success


def test_lock_lost_is_an_event() -> None:
    lost = dict(PENDING, lock_lost=True)
    nxt = {"obs": obs(0, reset=True, eid="bench/run/bench/task_a/001"), "metric": None, "episode_result": None}
    events: list[str] = []
    with stub_server({"/step": lambda b: pickled({"0": lost})}) as (url, calls):
        with EvalClient(url, ["0"], on_event=lambda n, p: events.append(n)) as c:
            c.reset()
            # The second reset_result answers with the next task's first observation.
            e, done = c.step(FRANKA)
            assert not done
            assert e["0"]["obs"]["reset"] is True and e["0"]["lock_lost"] is True
            assert c.lock_lost_count == 1 and events == ["lock_lost"]
            assert nxt  # the stub's default reset_result serves the next observation
    assert calls.count("/reset_result") >= 2
