"""Graceful shutdown: on SIGTERM readiness fails first, then every stream in flight, general
and mask, runs to its end, and the process exits 0 within the grace period."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from faults_harness import CHAT, MASK_GENERATE, Procs, Stream, gateway_config, wait_until

pytestmark = pytest.mark.integration

CHUNKS, GAP_S = 20, 0.1  # each stream runs ~2 s
DELAY_S, GRACE_S = 1.5, 10.0


async def test_sigterm_drains_every_stream_in_flight(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    general = procs.upstream(chunks=CHUNKS, chunk_gap_s=GAP_S)
    mask = procs.upstream(chunks=CHUNKS, chunk_gap_s=GAP_S)
    cfg = gateway_config(
        [general.url], [mask.url], shutdown_delay_s=DELAY_S, shutdown_grace_s=GRACE_S
    )
    gw = await procs.gateway(cfg)
    bodies = [("/v1/chat/completions", {**CHAT, "stream": True})] * 3 + [
        ("/generate", {**MASK_GENERATE, "stream": True})
    ] * 3
    responses = [await client.post(gw.url + path, json=body) for path, body in bodies]
    streams = [Stream(r) for r in responses]
    try:
        for s in streams:
            assert s.resp.status == 200
            await s.next_events(1)
        gw.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        # Readiness fails first, while the listener is still open (shutdown_delay_s).
        await wait_until(lambda: _draining(gw.url), timeout=DELAY_S, what="/readyz 503", step=0.02)
        rests = await asyncio.wait_for(asyncio.gather(*(s.rest() for s in streams)), GRACE_S)
    finally:
        for r in responses:
            r.release()
    for s, rest in zip(streams, rests, strict=True):
        assert s.error is None and s.malformed == []
        assert rest[-1] == "[DONE]"
        assert len(s.events) == CHUNKS + 1
    code = await asyncio.to_thread(gw.proc.wait, GRACE_S)
    assert code == 0
    assert time.monotonic() - t0 < GRACE_S
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh, fresh.get(gw.url + "/healthz"):
            pass
    assert await general.count("completed_streams") == 3
    assert await mask.count("completed_streams") == 3


async def _draining(url: str) -> bool:
    async with aiohttp.ClientSession() as fresh, fresh.get(url + "/readyz") as resp:
        return resp.status == 503 and (await resp.json())["status"] == "draining"
