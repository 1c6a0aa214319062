"""Admission: concurrency limit, bounded FIFO queue, timeout, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from maskgate.gateway.pools.admission import Admission
from maskgate.protocol.errors import PolicyError


async def test_fast_path_then_queue_full_is_429():
    adm = Admission(limit=2, max_queue=1, timeout_s=5)
    assert await adm.acquire() == 0.0
    assert await adm.acquire() == 0.0
    waiter = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0)
    assert adm.depth == 1
    with pytest.raises(PolicyError) as info:
        await adm.acquire()
    assert (info.value.status, info.value.code) == (429, "pool_overloaded")
    assert info.value.headers["Retry-After"] == "1"
    adm.release()  # the permit moves to the waiter
    assert await waiter >= 0.0
    assert (adm.active, adm.depth) == (2, 0)


async def test_queue_is_fifo():
    adm = Admission(limit=1, max_queue=10, timeout_s=5)
    await adm.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        await adm.acquire()
        order.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(5)]
    await asyncio.sleep(0)
    for _ in range(5):
        adm.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    adm.release()
    assert adm.active == 0


async def test_queue_timeout_is_503_and_frees_the_slot():
    adm = Admission(limit=1, max_queue=1, timeout_s=0.05)
    await adm.acquire()
    with pytest.raises(PolicyError) as info:
        await adm.acquire()
    assert (info.value.status, info.value.code) == (503, "queue_timeout")
    assert "Retry-After" in info.value.headers
    assert adm.depth == 0
    adm.release()
    assert adm.active == 0


async def test_cancelled_waiter_leaves_the_queue_and_never_leaks_a_permit():
    adm = Admission(limit=1, max_queue=5, timeout_s=5)
    await adm.acquire()
    gone = asyncio.create_task(adm.acquire())
    stays = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    assert adm.depth == 1
    adm.release()
    await stays
    adm.release()
    assert (adm.active, adm.depth) == (0, 0)


async def test_permit_handed_to_a_waiter_cancelled_at_that_moment_is_passed_on():
    adm = Admission(limit=1, max_queue=5, timeout_s=5)
    await adm.acquire()
    first = asyncio.create_task(adm.acquire())
    second = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0)
    adm.release()  # hands the permit to `first`...
    first.cancel()  # ...which is cancelled before it runs
    await asyncio.sleep(0)
    await second  # so the permit went on to `second`
    assert first.cancelled()
    adm.release()
    assert adm.active == 0
