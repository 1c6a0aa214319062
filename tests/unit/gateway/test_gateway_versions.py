"""Weight versions: their order, request values, a pool's version; admission holds."""

from __future__ import annotations

import asyncio

import pytest

from maskgate.gateway.pools.admission import Admission
from maskgate.gateway.pools.versions import MIXED, at_least, normalize, pool_version


@pytest.mark.parametrize(
    ("have", "want", "ok"),
    [
        ("3", "3", True),
        ("10", "9", True),  # numbers compare as numbers, not as strings
        ("9", "10", False),
        ("007", "7", True),
        ("v2", "v2", True),
        ("v3", "v2", False),  # no order between free-form strings: only the same one
        ("3", "v2", False),
        ("default", "1", False),
        (None, "1", False),
        ("-1", "-1", True),
        ("-2", "-1", False),  # not a non-negative integer: exact match only
    ],
)
def test_at_least(have, want, ok):
    assert at_least(have, want) is ok


def test_normalize_takes_strings_and_non_negative_ints():
    assert normalize("step-4") == "step-4"
    assert normalize(4) == "4"
    for bad in (True, -1, 1.5, "", "a\nb", ["1"], {"v": 1}, None, "x" * 300):
        assert normalize(bad) is None


def test_pool_version():
    assert pool_version([]) is None
    assert pool_version(["2", "2"]) == "2"
    assert pool_version(["2", "3"]) == MIXED
    assert pool_version(["2", None]) == MIXED


async def test_hold_queues_every_request_until_resume():
    adm = Admission(limit=4, max_queue=2, timeout_s=5)
    held: list[int] = []
    adm.on_held = lambda: held.append(1)
    assert await adm.acquire() == 0.0
    adm.hold()
    waiters = [asyncio.create_task(adm.acquire()) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert (adm.active, adm.depth, len(held)) == (1, 2, 2)
    adm.release()  # a permit released during a hold goes back, not to a waiter
    assert (adm.active, adm.depth) == (0, 2)
    adm.resume()
    await asyncio.gather(*waiters)
    assert (adm.active, adm.depth) == (2, 0)
    assert await adm.acquire() == 0.0  # the fast path again


async def test_resume_admits_only_up_to_the_limit():
    adm = Admission(limit=1, max_queue=5, timeout_s=5)
    adm.hold()
    waiters = [asyncio.create_task(adm.acquire()) for _ in range(3)]
    await asyncio.sleep(0.01)
    adm.resume()
    await asyncio.sleep(0.01)
    assert sum(w.done() for w in waiters) == 1
    adm.release()
    adm.release()
    await asyncio.gather(*waiters)
    assert adm.active == 1
