"""The dynamic batcher: order, full batches, waiting only for due participants, errors, closing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from genmanip_eval.batcher import Batcher, BatcherClosed


def _doubling(log: list[list[Any]], cost_s: float = 0.0) -> Any:
    def call(items: list[Any]) -> list[Any]:
        log.append(list(items))
        if cost_s:
            time.sleep(cost_s)
        return [i * 2 for i in items]

    return call


def test_results_come_back_in_order_and_a_full_batch_goes_at_once() -> None:
    log: list[list[Any]] = []
    gate = threading.Event()

    def call(items: list[Any]) -> list[Any]:
        gate.wait(10)  # the first call holds the policy while the others queue up
        return _doubling(log)(items)

    b: Batcher[Any] = Batcher(call, max_batch=3, max_wait_s=30.0)
    try:
        first = b.submit(0)
        time.sleep(0.05)
        futs = [b.submit(i) for i in range(1, 7)]
        gate.set()
        assert first.result(10).value == 0
        assert [f.result(10).value for f in futs] == [2, 4, 6, 8, 10, 12]
        # never waits 30 s: three queued make a full batch
        assert log[1:] == [[1, 2, 3], [4, 5, 6]] and all(f.result().batch_size == 3 for f in futs)
        st = b.snapshot()
        assert st.batches == 3 and st.items == 7 and st.sizes[3] == 2
    finally:
        b.close()


def test_a_lone_participant_never_waits() -> None:
    log: list[list[Any]] = []
    b: Batcher[Any] = Batcher(_doubling(log), max_batch=8, max_wait_s=30.0)
    b.attach("a")
    try:
        for i in range(5):
            assert b(i, "a").value == 2 * i  # (a 30 s wait would time the test out)
        assert log == [[i] for i in range(5)]
    finally:
        b.close()


def test_participants_that_step_at_the_same_pace_share_batches() -> None:
    log: list[list[Any]] = []
    b: Batcher[Any] = Batcher(_doubling(log, 0.01), max_batch=8, max_wait_s=30.0, slack_s=2.0)
    try:
        outs = _lanes(b, ["a", "b"], 12, 0.0)
        # Once each has a history, the batcher waits for the other: pairs (until one of them
        # is done and leaves, at the very end).
        assert outs["a"][4:10] == [2] * 6 and outs["b"][4:10] == [2] * 6, outs
    finally:
        b.close()


def _history(b: Batcher[Any], *keys: str, rounds: int = 3) -> None:
    """Every key submits together ``rounds`` times: each gets a history of short absences."""
    for i in range(rounds):
        for f in [b.submit(i, k) for k in keys]:
            f.result(10)


def test_a_participant_that_stays_away_is_not_waited_for() -> None:
    log: list[list[Any]] = []
    b: Batcher[Any] = Batcher(_doubling(log), max_batch=8, max_wait_s=30.0, slack_s=0.2)
    b.attach("fast")
    b.attach("slow")
    try:
        _history(b, "fast", "slow")  # both get a history of short absences
        # "slow" is now away (a long reset): "fast" waits for it at most its due window once,
        # then not at all.
        t0 = time.monotonic()
        for i in range(20):
            b(i, "fast")
        assert time.monotonic() - t0 < 10.0
        assert [len(x) for x in log[-20:]] == [1] * 20
    finally:
        b.close()


def test_a_participant_that_says_it_is_away_is_not_waited_for_at_all() -> None:
    """A lane whose episode ended says so (``away``): its group's next batch goes at once, not
    after its due window (3 s here), and its reset does not count as a usual absence."""
    log: list[list[Any]] = []
    b: Batcher[Any] = Batcher(_doubling(log), max_batch=8, max_wait_s=30.0, slack_s=3.0)
    b.attach("stays")
    b.attach("resets")
    try:
        _history(b, "stays", "resets")  # both get a history of short absences
        b.away("resets")
        t0 = time.monotonic()
        assert b(7, "stays").value == 14
        assert time.monotonic() - t0 < 1.0  # (its due window is 3 s)
        time.sleep(0.2)
        assert b(8, "resets").value == 16
        assert log[-2:] == [[7], [8]]
        history = list(b._members["resets"].absences)  # (white box: the usual absence kept)
        assert len(history) == 2 and max(history) < 0.2, history
    finally:
        b.close()


def test_a_failing_call_fails_its_batch_and_the_batcher_goes_on() -> None:
    calls = 0

    def call(items: list[Any]) -> list[Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return items

    b: Batcher[Any] = Batcher(call, max_batch=4, max_wait_s=0.0)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            b(1)
        assert b(2).value == 2
    finally:
        b.close()


def test_close_fails_what_is_waiting() -> None:
    gate = threading.Event()

    def call(items: list[Any]) -> list[Any]:
        gate.wait(10)
        return items

    b: Batcher[Any] = Batcher(call, max_batch=1, max_wait_s=0.0)
    running = b.submit(1)
    time.sleep(0.05)
    waiting = b.submit(2)
    b.close(timeout=0.1)
    gate.set()
    with pytest.raises(BatcherClosed):
        waiting.result(10)
    assert running.result(10).value == 1
    with pytest.raises(BatcherClosed):
        b.submit(3)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(lambda items: items, max_batch=0)
    with pytest.raises(ValueError, match="max_wait_s"):
        Batcher(lambda items: items, max_wait_s=-1)


def test_batch_stats_of_two_processes_merge_with_weighted_means() -> None:
    from genmanip_eval.batcher import merge_batch_stats

    a = {"batches": 2, "items": 6, "mean_batch": 3.0, "mean_queue_ms": 10.0, "mean_call_ms": 30.0,
         "sizes": {"2": 1, "4": 1}}
    b = {"batches": 1, "items": 2, "mean_batch": 2.0, "mean_queue_ms": 2.0, "mean_call_ms": 60.0,
         "sizes": {"2": 1}}
    m = merge_batch_stats(a, b)
    assert (m["batches"], m["items"], m["sizes"]) == (3, 8, {"2": 2, "4": 1})
    assert m["mean_batch"] == round(8 / 3, 3)
    assert m["mean_queue_ms"] == round((10.0 * 6 + 2.0 * 2) / 8, 3)
    assert m["mean_call_ms"] == round((30.0 * 2 + 60.0) / 3, 3)
    assert merge_batch_stats(None, b) == b


def _lanes(b: Batcher[Any], keys: Any, rounds: int, away_s: float | Callable[[str, int], float],
           ) -> dict[str, list[int]]:
    """A lane per key (an int n: keys "0".."n-1") that submits, gets its result and stays away
    ``away_s`` (its "step"; a callable of (key, round) for uneven ones): each lane's batch sizes."""
    names = [str(k) for k in range(keys)] if isinstance(keys, int) else list(keys)
    sizes: dict[str, list[int]] = {k: [] for k in names}

    def lane(key: str) -> None:
        b.attach(key)
        for i in range(rounds):
            sizes[key].append(b(i, key).batch_size)
            pause = away_s(key, i) if callable(away_s) else away_s
            if pause:
                time.sleep(pause)
        b.detach(key)

    threads = [threading.Thread(target=lane, args=(k,)) for k in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return sizes


def _gpu_like(items: list[Any]) -> list[Any]:
    time.sleep(0.02 + 0.005 * len(items))  # P(8) = 60 ms, P(4) = 40 ms
    return items


@pytest.mark.parametrize("pipeline", [True, False])
def test_workers_that_step_longer_than_a_full_call_run_as_two_groups(pipeline: bool) -> None:
    # S (80 ms away) >= P(8) (60 ms): two alternating groups of 4 serve a cycle in
    # max(S + P(4), 2 P(4)) = 120 ms instead of S + P(8) = 140 ms. Without pipelining: one group.
    b: Batcher[Any] = Batcher(_gpu_like, max_batch=8, max_wait_s=0.5, pipeline=pipeline)
    try:
        sizes = _lanes(b, 8, 30, 0.08)
        late = [s for per in sizes.values() for s in per[15:25]]
        st = b.snapshot()
        mean = sum(late) / len(late)
        # (a loaded machine stretches every sleep, and batches fray by one or two; the split
        # itself does not depend on that: S / P(8) only grows)
        if pipeline:
            assert st.grouped_batches > st.batches / 2 and mean <= 5.0, sizes
            assert st.as_dict()["grouped_batches"] == st.grouped_batches
        else:
            assert st.grouped_batches == 0 and mean >= 6.0, sizes
    finally:
        b.close()


def test_workers_that_step_quickly_stay_one_group() -> None:
    # S (~0: each comes straight back) < P(8) (60 ms): splitting would leave the workers
    # waiting for the policy.
    b: Batcher[Any] = Batcher(_gpu_like, max_batch=8, max_wait_s=0.5)
    try:
        sizes = _lanes(b, 8, 20, 0.0)
        late = [s for per in sizes.values() for s in per[8:16]]
        assert b.snapshot().grouped_batches == 0 and sum(late) / len(late) >= 6.0, sizes
    finally:
        b.close()


def test_cheap_calls_do_not_wait_for_stragglers() -> None:
    # A call that costs nothing saves nothing by sharing: a due participant is not waited for
    # (waiting would lock the lanes in phase: their requests would reach the server together).
    b: Batcher[Any] = Batcher(lambda items: items, max_batch=8, max_wait_s=30.0, slack_s=30.0)
    b.attach("a")
    b.attach("b")
    try:
        for i in range(4):  # both get a history, and the batcher times a few (free) calls
            fs = [b.submit(i, "a"), b.submit(i, "b")]
            for f in fs:
                f.result(10)
        # "b" is due for 30 s (its slack): an expensive policy would wait for it; this one not
        t0 = time.monotonic()
        assert b(9, "a").value == 9
        assert time.monotonic() - t0 < 5.0
    finally:
        b.close()


def test_a_worker_back_from_a_long_reset_joins_a_group() -> None:
    # Two groups of 4 (S 80 ms >= P(8) 60 ms). Lane "0" stays away 1.5 s (a slow reset): its
    # group goes on without it (batches of 3, not waiting for it), and once back it joins the
    # group with fewer active members instead of running alone (a call of 1 every cycle would
    # cost the policy as much as a third group).
    b: Batcher[Any] = Batcher(_gpu_like, max_batch=8, max_wait_s=0.5)
    try:
        sizes = _lanes(b, 8, 40, lambda key, i: 1.5 if key == "0" and i == 15 else 0.08)
        back = sorted(sizes["0"][17:36])
        assert back[len(back) // 2] >= 3, sizes["0"]
        assert b.snapshot().grouped_batches > 0
    finally:
        b.close()


def test_participants_that_join_two_groups_are_spread_over_both() -> None:
    # Six lanes split into 3 + 3; two more join (new connections of a policy server): each goes
    # to the group with fewer active members, 4 + 4, not both into one (5 + 3).
    b: Batcher[Any] = Batcher(_gpu_like, max_batch=8, max_wait_s=0.5)
    sizes: dict[str, list[int]] = {str(k): [] for k in range(8)}
    split = threading.Event()

    def lane(key: str) -> None:
        if int(key) >= 6:
            split.wait(60)
        b.attach(key)
        for i in range(40 if int(key) < 6 else 25):
            sizes[key].append(b(i, key).batch_size)
            if b.groups == 2:
                split.set()
            time.sleep(0.08)
        b.detach(key)

    threads = [threading.Thread(target=lane, args=(k,)) for k in sizes]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert split.is_set()
        late = [s for k in ("6", "7") for s in sizes[k][5:20]]
        assert sum(1 for s in late if s >= 5) <= 0.2 * len(late), sizes
    finally:
        b.close()


def test_unbatched_calls_on_the_submitting_thread_and_reports_the_real_batches() -> None:
    from genmanip_eval.batcher import Unbatched

    threads: list[str] = []
    together = threading.Barrier(8, timeout=30)  # broken unless all 8 calls run at once

    def call(items: list[Any]) -> list[Any]:
        threads.append(threading.current_thread().name)
        together.wait()
        time.sleep(0.05)
        return [i * 2 for i in items]

    # every call was served (elsewhere) by a batch of 4
    u: Unbatched[Any] = Unbatched(call, batch_size_of=lambda key: 4)
    outs: list[Any] = []
    lanes = [threading.Thread(target=lambda k=k: outs.append(u(k, str(k))), name=f"lane-{k}")
             for k in range(8)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join(30)
    # concurrent (the barrier), each on its lane's thread
    assert not together.broken
    assert sorted(threads) == sorted(f"lane-{k}" for k in range(8))
    assert sorted(o.value for o in outs) == [0, 2, 4, 6, 8, 10, 12, 14]
    assert all(o.batch_size == 4 and o.queue_ms == 0.0 for o in outs)
    st = u.snapshot().as_dict()
    assert st["items"] == 8 and st["batches"] == 2 and st["mean_batch"] == 4.0
    assert st["mean_call_ms"] >= 50.0
    u.close()
    with pytest.raises(BatcherClosed):
        u(1, "0")
