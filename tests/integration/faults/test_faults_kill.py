"""SIGKILL of an upstream: mid-stream (the client's stream ends with an error event) and
while idle (the next request gets a connect error and is retried on another endpoint)."""

from __future__ import annotations

import asyncio
import functools
import signal
from typing import Any

import aiohttp
import pytest
from faults_harness import (
    CHAT,
    MASK_GENERATE,
    TIMEOUTS,
    GatewayProc,
    Procs,
    Stream,
    assert_no_leak,
    gateway_config,
    sample,
    wait_until,
)

pytestmark = pytest.mark.integration

ROUNDS = 3  # kills per test: a per-fault leak would show as growth well past the slack


@pytest.mark.parametrize(
    ("pool", "path", "body"),
    [("general", "/v1/chat/completions", CHAT), ("mask", "/generate", MASK_GENERATE)],
)
async def test_sigkill_mid_stream_ends_the_stream_with_an_error_event(
    procs: Procs, client: aiohttp.ClientSession, pool: str, path: str, body: dict[str, Any]
) -> None:
    knobs: dict[str, Any] = {"chunks": 40, "chunk_gap_s": 0.05}
    up = procs.upstream(**knobs)
    other = procs.upstream()  # the pool that must never see this traffic
    general, mask = ([up.url], [other.url]) if pool == "general" else ([other.url], [up.url])
    gw = await procs.gateway(gateway_config(general, mask))
    stream_body = {**body, "stream": True}

    # Warm up with one complete stream, so pooled connections exist before the baseline.
    await up.control(chunks=3)
    async with client.post(gw.url + path, json=stream_body) as resp:
        assert resp.status == 200
        events = await Stream(resp).rest()
        assert events[-1] == "[DONE]"
    await up.control(chunks=knobs["chunks"])
    before = gw.resources()

    for _ in range(ROUNDS):
        async with client.post(gw.url + path, json=stream_body) as resp:
            assert resp.status == 200
            stream = Stream(resp)
            await stream.next_events(2)
            up.signal(signal.SIGKILL)
            up.proc.wait()
            rest = await asyncio.wait_for(stream.rest(), TIMEOUTS["idle_s"] + 2.0)
        assert stream.error is not None, rest
        assert stream.error["code"] == "upstream_stream_error"
        assert "[DONE]" not in rest
        assert gw.alive()
        # Same port again: the gateway's health checks readmit it.
        up = procs.upstream(port=up.port, **knobs)
        readmitted = functools.partial(_healthy, gw, pool, up.url)
        await wait_until(readmitted, timeout=5.0, what="upstream readmitted")

    text = await gw.metrics()
    assert sample(text, "maskgate_stream_errors_total", pool=pool) == ROUNDS
    assert sample(text, "maskgate_upstream_errors_total", pool=pool, upstream=up.url) >= ROUNDS
    assert await other.count() == 0  # isolation held throughout
    status, _ = await gw.get("/healthz")
    assert status == 200
    await assert_no_leak(gw, before)


async def _healthy(gw: GatewayProc, pool: str, url: str) -> bool:
    ep = await gw.endpoint(pool, url)
    return bool(ep and ep["healthy"] and ep["circuit"] == "closed")


async def test_sigkill_while_idle_retries_on_another_endpoint(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    a, b = procs.upstream(), procs.upstream()
    # Slow health checks: the dead endpoint is found by the requests themselves.
    cfg = gateway_config([a.url, b.url], [], timeouts={"health_interval_s": 30.0})
    gw = await procs.gateway(cfg)
    for _ in range(4):
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
    before = gw.resources()
    a.signal(signal.SIGKILL)
    a.proc.wait()

    statuses = []
    for _ in range(20):  # power of two choices picks the dead one at least once (p > 1-1e-6)
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            statuses.append(resp.status)
            await resp.read()
    assert statuses == [200] * 20
    assert await gw.metric("maskgate_retries_total", pool="general") >= 1
    assert (
        await gw.metric(
            "maskgate_upstream_errors_total", pool="general", upstream=a.url, kind="connect"
        )
        >= 1
    )
    ep = await gw.endpoint("general", a.url)
    assert ep is not None and ep["healthy"] is False  # passive ejection
    assert gw.alive()
    await assert_no_leak(gw, before)
