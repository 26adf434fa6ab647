"""The dynamic batcher: order, full batches, waiting only for due participants, errors, closing."""

from __future__ import annotations

import threading
import time
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
    outs: dict[str, list[int]] = {"a": [], "b": []}

    def lane(key: str) -> None:
        b.attach(key)
        for i in range(12):
            outs[key].append(b(i, key).batch_size)
        b.detach(key)

    threads = [threading.Thread(target=lane, args=(k,)) for k in outs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # Once each has a history, the batcher waits for the other: pairs (until one of them
        # is done and leaves, at the very end).
        assert outs["a"][4:10] == [2] * 6 and outs["b"][4:10] == [2] * 6, outs
    finally:
        b.close()


def test_a_participant_that_stays_away_is_not_waited_for() -> None:
    log: list[list[Any]] = []
    b: Batcher[Any] = Batcher(_doubling(log), max_batch=8, max_wait_s=30.0, slack_s=0.2)
    b.attach("fast")
    b.attach("slow")
    try:
        for i in range(3):  # both get a history of short absences
            fs = [b.submit(i, "fast"), b.submit(i, "slow")]
            for f in fs:
                f.result(10)
        # "slow" is now away (a long reset): "fast" waits for it at most its due window once,
        # then not at all.
        t0 = time.monotonic()
        for i in range(20):
            b(i, "fast")
        assert time.monotonic() - t0 < 10.0
        assert [len(x) for x in log[-20:]] == [1] * 20
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
