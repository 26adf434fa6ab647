"""Backoff delays, jitter bounds, deadlines and retry_call semantics (deterministic: fake clock)."""

from __future__ import annotations

import random

import pytest
from genmanip_runtime.errors import ConnectError, HTTPStatusError
from genmanip_runtime.retry import Backoff, retry_call


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.now += s


def test_backoff_without_jitter_is_exponential_and_capped() -> None:
    b = Backoff(initial=0.2, factor=2.0, max_delay=1.0, jitter=0.0, max_attempts=6)
    assert list(b) == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_jitter_is_bounded_and_deterministic_with_rng() -> None:
    a = list(Backoff(jitter=0.2, max_attempts=8, rng=random.Random(7)))
    b = list(Backoff(jitter=0.2, max_attempts=8, rng=random.Random(7)))
    assert a == b
    nominal = [min(5.0, 0.2 * 2**n) for n in range(8)]
    for d, n in zip(a, nominal, strict=True):
        assert n * 0.8 - 1e-9 <= d <= min(5.0, n * 1.2) + 1e-9
    assert len(set(a)) == len(a)  # the jitter really varies the delays


def test_deadline_truncates_the_last_delay_and_stops() -> None:
    clock = FakeClock()
    b = Backoff(initial=1.0, factor=2.0, max_delay=10, jitter=0, deadline=5.0, clock=clock)
    delays = []
    for d in b:
        delays.append(d)
        clock.sleep(d)
    assert delays == pytest.approx([1.0, 2.0, 2.0])  # 1 + 2 + (4 cut to 2) = 5
    assert clock.now == pytest.approx(5.0)


def test_retry_call_retries_then_succeeds() -> None:
    clock = FakeClock()
    calls = []
    seen = []

    def fn() -> str:
        calls.append(clock.now)
        if len(calls) < 3:
            raise ConnectError("cannot connect", route="/docs")
        return "ok"

    out = retry_call(fn, retry_on=(ConnectError,), sleep=clock.sleep,
                     backoff=Backoff(jitter=0, clock=clock),
                     on_retry=lambda n, e, d: seen.append((n, type(e).__name__, d)))
    assert out == "ok"
    assert calls == pytest.approx([0.0, 0.2, 0.6])
    assert seen == [(1, "ConnectError", pytest.approx(0.2)), (2, "ConnectError", pytest.approx(0.4))]


def test_retry_call_raises_last_error_with_attempt_count_at_deadline() -> None:
    clock = FakeClock()
    n = 0

    def fn() -> None:
        nonlocal n
        n += 1
        clock.now += 0.5  # each call costs time too
        raise ConnectError(f"attempt {n} failed")

    with pytest.raises(ConnectError) as ei:
        retry_call(fn, retry_on=ConnectError, sleep=clock.sleep,
                   backoff=Backoff(initial=1, jitter=0, deadline=3.0, clock=clock))
    # t=0.5 fail, sleep 1 -> 1.5; fail at 2.0, sleep 1 (2 cut to the 1 s left) -> 3.0; fail, stop.
    assert n == 3
    assert ei.value.attempts == 3  # type: ignore[attr-defined]
    assert str(ei.value) == "attempt 3 failed (gave up after 3 attempts)"


def test_retry_call_predicate_and_non_retryable_errors_propagate() -> None:
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1
        raise HTTPStatusError("HTTP 400", status=400)

    def only_5xx(e: BaseException) -> bool:
        return isinstance(e, HTTPStatusError) and e.status >= 500

    with pytest.raises(HTTPStatusError):
        retry_call(fn, retry_on=only_5xx, sleep=lambda s: None)
    assert calls == 1


def test_plain_exception_gets_a_note_and_max_attempts() -> None:
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1
        raise OSError("boom")

    with pytest.raises(OSError) as ei:
        retry_call(fn, retry_on=OSError, sleep=lambda s: None,
                   backoff=Backoff(max_attempts=2, rng=random.Random(0)))
    assert calls == 3
    assert ei.value.attempts == 3  # type: ignore[attr-defined]
    notes = getattr(ei.value, "__notes__", None)
    if notes is not None:
        assert notes == ["gave up after 3 attempts"]


def test_invalid_backoff_arguments() -> None:
    for kwargs in ({"factor": 0.5}, {"jitter": 1.5}, {"initial": -1}, {"deadline": -1}):
        with pytest.raises(ValueError):
            Backoff(**kwargs)
