"""Bursts of 503 and 500 answers. 503 is backpressure: retried on another endpoint before
any byte reaches the client, never an endpoint fault. 500 is not retryable: it reaches the
client as sent, counts as an endpoint fault and opens the circuit after the threshold."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from faults_harness import (
    CHAT,
    MASK_GENERATE,
    Procs,
    assert_no_leak,
    gateway_config,
    sample,
)

pytestmark = pytest.mark.integration

BURST = 5
REQUESTS = 30  # enough that the failing endpoint is picked for its whole burst


async def _send(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict]:
    async with client.post(url, json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("pool", "path", "body"),
    [("general", "/v1/chat/completions", CHAT), ("mask", "/generate", MASK_GENERATE)],
)
async def test_503_burst_is_retried_on_another_endpoint(
    procs: Procs, client: aiohttp.ClientSession, pool: str, path: str, body: dict[str, Any]
) -> None:
    a, b, other = procs.upstream(), procs.upstream(), procs.upstream()
    general, mask = (
        ([a.url, b.url], [other.url]) if pool == "general" else ([other.url], [a.url, b.url])
    )
    gw = await procs.gateway(gateway_config(general, mask))
    assert (await _send(client, gw.url + path, body))[0] == 200
    before = gw.resources()
    await a.control(fail_next=BURST, fail_status=503)

    answers = [await _send(client, gw.url + path, body) for _ in range(REQUESTS)]
    assert [s for s, _ in answers] == [200] * REQUESTS
    injected = await a.count("fault_503")
    assert injected >= 1
    text = await gw.metrics()
    assert sample(text, "maskgate_retries_total", pool=pool) == injected
    # Backpressure is not an endpoint fault: no error counted, circuit closed, still healthy.
    assert sample(text, "maskgate_upstream_errors_total", upstream=a.url) == 0
    ep = await gw.endpoint(pool, a.url)
    assert ep is not None and ep["healthy"] is True and ep["circuit"] == "closed"
    assert await other.count() == 0
    await assert_no_leak(gw, before)


async def test_503_everywhere_surfaces_after_trying_each_endpoint_once(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    a, b = procs.upstream(fail_next=1), procs.upstream(fail_next=1)
    gw = await procs.gateway(gateway_config([a.url, b.url], []))
    status, body = await _send(client, gw.url + "/v1/chat/completions", CHAT)
    assert status == 503, body  # the last upstream answer, as sent
    assert await a.count("fault_503") == 1 and await b.count("fault_503") == 1
    assert await gw.metric("maskgate_retries_total", pool="general") == 1


async def test_500_burst_surfaces_and_opens_the_circuit(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    a, b = procs.upstream(), procs.upstream()
    cfg = gateway_config([a.url, b.url], [], timeouts={"health_interval_s": 30.0})
    gw = await procs.gateway(cfg)
    assert (await _send(client, gw.url + "/v1/chat/completions", CHAT))[0] == 200
    before = gw.resources()
    # Exactly the circuit's default threshold of consecutive failures.
    await a.control(fail_next=BURST, fail_status=500)

    answers = [await _send(client, gw.url + "/v1/chat/completions", CHAT) for _ in range(40)]
    statuses = [s for s, _ in answers]
    assert set(statuses) <= {200, 500}
    assert statuses.count(500) == await a.count("fault_500") == BURST
    assert all(body["error"]["code"] == "injected" for s, body in answers if s == 500)
    text = await gw.metrics()
    assert sample(text, "maskgate_retries_total") == 0
    assert (
        sample(text, "maskgate_upstream_errors_total", upstream=a.url, kind="status_5xx") == BURST
    )
    assert sample(text, "maskgate_requests_total", route="chat", status="500") == BURST
    assert sample(text, "maskgate_upstream_circuit_state", upstream=a.url) == 2  # open
    # While open, everything goes to b.
    served_by_a = await a.count()
    for _ in range(5):
        assert (await _send(client, gw.url + "/v1/chat/completions", CHAT))[0] == 200
    assert await a.count() == served_by_a
    assert gw.alive()
    await assert_no_leak(gw, before)
