"""The fake upstream's own knobs that no gateway test reaches: per-route answers, the fault
knobs on every engine, probes left out of `requests`, and an unknown engine refused."""

from __future__ import annotations

from collections import deque

import aiohttp
import pytest
from fakes.upstream import FakeUpstream

pytestmark = pytest.mark.integration


async def test_per_route_answers_fixed_and_computed(upstreams):
    up = await upstreams(answers={"/v1/x": {"fixed": 1}, "/v1/y": lambda body: {"got": body}})
    async with aiohttp.ClientSession() as s:
        async with s.post(up.url + "/v1/x", json={"a": 1}) as r:
            assert (r.status, await r.json()) == (200, {"fixed": 1})
        async with s.post(up.url + "/v1/y", json={"a": 2}) as r:
            assert (r.status, await r.json()) == (200, {"got": {"a": 2}})
        async with s.get(up.url + "/health") as r:
            assert r.status == 200
    assert up.paths() == ["/v1/x", "/v1/y"]  # the probe is received but not a request
    assert [r.path for r in up.received] == ["/v1/x", "/v1/y", "/health"]
    assert up.bodies("/v1/y") == [{"a": 2}]


@pytest.mark.parametrize("engine", ["sglang", "rl"])
async def test_fault_knobs_apply_to_every_engine(upstreams, engine):
    up = await upstreams(engine=engine, statuses=deque([503]), healthy=False)
    async with aiohttp.ClientSession() as s:
        async with s.post(up.url + "/generate", json={"text": "x"}) as r:
            assert r.status == 503
        async with s.get(up.url + "/health") as r:
            assert r.status == 503
    assert up.health_checks == 1 and up.calls == [("/generate", {"text": "x"})]


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="vllm"):
        FakeUpstream(engine="vllm")
