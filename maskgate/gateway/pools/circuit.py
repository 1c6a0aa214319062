"""A per-endpoint circuit breaker: closed -> open -> half-open -> closed.

Closed: every request may go. After `failure_threshold` consecutive failures the circuit
opens and the endpoint is skipped for `open_s` seconds. Then it is half-open: exactly one
probe request may go; its success closes the circuit, its failure opens it again.

Only endpoint faults count as failures (connect errors, timeouts, 5xx other than 503).
4xx answers prove the endpoint works (success); 429 and 503 are backpressure and count as
neither, so a busy but healthy server is never cut off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum


class CircuitState(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    __slots__ = ("_clock", "_failures", "_opened_at", "_probe_out", "open_s", "state", "threshold")

    def __init__(
        self, threshold: int, open_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = threshold
        self.open_s = open_s
        self.state = CircuitState.CLOSED
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._probe_out = False

    def available(self) -> bool:
        """May a request be sent now? Does not reserve the half-open probe (see `acquire`)."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            return self._clock() - self._opened_at >= self.open_s
        return not self._probe_out

    def acquire(self) -> bool:
        """Called when a request is sent to the endpoint. True when that request took the
        half-open probe slot; it must then end in a record_* call or `release_probe`."""
        if self.state is CircuitState.CLOSED:
            return False
        if self.state is CircuitState.OPEN and self._clock() - self._opened_at >= self.open_s:
            self.state = CircuitState.HALF_OPEN
        if self.state is CircuitState.HALF_OPEN:
            self._probe_out = True
            return True
        return False

    def release_probe(self) -> None:
        """The probe ended without a verdict (the client left): let the next one through."""
        if self.state is CircuitState.HALF_OPEN:
            self._probe_out = False

    def record_success(self) -> None:
        self._failures = 0
        self._probe_out = False
        self.state = CircuitState.CLOSED

    def record_failure(self) -> None:
        self._failures += 1
        self._probe_out = False
        if self.state is CircuitState.HALF_OPEN or self._failures >= self.threshold:
            self.state = CircuitState.OPEN
            self._opened_at = self._clock()

    def record_neutral(self) -> None:
        """A backpressure answer (429/503): frees the probe slot, changes nothing else."""
        self._probe_out = False

    def reading(self) -> float:
        """The gauge value, with an elapsed open period shown as half-open."""
        if self.state is CircuitState.OPEN and self._clock() - self._opened_at >= self.open_s:
            return float(CircuitState.HALF_OPEN)
        return float(self.state)
