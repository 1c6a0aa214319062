"""SIGSTOP of an upstream (it hangs with its sockets open): the client gets a 504 within the
first-byte timeout, or an error event within the idle timeout mid-stream; never a hang."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp
import pytest
from faults_harness import (
    CHAT,
    MASK_GENERATE,
    TIMEOUTS,
    Procs,
    Stream,
    assert_no_leak,
    gateway_config,
    sample,
    wait_until,
)

pytestmark = pytest.mark.integration

SLACK_S = 2.0  # scheduling slack on a loaded 2-core CI machine
# Slow health checks, so the stopped endpoint is still routed to when the request goes out.
SLOW_HEALTH = {"health_interval_s": 5.0}


async def test_sigstop_before_headers_answers_504_within_ttfb(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    up = procs.upstream()
    gw = await procs.gateway(gateway_config([up.url], [], timeouts=SLOW_HEALTH))
    async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    before = gw.resources()

    up.signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            body = await resp.json()
        elapsed = time.monotonic() - t0
    finally:
        up.signal(signal.SIGCONT)
    assert resp.status == 504, body
    assert body["error"]["code"] == "upstream_timeout"
    assert elapsed < TIMEOUTS["ttfb_s"] + SLACK_S
    assert gw.alive()
    text = await gw.metrics()
    assert sample(text, "maskgate_upstream_errors_total", upstream=up.url, kind="timeout") == 1
    assert sample(text, "maskgate_requests_total", route="chat", status="504") == 1
    # The resumed upstream serves again.
    async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    await assert_no_leak(gw, before)


@pytest.mark.parametrize(
    ("pool", "path", "body"),
    [("general", "/v1/chat/completions", CHAT), ("mask", "/generate", MASK_GENERATE)],
)
async def test_sigstop_mid_stream_ends_the_stream_within_idle_timeout(
    procs: Procs, client: aiohttp.ClientSession, pool: str, path: str, body: dict[str, Any]
) -> None:
    up = procs.upstream(chunks=3, chunk_gap_s=0.05)
    other = procs.upstream()
    general, mask = ([up.url], [other.url]) if pool == "general" else ([other.url], [up.url])
    gw = await procs.gateway(gateway_config(general, mask, timeouts=SLOW_HEALTH))
    stream_body = {**body, "stream": True}
    async with client.post(gw.url + path, json=stream_body) as resp:
        assert (await Stream(resp).rest())[-1] == "[DONE]"
    await up.control(chunks=40)
    before = gw.resources()

    for _ in range(2):
        async with client.post(gw.url + path, json=stream_body) as resp:
            stream = Stream(resp)
            await stream.next_events(2)
            up.signal(signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(stream.rest(), TIMEOUTS["idle_s"] + SLACK_S)
            finally:
                elapsed = time.monotonic() - t0
                up.signal(signal.SIGCONT)
        assert stream.error is not None and stream.error["code"] == "upstream_stream_error"
        assert stream.events[-1] != "[DONE]"
        assert elapsed < TIMEOUTS["idle_s"] + SLACK_S
        assert gw.alive()

    text = await gw.metrics()
    assert sample(text, "maskgate_stream_errors_total", pool=pool) == 2
    assert sample(text, "maskgate_upstream_errors_total", upstream=up.url, kind="timeout") == 2
    assert await other.count() == 0
    # The upstream, resumed, finishes what it had been writing; the gateway serves on.
    await up.control(chunks=3)
    async with client.post(gw.url + path, json=stream_body) as resp:
        assert (await Stream(resp).rest())[-1] == "[DONE]"
    await wait_until(lambda: up.count("completed_streams"), what="a completed stream")
    await assert_no_leak(gw, before)
