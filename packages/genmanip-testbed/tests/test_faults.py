"""Fault injection: parsing, determinism, and each fault's effect over real HTTP."""

from __future__ import annotations

import http.client
import logging
import pickle
import threading
import time
from typing import Any

import pytest
from _tbhelpers import OCTET, Raw, poll_reset
from genmanip_testbed import FaultSpec, FaultSpecError, parse_fault_spec, serve_testbed
from genmanip_testbed.faults import FaultState

pytestmark = pytest.mark.timeout(120)

ZERO = {"control_type": "joint_position", "action": [0.0] * 16, "is_rel": True}


def test_parse_full_spec() -> None:
    spec = parse_fault_spec(
        "latency=20ms,error_rate=0.1,errors=500|503|504,reset_before=0.05,"
        "reset_after=0.05,stall_reset=1,die_worker=1@30|2@5,seed=7"
    )
    assert spec == FaultSpec(
        latency_s=0.02,
        error_rate=0.1,
        errors=(500, 503, 504),
        reset_before=0.05,
        reset_after=0.05,
        stall_reset=1,
        die_worker=(("1", 30), ("2", 5)),
        seed=7,
    )
    assert parse_fault_spec("latency=0.5s").latency_s == 0.5
    assert FaultSpec.coerce({"error_rate": 0.5, "errors": [503], "routes": "step"}).routes == (
        "step",
    )
    assert FaultSpec.coerce(None) == FaultSpec() and not FaultSpec().active


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("latency=fast", "fault latency"),
        ("error_rate=2", "fault error_rate"),
        ("errors=418", "fault errors"),
        ("die_worker=1", "fault die_worker"),
        ("bogus=1", "unknown key 'bogus'"),
        ("latency", "expected key=value"),
        ("stall_reset=-1", "fault stall_reset"),
    ],
)
def test_bad_specs_name_the_key(text: str, match: str) -> None:
    with pytest.raises(FaultSpecError, match=match):
        parse_fault_spec(text)


def test_decisions_are_deterministic_for_a_seed() -> None:
    spec = parse_fault_spec(
        "error_rate=0.3,errors=500|503|504,reset_before=0.2,reset_after=0.2,seed=7"
    )

    def run(s: FaultSpec) -> list[Any]:
        st = FaultState(s)
        return [st.decide(r) for r in ("step", "reset", "step", "step_chunk") * 50]

    a, b = run(spec), run(spec)
    assert a == b
    assert a != run(
        parse_fault_spec(
            "error_rate=0.3,errors=500|503|504,reset_before=0.2,reset_after=0.2,seed=8"
        )
    )
    kinds = {(d.error, d.reset_before, d.reset_after) for d in a}
    assert len(kinds) >= 4  # a mix of outcomes, not all-or-nothing
    # Routes outside the faulted set are never touched.
    assert all(FaultState(spec).decide("status") == FaultState().decide("step") for _ in range(5))


def _statuses(url: str, n: int) -> list[int | str]:
    out: list[int | str] = []
    for _ in range(n):
        raw = Raw(url)
        try:
            st, _ = raw.pickle_post("/step", {"0": ZERO})
            out.append(st)
        except (ConnectionError, http.client.HTTPException):
            out.append("reset")
        finally:
            raw.close()
    return out


def test_same_seed_same_faults_over_http() -> None:
    spec = "error_rate=0.3,errors=500|503,reset_before=0.2,seed=11"
    seqs = []
    for _ in range(2):
        with serve_testbed(tasks=("testbed/smoke",), faults=spec) as tb:
            raw = Raw(tb.url)
            tb.set_faults(None)
            raw.pickle_post("/reset", {"worker_ids": ["0"]})
            poll_reset(raw, ["0"])
            raw.close()
            tb.set_faults(spec)
            seqs.append(_statuses(tb.url, 16))
            executed = tb.stats.total_steps
            assert executed == seqs[-1].count(200)  # faulted requests did no work
    assert seqs[0] == seqs[1]
    assert {200, "reset"} <= set(seqs[0]) and ({500, 503} & set(seqs[0]))


def test_connection_resets_before_and_after_the_work() -> None:
    with serve_testbed(tasks=("testbed/smoke",)) as tb:
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        poll_reset(raw, ["0"])
        raw.close()
        tb.set_faults("reset_before=1,routes=step")
        raw = Raw(tb.url)
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            raw.pickle_post("/step", {"0": ZERO})
        raw.close()
        assert tb.stats.total_steps == 0
        tb.set_faults("reset_after=1,routes=step")
        raw = Raw(tb.url)
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            raw.pickle_post("/step", {"0": ZERO})
        raw.close()
        assert tb.stats.total_steps == 1  # executed, but the reply never came
        assert tb.stats.faults["reset_before"] == 1 and tb.stats.faults["reset_after"] == 1
        tb.set_faults(None)
        raw = Raw(tb.url)
        st, resp = raw.pickle_post("/step", {"0": ZERO})
        assert st == 200 and resp["0"]["obs"]["timestep"] == 2
        raw.close()


def test_error_replies_latency_and_runtime_change() -> None:
    with serve_testbed(tasks=("testbed/smoke",), faults={"error_rate": 1.0, "errors": [503]}) as tb:
        raw = Raw(tb.url)
        st, body = raw.pickle_post("/reset", {"worker_ids": ["0"]})
        assert st == 503 and "injected" in body["detail"]
        assert tb.stats.resets_started == 0
        assert raw.get_json("/status")[0] == 200  # /status is not a faulted route by default
        tb.set_faults("latency=150ms")
        t0 = time.perf_counter()
        st, _, _ = raw.request("POST", "/reset", b"", ctype="application/octet-stream")
        assert time.perf_counter() - t0 >= 0.15
        raw.close()


def test_latency_is_the_servers_time_with_its_work_inside() -> None:
    """The work is done when the request arrives and the reply leaves ``latency`` after it (with
    the server-timing header saying so), so four simultaneous steps all come back at ``latency``:
    the testbed's own work does not queue on top of it, as the real server's workers step in
    parallel."""
    with serve_testbed(tasks=("testbed/reach",)) as tb:
        raws = [Raw(tb.url) for _ in range(4)]
        ids = [str(i) for i in range(4)]
        raws[0].pickle_post("/reset", {"worker_ids": ids})
        poll_reset(raws[0], ids)
        tb.set_faults("latency=1s")
        before = tb.stats.snapshot()["steps_by_worker"]
        replies: dict[str, tuple[float, float]] = {}

        def step(i: int) -> None:
            t0 = time.perf_counter()
            st, headers, _ = raws[i].request(
                "POST", "/step", pickle.dumps({ids[i]: ZERO}), ctype=OCTET)
            assert st == 200
            replies[ids[i]] = (time.perf_counter() - t0, float(headers["x-genmanip-server-ms"]))

        threads = [threading.Thread(target=step, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        # every step is executed long before any reply leaves
        deadline = time.monotonic() + 0.8
        while True:
            executed = tb.stats.snapshot()["steps_by_worker"]
            done = all(executed.get(w, 0) == before.get(w, 0) + 1 for w in ids)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert done and not replies, (before, executed, replies)
        for t in threads:
            t.join(30)
        assert sorted(replies) == ids
        for wall, server_ms in replies.values():
            assert wall >= 1.0 and server_ms >= 1000.0
        for r in raws:
            r.close()


def test_worker_death_requeues_the_seed() -> None:
    with serve_testbed(tasks=("testbed/smoke",), faults="die_worker=0@3") as tb:
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        first = poll_reset(raw, ["0"])["0"]
        ep_id = first["obs"]["episode_id"]
        assert raw.pickle_post("/step", {"0": ZERO})[0] == 200
        assert raw.pickle_post("/step", {"0": ZERO})[0] == 200
        st, body = raw.pickle_post("/step", {"0": ZERO})
        assert st == 500 and body["detail"].startswith("RayActorError: ")
        assert tb.stats.steps_by_worker["0"] == 2
        assert raw.get_json("/status")[1]["data"]["active_workers"] == []
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        again = poll_reset(raw, ["0"])["0"]
        assert again["obs"]["episode_id"] == ep_id and again["obs"]["timestep"] == 0
        raw.close()


def test_stalled_reset_until_kill() -> None:
    with serve_testbed(tasks=("testbed/smoke",), faults="stall_reset=1", reset_delay=0.01) as tb:
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        time.sleep(0.4)
        st, resp = raw.pickle_post("/reset_result", {"worker_ids": ["0"]})
        assert st == 200 and resp["0"]["reset_pending"] is True
        assert raw.json_post("/kill", {"data": {"worker_ids": ["0"]}})[0] == 200
        raw.pickle_post("/reset", {"worker_ids": ["0"]})
        entry = poll_reset(raw, ["0"])["0"]
        assert entry["obs"]["episode_id"].endswith("/000")
        assert tb.stats.faults["stall_reset"] == 1
        raw.close()


def test_shutdown_is_prompt_with_stalled_resets_nobody_killed() -> None:
    """A client that died without /kill leaves resets stalled forever: closing the testbed must
    still be quick (every reset ever started is cancelled, not only the workers' current ones)."""
    with serve_testbed(tasks=("testbed/smoke",), faults="stall_reset=5", reset_delay=0.01) as tb:
        raw = Raw(tb.url)
        raw.pickle_post("/reset", {"worker_ids": ["0", "1"]})
        time.sleep(0.3)
        # A second /reset of a busy-looking worker and a /kill of another: stalled resets whose
        # worker is gone or was replaced.
        raw.json_post("/kill", {"data": {"worker_ids": ["1"]}})
        raw.pickle_post("/reset", {"worker_ids": ["1"]})
        time.sleep(0.3)
        assert tb.stats.faults["stall_reset"] >= 2
        raw.close()
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10.0


@pytest.mark.parametrize(
    ("faults", "status"),
    [
        # the work is done (a reset started): its reply, due in a minute, goes at once
        ("latency=60s,routes=reset", 200),
        # no work to answer with: the wait for the injected error is cut short with a 503
        ("latency=60s,error_rate=1,errors=500,routes=reset", 503),
    ],
)
def test_shutdown_answers_a_request_in_a_long_latency_at_once(
    caplog: pytest.LogCaptureFixture, faults: str, status: int
) -> None:
    """A request in a long injected latency is answered promptly when the testbed closes,
    instead of being cancelled by uvicorn (which logs a traceback per request)."""
    replies: list[int] = []
    uvicorn_log = logging.getLogger("uvicorn.error")  # (uvicorn's loggers do not propagate)
    with serve_testbed(tasks=("testbed/smoke",), faults=faults) as tb:
        uvicorn_log.addHandler(caplog.handler)
        raw = Raw(tb.url)

        def call() -> None:
            body = pickle.dumps({"worker_ids": ["0"]})
            replies.append(raw.request("POST", "/reset", body, ctype=OCTET)[0])

        t = threading.Thread(target=call)
        t.start()
        while not tb.stats.faults["latency"]:
            time.sleep(0.02)
        t0 = time.monotonic()
    uvicorn_log.removeHandler(caplog.handler)
    t.join(10)
    assert time.monotonic() - t0 < 1.5
    assert replies == [status]
    assert "Exception in ASGI application" not in caplog.text
    assert "graceful shutdown exceeded" not in caplog.text


def test_max_faults_faults_exactly_the_next_n_requests() -> None:
    assert parse_fault_spec("error_rate=1,max_faults=2").max_faults == 2
    with pytest.raises(FaultSpecError, match="fault max_faults"):
        parse_fault_spec("max_faults=two")
    state = FaultState(parse_fault_spec("error_rate=1,errors=503,max_faults=2,routes=step"))
    decisions = [state.decide("step") for _ in range(5)]
    assert [d.error for d in decisions] == [503, 503, None, None, None]
    assert state.decide("reset").error is None  # not a faulted route: not counted either


def test_slow_reset_makes_one_workers_resets_slow() -> None:
    from genmanip_testbed.faults import FaultState

    spec = parse_fault_spec("slow_reset=3@2s|4@500ms")
    assert spec.slow_reset == (("3", 2.0), ("4", 0.5)) and spec.active
    state = FaultState(spec)
    assert state.reset_delay("3", 0.03) == 2.0
    assert state.reset_delay("4", 0.03) == 0.5
    assert state.reset_delay("0", 0.03) == 0.03
    with pytest.raises(FaultSpecError, match="slow_reset"):
        parse_fault_spec("slow_reset=3")
    assert FaultSpec.coerce({"slow_reset": [("1", 1.5)]}).slow_reset == (("1", 1.5),)
