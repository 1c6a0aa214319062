"""A slow trickle of bytes: a stream whose every gap is under the idle timeout completes,
however long it takes in total (there is no total timeout on streams); a trickle slower
than the idle timeout ends with an error event within it."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from faults_harness import (
    CHAT,
    TIMEOUTS,
    Procs,
    Stream,
    assert_no_leak,
    gateway_config,
    sample,
)

pytestmark = pytest.mark.integration


async def test_trickle_under_idle_timeout_completes_intact(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    # ~3 frames of ~140 bytes at 6 ms a byte: about 2.5 s in all, longer than both the
    # first-byte (1.5 s) and idle (1 s) timeouts, with every gap far below them.
    up = procs.upstream(chunks=2, trickle_gap_s=0.006)
    gw = await procs.gateway(gateway_config([up.url], []))
    before = gw.resources()

    t0 = time.monotonic()
    async with client.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status == 200
        events = await Stream(r).rest()
    elapsed = time.monotonic() - t0
    assert elapsed > TIMEOUTS["ttfb_s"]  # it really was slower than any single timeout
    assert [e["choices"][0]["delta"]["content"] for e in events[:-1]] == [" tok0", " tok1"]
    assert events[-1] == "[DONE]"

    assert await gw.metric("maskgate_stream_errors_total") == 0
    await assert_no_leak(gw, before)


async def test_trickled_json_answer_under_idle_timeout_arrives_whole(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    # ~280 bytes at 6 ms a byte: longer than idle_s (1 s) in all, every gap far below it.
    up = procs.upstream(chunks=2, trickle_gap_s=0.006)
    gw = await procs.gateway(gateway_config([up.url], []))
    async with client.post(gw.url + "/v1/completions", json={"prompt": "x"}) as r:
        body = json.loads(await r.read())
        assert r.status == 200, body
    assert body["choices"][0]["text"] == " tok tok"


async def test_trickle_slower_than_idle_timeout_ends_with_an_error_event(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    """The stream ends within the idle timeout with an error event, counted, and the
    gateway stays healthy."""
    up = procs.upstream(chunks=2, trickle_gap_s=TIMEOUTS["idle_s"] * 1.6)
    gw = await procs.gateway(gateway_config([up.url], []))
    before = gw.resources()
    t0 = time.monotonic()
    async with client.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status == 200
        stream = Stream(r)
        await asyncio.wait_for(stream.rest(), TIMEOUTS["idle_s"] * 3 + 2.0)
    assert time.monotonic() - t0 < TIMEOUTS["idle_s"] * 3 + 2.0
    assert "[DONE]" not in stream.events
    text = await gw.metrics()
    assert sample(text, "maskgate_stream_errors_total", pool="general") == 1
    assert sample(text, "maskgate_upstream_errors_total", kind="timeout") == 1
    assert gw.alive()
    await up.control(trickle_gap_s=0.0)
    await assert_no_leak(gw, before)
    # The error event starts a frame of its own (the cut frame is ended first), so SSE
    # clients see it; here the cut piece is one byte of "data:", a line clients ignore.
    assert stream.error is not None and stream.error["code"] == "upstream_stream_error"
    assert not any(line.startswith("data") for line in stream.malformed), stream.malformed
