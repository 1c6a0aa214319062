"""The trained pool's control state: its holds (each with a deadline), its update lock and its
weight-update groups.

A hold keeps new requests for the pool in its admission queue. Its reasons:
- `sync`: a weight update sent straight to the gateway runs (weight_sync.py);
- `paused`: the trainer's `/pause_generation`, until `/continue_generation`;
- `released`: the trainer's `/release_memory_occupation`, until the resume (or a continue);
- `leader` (mirror.MIRROR_HOLD): another process's copy of the leader's holds (leader.py).

Every hold expires `control.hold_deadline_s` after it was taken: the pool is then released
(for `paused` and `released`, the matching resume call goes to the endpoints first, so the
admitted requests do not wait on paused or emptied workers), with an error log and
`maskgate_control_hold_expired_total{reason}`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from maskgate.gateway.pools.pool import Pool

LOG = logging.getLogger("maskgate.control")
TRAINER_HOLDS = frozenset({"paused", "released"})  # taken and lifted by the trainer's calls


@dataclass(eq=False)
class PoolControl:
    """The control-plane state of the trained pool."""

    pool: Pool
    deadline_s: float = 3600.0  # control.hold_deadline_s
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one state change at a time
    holds: set[str] = field(default_factory=set)
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> urls by rank
    # Several gateway processes (leader.py): publishes this state to every other process and
    # waits until each has applied it. None in a single-process gateway.
    barrier: Callable[[], Awaitable[None]] | None = None
    # The resume call an expired trainer hold sends to the endpoints (control.py), and what
    # counts an expiry (the metric); None in a bare PoolControl.
    release: Callable[[str], Awaitable[None]] | None = None
    on_expired: Callable[[str], None] | None = None
    _timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def paused(self) -> bool:
        return "paused" in self.holds

    def hold(self, reason: str) -> None:
        """Hold the pool for `reason`; taking a hold again restarts its deadline."""
        self.holds.add(reason)
        self.pool.admission.hold()
        old = self._timers.pop(reason, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[reason] = loop.call_later(self.deadline_s, self._expire, reason)

    def unhold(self, reason: str) -> None:
        self.holds.discard(reason)
        timer = self._timers.pop(reason, None)
        if timer is not None:
            timer.cancel()
        if not self.holds:
            self.pool.admission.resume()

    def unhold_all(self) -> list[str]:
        """Lift every hold (`/continue_generation`); the reasons that were held."""
        held = sorted(self.holds)
        for reason in held:
            self.unhold(reason)
        return held

    async def shared(self) -> None:
        """Return once every gateway process routes by the state as it is now."""
        if self.barrier is not None:
            await self.barrier()

    def _expire(self, reason: str) -> None:
        self._timers.pop(reason, None)
        if reason not in self.holds:
            return
        LOG.error(
            "the %s hold on pool %s passed its deadline (control.hold_deadline_s = %g s); "
            "releasing the pool",
            reason,
            self.pool.name,
            self.deadline_s,
            extra={"pool": self.pool.name, "reason": reason},
        )
        if self.on_expired is not None:
            self.on_expired(reason)
        task = asyncio.get_running_loop().create_task(self._release(reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, reason: str) -> None:
        try:
            if reason in TRAINER_HOLDS and self.release is not None:
                await self.release(reason)
        except Exception:  # the pool is released whatever the endpoints answered
            LOG.exception("resuming the endpoints after an expired %s hold failed", reason)
        finally:
            if reason in self.holds:
                self.unhold(reason)
            await self.shared()
