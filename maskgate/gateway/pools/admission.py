"""Per-pool admission (rule 10): a concurrency limit plus a bounded FIFO queue with a timeout.

A permit is taken before the first upstream attempt and released when the response body has
ended (or the request failed), so a long stream holds its permit for its whole life.
Released permits are handed straight to the oldest waiter, which keeps the order FIFO and
means a newcomer can never overtake the queue.

`hold()` closes the door for a while (a weight sync of the trained pool): every new request
queues, bounded and timed as usual, however many permits are free; `resume()` admits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

from maskgate.protocol.errors import PolicyError


class Admission:
    __slots__ = ("_waiters", "active", "held", "limit", "max_queue", "on_held", "timeout_s")

    def __init__(self, limit: int, max_queue: int, timeout_s: float) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.active = 0  # permits held
        self.held = False  # hold(): no request is admitted until resume()
        self.on_held: Callable[[], object] | None = None  # called per request queued by a hold
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def depth(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> float:
        """Take a permit; returns the seconds spent queued (0.0 on the fast path).

        Raises PolicyError 429 `pool_overloaded` when the queue is full and 503
        `queue_timeout` when no permit came within `timeout_s`.
        """
        if self.active < self.limit and not self._waiters and not self.held:
            self.active += 1
            return 0.0
        if len(self._waiters) >= self.max_queue:
            raise PolicyError(
                "pool_overloaded",
                f"the pool is at its limit of {self.limit} concurrent requests and its queue "
                f"of {self.max_queue} is full; retry later",
                status=429,
                error_type="rate_limit_error",
                headers={"Retry-After": "1"},
            )
        if self.held and self.on_held is not None:
            self.on_held()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)
        start = time.perf_counter()
        timer = loop.call_later(self.timeout_s, self._expire, fut)
        try:
            await fut
        except asyncio.CancelledError:
            # The caller went away. If a permit was handed over just before, pass it on.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()
            else:
                self._discard(fut)
            raise
        finally:
            timer.cancel()
        return time.perf_counter() - start

    def release(self) -> None:
        if self.held:  # the permit goes back; waiters are admitted by resume()
            self.active -= 1
            assert self.active >= 0, "admission permit released twice"
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the permit moves to this waiter; `active` is unchanged
                return
        self.active -= 1
        assert self.active >= 0, "admission permit released twice"

    def hold(self) -> None:
        self.held = True

    def resume(self) -> None:
        """End a hold: admit the oldest waiters up to the limit."""
        self.held = False
        while self._waiters and self.active < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.active += 1
                fut.set_result(None)

    def _expire(self, fut: asyncio.Future[None]) -> None:
        if fut.done():
            return
        self._discard(fut)
        fut.set_exception(
            PolicyError(
                "queue_timeout",
                f"no capacity in the pool within {self.timeout_s:g} s; retry later",
                status=503,
                error_type="server_error",
                headers={"Retry-After": "1"},
            )
        )

    def _discard(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)
