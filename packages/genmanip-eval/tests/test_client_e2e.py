"""EvalClient against the real testbed over HTTP on 127.0.0.1: nothing dropped, in both wires."""

from __future__ import annotations

from typing import Any

import pytest
from genmanip_eval import EvalClient, ZeroPolicy
from genmanip_testbed import expert_policy

ZERO = ZeroPolicy()


def zero_for(obs: Any) -> dict[str, Any]:
    return ZERO.get_action(obs)


@pytest.mark.parametrize("codec", ["legacy", "msgpack"])
def test_single_step_job_nothing_dropped(smoke: Any, codec: str) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with EvalClient(smoke.url, ["0"], codec=codec, on_event=lambda n, p: events.append((n, p))) as c:
        entries = c.reset()
        assert c.codec_name == codec
        obs = entries["0"]["obs"]
        # reset() polled /reset_result: a real first observation, not the pending placeholder.
        assert obs["reset"] is True and obs["timestep"] == 0
        assert "reset_pending" not in obs and obs["video.left_camera_view"].shape == (480, 640, 3)
        assert smoke.stats.snapshot()["requests"].get("/reset_result", 0) >= 1
        sent = 0
        per_episode: dict[str, int] = {}
        firsts = 1
        pol = expert_policy()
        while True:
            obs = entries["0"]["obs"]
            if obs["reset"]:
                pol.reset()
            eid = obs["episode_id"]
            entries, done = c.step(pol.get_action(obs))
            sent += 1
            per_episode[eid] = per_episode.get(eid, 0) + 1
            assert entries["0"]["executed_steps"] == 1
            if done:
                break
            nxt = entries["0"]["obs"]
            if nxt["reset"]:
                firsts += 1
                assert nxt["timestep"] == 0 and entries["0"]["episode_result"]["episode_id"] == eid
            else:
                assert nxt["timestep"] == obs["timestep"] + 1 and nxt["episode_id"] == eid
        # One keep-alive connection for the whole job; the latency split uses the server header.
        assert c.http.connections_opened == 1
        t = c.timing("0")
        assert t.server_ms is not None and t.network_ms is not None and t.total_ms >= t.server_ms
    stats = smoke.stats.snapshot()
    # Every action sent was executed by the server, exactly once, in the episode it was meant for.
    assert stats["steps_by_worker"] == {"0": sent}
    assert stats["steps_by_episode"] == per_episode
    assert stats["resets_swallowed"] == 0
    assert firsts == 2 and len(c.episode_results) == 2
    assert [n for n, _ in events].count("episode_finished") == 2
    assert entries["0"]["obs"] is None and entries["0"]["metric"]
    assert c.stats["requests"]["/kill"] == 1  # killed its own ids before the first /reset


def test_step_without_settle_returns_at_the_episode_end(smoke: Any) -> None:
    """settle=False (the lanes): the step that ends an episode returns at once, the worker
    reset_pending and nothing polled; poll() then brings the next episode with the result."""
    with EvalClient(smoke.url, ["0"]) as c:
        entries = c.reset()
        pol = expert_policy()
        pol.reset()
        while True:
            obs = entries["0"]["obs"]
            eid = obs["episode_id"]
            before = smoke.stats.snapshot()["requests"].get("/reset_result", 0)
            entries, done = c.step(pol.get_action(obs), settle=False)
            assert entries["0"]["executed_steps"] == 1
            if entries["0"]["obs"] is None:
                break
            assert entries["0"]["obs"]["episode_id"] == eid
        assert not done and entries["0"]["reset_pending"] is True
        assert entries["0"]["episode_result"] is None
        assert smoke.stats.snapshot()["requests"].get("/reset_result", 0) == before
        entries = c.poll()
        nxt = entries["0"]["obs"]
        assert nxt["reset"] is True and nxt["episode_id"] != eid
        assert entries["0"]["episode_result"]["episode_id"] == eid
        assert entries["0"]["executed_steps"] == 0


@pytest.mark.parametrize("codec", ["legacy", "msgpack"])
def test_chunk_mode_keeps_t0_and_counts(smoke: Any, codec: str) -> None:
    with EvalClient(smoke.url, "0", codec=codec) as c:
        entries = c.reset()
        sent_exec = 0
        first_chunk = True
        while not c.done:
            obs = entries["0"]["obs"]
            chunk = [zero_for(obs)] * 4
            entries, _ = c.step(chunk)
            ex = entries["0"]["executed_steps"]
            if first_chunk:
                # The first chunk of the job runs whole: its t=0 observation was not swallowed.
                assert ex == 4
                first_chunk = False
            assert 1 <= ex <= 4
            assert entries["0"]["stopped_early"] == (ex < 4)
            sent_exec += ex
    stats = smoke.stats.snapshot()
    assert stats["steps_by_worker"] == {"0": sent_exec} == {"0": 12}  # 2 episodes x 6 steps
    assert stats["resets_swallowed"] == 0
    assert set(stats["chunk_paths"]) <= {"fast"}


@pytest.mark.parametrize(("codec", "chunk"), [("msgpack", False), ("legacy", True), ("msgpack", True)])
def test_four_workers(reach: Any, codec: str, chunk: bool) -> None:
    wids = ["0", "1", "2", "3"]
    executed = {w: 0 for w in wids}
    with EvalClient(reach.url, wids, codec=codec) as c:
        entries = c.reset()
        assert all(e["obs"]["reset"] if e["obs"] is not None else e["reset_pending"] for e in entries.values())
        while not c.done:
            acts: dict[str, Any] = {}
            for w in wids:
                obs = entries[w]["obs"]
                if obs is not None:
                    acts[w] = [zero_for(obs)] * 3 if chunk else zero_for(obs)
            entries, done = c.step(acts)
            for w in wids:
                executed[w] += entries[w]["executed_steps"]
        assert done and all(e["obs"] is None for e in entries.values())
    stats = reach.stats.snapshot()
    assert stats["steps_by_worker"] == {w: n for w, n in executed.items() if n}
    assert sum(executed.values()) == 8 * 5  # 8 episodes x 5 steps, nothing lost or collapsed
    assert len(c.episode_results) == 8
    assert all(v == 5 for v in stats["steps_by_episode"].values())
    if chunk:
        assert set(stats["chunk_paths"]) == {"fast"}


@pytest.mark.parametrize("chunk", [False, True])
def test_more_workers_than_seeds_no_deadlock(smoke: Any, chunk: bool) -> None:
    # 3 workers, 2 episodes: the third worker's reset waits until the others finish their
    # episodes. Blocking on it in reset()/step() would deadlock; the client must keep stepping
    # the others and resolve the third later (here: it finishes without an episode).
    wids = ["0", "1", "2"]
    with EvalClient(smoke.url, wids, codec="msgpack") as c:
        entries = c.reset()
        assert sum(e["obs"] is not None for e in entries.values()) >= 1
        n = 0
        while not c.done:
            acts = {w: ([zero_for(e["obs"])] * 2 if chunk else zero_for(e["obs"]))
                    for w, e in entries.items() if e["obs"] is not None}
            entries, _ = c.step(acts)
            n += 1
            assert n < 100
    stats = smoke.stats.snapshot()
    assert sum(stats["steps_by_worker"].values()) == 12 and len(c.episode_results) == 2


def test_time_major_chunk_and_ragged(reach: Any) -> None:
    with EvalClient(reach.url, ["0", "1"], codec="msgpack") as c:
        e = c.reset()
        a0, a1 = zero_for(e["0"]["obs"]), zero_for(e["1"]["obs"])
        e, _ = c.step([{"0": a0, "1": a1}, {"0": a0}])
        assert e["0"]["executed_steps"] == 2 and e["1"]["executed_steps"] == 1
        assert e["0"]["obs"]["timestep"] == 2 and e["1"]["obs"]["timestep"] == 1


def test_step_before_reset_and_closed(smoke: Any) -> None:
    from genmanip_eval import GenmanipEvalError

    c = EvalClient(smoke.url)
    with pytest.raises(GenmanipEvalError, match="reset"):
        c.step({"control_type": "joint_position", "action": [0.0] * 16})
    c.close()
    with pytest.raises(GenmanipEvalError, match="closed"):
        c.reset()


def test_auto_codec_picks_msgpack_and_frames(smoke: Any) -> None:
    with EvalClient(smoke.url) as c:
        e = c.reset()
        assert c.codec_name == "msgpack" and c.frames == "raw"  # loopback: raw frames
        assert c.server_info is not None and "msgpack" in c.server_info["codecs"]
        assert not e["0"]["obs"].is_encoded("video.left_camera_view")
    for codec in ("auto", "msgpack"):  # also when the codec is forced (no /protocol call)
        with EvalClient(smoke.url, frames="jpeg", codec=codec) as c:
            e = c.reset()
            assert c.frames == "jpeg" and e["0"]["obs"].is_encoded("video.left_camera_view")
            e, _ = c.step(zero_for(e["0"]["obs"]))
            obs = e["0"]["obs"]
            assert obs.is_encoded("video.left_camera_view")  # recorded as received, never decoded
            assert obs.frame_bytes("video.left_camera_view")[:2] == b"\xff\xd8"


def test_legacy_only_server_uses_pickle(tmp_path: Any) -> None:
    from genmanip_testbed import serve_testbed

    with serve_testbed(tasks=("testbed/smoke",), num_steps=3, wire="legacy", results_root=tmp_path) as tb:
        with EvalClient(tb.url) as c:
            e = c.reset()
            assert c.codec_name == "legacy" and e["0"]["obs"]["timestep"] == 0
            e, _ = c.step(zero_for(e["0"]["obs"]))
            assert e["0"]["obs"]["timestep"] == 1


def test_old_float_metrics_and_context_manager(smoke: Any) -> None:
    with EvalClient(smoke.url, ["0"]) as c:
        e = c.reset()
        while not c.done:
            e, _ = c.step(zero_for(e["0"]["obs"]))
        metric = c.metrics
        assert all(isinstance(v, dict) and "score" in v for v in metric.values())


@pytest.mark.slow
def test_survives_idle_keepalive_close(smoke: Any) -> None:
    # uvicorn closes keep-alive connections idle for 5 s; a policy that thinks longer than that
    # must not break the run (the transport reconnects before sending).
    import time

    with EvalClient(smoke.url, ["0"]) as c:
        e = c.reset()
        e, _ = c.step(zero_for(e["0"]["obs"]))
        time.sleep(6.0)
        e, _ = c.step(zero_for(e["0"]["obs"]))
        assert e["0"]["executed_steps"] == 1 and e["0"]["obs"]["timestep"] == 2
        assert c.http.connections_opened == 2
    assert smoke.stats.snapshot()["steps_by_worker"] == {"0": 2}


def test_python_api_recording(smoke: Any, tmp_path: Any) -> None:
    import json

    root = tmp_path / "res"
    with EvalClient(smoke.url, ["0"], record=True, results_dir=str(root)) as c:
        e = c.reset()
        while not c.done:
            e, _ = c.step(zero_for(e["0"]["obs"]))
    results = sorted(root.rglob("result.json"))
    assert len(results) == 2
    run = json.loads((results[0].parents[4] / "run.json").read_text())
    assert run["server_url"] == smoke.url and run["finished"] and run["workers"] == ["0"]
