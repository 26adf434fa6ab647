"""Retry policy shared by every gmp client: exponential backoff with jitter and a deadline.

One implementation so that every retry in gmp behaves the same way and honours the same
deadline semantics: a retry is never started when its delay would end past the deadline, and the
last error is raised (annotated with the number of attempts) instead of a generic "gave up".
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from .errors import RequestAborted

__all__ = ["Backoff", "RetryPredicate", "retry_call"]

T = TypeVar("T")

#: ``retry_on`` of :func:`retry_call`: exception types, or a predicate on the exception.
RetryPredicate = (
    tuple[type[BaseException], ...] | type[BaseException] | Callable[[BaseException], bool]
)


class Backoff:
    """Exponential backoff delays: ``initial * factor**n`` capped at ``max_delay``, with jitter.

    Iterating yields delays in seconds. ``jitter`` is a fraction: each delay is drawn uniformly
    from ``[d * (1 - jitter), d * (1 + jitter)]`` (then capped at ``max_delay``), so that many
    clients retrying together spread out. ``deadline`` (seconds from the first call to
    :meth:`__iter__` or :meth:`start`) ends the iteration before a delay that would overrun
    it; the last delay is shortened to end exactly at the deadline. ``max_attempts`` bounds the
    number of delays (retries), ``None`` means unbounded (then a deadline is advisable).
    ``rng`` makes the jitter deterministic (tests); ``clock`` is a monotonic clock in seconds.
    """

    def __init__(
        self,
        initial: float = 0.2,
        factor: float = 2.0,
        max_delay: float = 5.0,
        jitter: float = 0.2,
        deadline: float | None = None,
        *,
        max_attempts: int | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if initial < 0 or max_delay < 0:
            raise ValueError("initial and max_delay must be >= 0")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter is a fraction in [0, 1], got {jitter}")
        if deadline is not None and deadline < 0:
            raise ValueError(f"deadline must be >= 0 seconds, got {deadline}")
        if max_attempts is not None and max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, got {max_attempts}")
        self.initial = initial
        self.factor = factor
        self.max_delay = max_delay
        self.jitter = jitter
        self.deadline = deadline
        self.max_attempts = max_attempts
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._clock = clock
        self._t0: float | None = None

    def start(self) -> None:
        """Start (or restart) the deadline clock now."""
        self._t0 = self._clock()

    def remaining(self) -> float | None:
        """Seconds left until the deadline (never negative), or None without a deadline."""
        if self.deadline is None:
            return None
        if self._t0 is None:
            return self.deadline
        return max(0.0, self.deadline - (self._clock() - self._t0))

    def delay(self, n: int) -> float:
        """The jittered delay before retry number ``n`` (0-based), ignoring the deadline."""
        base = min(self.max_delay, self.initial * self.factor**n)
        if self.jitter:
            base *= 1.0 + self._rng.uniform(-self.jitter, self.jitter)
        return max(0.0, min(self.max_delay, base))

    def __iter__(self) -> Iterator[float]:
        if self._t0 is None:
            self.start()
        n = 0
        while self.max_attempts is None or n < self.max_attempts:
            d = self.delay(n)
            left = self.remaining()
            if left is not None:
                if left <= 0:
                    return
                d = min(d, left)
            yield d
            n += 1


def _matches(exc: BaseException, retry_on: RetryPredicate) -> bool:
    if isinstance(retry_on, type):
        return isinstance(exc, retry_on)
    if isinstance(retry_on, tuple):
        return isinstance(exc, retry_on)
    return bool(retry_on(exc))


def retry_call(
    fn: Callable[[], T],
    *,
    retry_on: RetryPredicate,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    interrupt: threading.Event | None = None,
) -> T:
    """Call ``fn()`` until it returns, retrying errors accepted by ``retry_on``.

    ``on_retry(attempt, error, delay)`` is called before each sleep (``attempt`` is the 1-based
    number of the failed attempt). When the backoff is exhausted (deadline or ``max_attempts``)
    the last error is raised with ``error.attempts`` set and the count in its message
    (``GenmanipError``: ``"... (gave up after N attempts)"``; other exceptions: a note). Errors not accepted by ``retry_on``, and errors whose ``retryable`` is
    False (:attr:`~genmanip_runtime.errors.TransportError.retryable`), propagate at once.

    ``interrupt``: once this event is set (from any thread) no further attempt starts and a
    wait between attempts ends at once: :class:`~genmanip_runtime.errors.RequestAborted` is raised
    (chained to the last error). The waits then go through ``interrupt.wait`` instead of ``sleep``.
    A ``RequestAborted`` raised by ``fn`` is never retried.
    """
    policy = backoff if backoff is not None else Backoff(max_attempts=3)
    delays = iter(policy)
    attempt = 0
    while True:
        attempt += 1
        if interrupt is not None and interrupt.is_set():
            raise RequestAborted("interrupted before an attempt")
        try:
            return fn()
        except BaseException as exc:
            # An error that knows trying again cannot help (TransportError.retryable) is final.
            final = getattr(exc, "retryable", True) is False
            if final or isinstance(exc, RequestAborted) or not _matches(exc, retry_on):
                raise
            delay = next(delays, None)
            if delay is None:
                _annotate(exc, attempt)
                raise
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            if interrupt is None:
                sleep(delay)
            elif interrupt.wait(delay):
                raise RequestAborted(f"interrupted while waiting to retry ({exc})") from exc


def _annotate(exc: BaseException, attempts: int) -> None:
    try:
        exc.attempts = attempts  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass
    if attempts < 2:
        return
    note = f"gave up after {attempts} attempts"
    message = getattr(exc, "message", None)
    if isinstance(message, str):
        # GenmanipError prints .message (the CLI shows it), so the count goes there.
        exc.message = f"{message} ({note})"  # type: ignore[attr-defined]
    elif hasattr(exc, "add_note"):
        exc.add_note(note)
