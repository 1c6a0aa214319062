"""Flapping health: an endpoint leaves rotation after `unhealthy_threshold` failed checks
in a row and comes back after `healthy_threshold` passing ones; a mask pool left with no
healthy endpoint answers 503 mask_pool_unavailable and never falls back to general."""

from __future__ import annotations

import aiohttp
import pytest
from faults_harness import (
    CHAT,
    MASK_GENERATE,
    GatewayProc,
    Procs,
    UpstreamProc,
    assert_no_leak,
    gateway_config,
    wait_until,
)

pytestmark = pytest.mark.integration

FLAPS = 3
UNHEALTHY_AFTER, HEALTHY_AFTER = 3, 2  # the pool's thresholds (config defaults)


async def _healthy_metric(gw: GatewayProc, pool: str, up: UpstreamProc) -> float:
    return await gw.metric("maskgate_upstream_healthy", pool=pool, upstream=up.url)


async def test_flapping_endpoint_is_ejected_and_readmitted_per_thresholds(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    a, b = procs.upstream(), procs.upstream()
    pools = {
        "general": {"unhealthy_threshold": UNHEALTHY_AFTER, "healthy_threshold": HEALTHY_AFTER}
    }
    cfg = gateway_config([a.url, b.url], [])
    cfg["pools"]["general"].update(pools["general"])
    gw = await procs.gateway(cfg)
    before = gw.resources()

    for _ in range(FLAPS):
        fails0 = await a.count("health_fail")
        await a.control(healthy=False)
        await wait_until(lambda: _is(gw, "general", a, 0.0), timeout=5.0, what="ejection")
        # Ejected only once the threshold of failed checks in a row was reached.
        assert await a.count("health_fail") - fails0 >= UNHEALTHY_AFTER
        served = await a.count()
        for _ in range(10):
            async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
        assert await a.count() == served  # out of rotation

        oks1 = await a.count("health_ok")
        await a.control(healthy=True)
        await wait_until(lambda: _is(gw, "general", a, 1.0), timeout=5.0, what="readmission")
        assert await a.count("health_ok") - oks1 >= HEALTHY_AFTER
        served = await a.count()
        for _ in range(20):
            async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
        assert await a.count() > served  # back in rotation

    assert gw.alive()
    await assert_no_leak(gw, before)


async def _is(gw: GatewayProc, pool: str, up: UpstreamProc, value: float) -> bool:
    return await _healthy_metric(gw, pool, up) == value


async def test_unhealthy_mask_pool_answers_503_and_never_falls_back(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    general, mask = procs.upstream(), procs.upstream()
    gw = await procs.gateway(gateway_config([general.url], [mask.url]))
    await mask.control(healthy=False)
    await wait_until(lambda: _is(gw, "mask", mask, 0.0), timeout=5.0, what="mask ejection")
    for _ in range(5):
        async with client.post(gw.url + "/generate", json=MASK_GENERATE) as resp:
            body = await resp.json()
            assert resp.status == 503
            assert resp.headers.get("Retry-After")
        assert body["error"]["code"] == "mask_pool_unavailable"
    assert await general.count() == 0 and await mask.count() == 0
    assert await gw.metric("maskgate_rejections_total", code="mask_pool_unavailable") == 5
    # General traffic is unaffected, and masks come back with the endpoint.
    async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    await mask.control(healthy=True)
    await wait_until(lambda: _is(gw, "mask", mask, 1.0), timeout=5.0, what="mask readmission")
    async with client.post(gw.url + "/generate", json=MASK_GENERATE) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert len(body["meta_info"]["output_token_sampling_mask"]) == 4
