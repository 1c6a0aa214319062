"""Circuit breaker transitions, on a clock the test controls."""

from __future__ import annotations

from maskgate.gateway.pools.circuit import CircuitBreaker, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_only():
    cb = CircuitBreaker(3, 10.0, Clock())
    cb.record_failure()
    cb.record_failure()
    cb.record_success()  # resets the run
    cb.record_failure()
    cb.record_failure()
    assert cb.state is CircuitState.CLOSED and cb.available()
    cb.record_failure()
    assert cb.state is CircuitState.OPEN and not cb.available()


def test_half_open_lets_exactly_one_probe_through():
    clock = Clock()
    cb = CircuitBreaker(1, 10.0, clock)
    cb.record_failure()
    clock.now += 9.9
    assert not cb.available() and cb.reading() == 2.0
    clock.now += 0.2
    assert cb.available() and cb.reading() == 1.0
    cb.acquire()
    assert cb.state is CircuitState.HALF_OPEN and not cb.available()  # probe in flight
    cb.record_failure()  # the probe failed: open again, for a fresh period
    assert cb.state is CircuitState.OPEN and not cb.available()
    clock.now += 10.0
    cb.acquire()
    cb.record_success()
    assert cb.state is CircuitState.CLOSED and cb.available()


def test_backpressure_is_neutral():
    clock = Clock()
    cb = CircuitBreaker(2, 1.0, clock)
    cb.record_failure()
    cb.record_neutral()
    cb.record_neutral()
    assert cb.state is CircuitState.CLOSED
    cb.record_failure()
    assert cb.state is CircuitState.OPEN
    clock.now += 1.0
    cb.acquire()
    cb.record_neutral()  # a 503 probe frees the slot without deciding anything
    assert cb.state is CircuitState.HALF_OPEN and cb.available()


def test_a_probe_without_verdict_frees_the_slot():
    clock = Clock()
    cb = CircuitBreaker(1, 1.0, clock)
    assert cb.acquire() is False  # closed: no probe involved
    cb.record_failure()
    clock.now += 1.0
    assert cb.acquire() is True and not cb.available()
    cb.release_probe()
    assert cb.available() and cb.state is CircuitState.HALF_OPEN
