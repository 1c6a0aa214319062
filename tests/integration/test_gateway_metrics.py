"""/metrics carries every metric the deploy dashboard and alerts use; mask responses are
checked (support sizes, invariants) and passed through unchanged."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

FIXED_NAMES = [
    "maskgate_requests_total",
    "maskgate_request_duration_seconds",
    "maskgate_overhead_seconds",
    "maskgate_rejections_total",
    "maskgate_inflight_requests",
    "maskgate_queue_depth",
    "maskgate_queue_wait_seconds",
    "maskgate_queue_capacity",
    "maskgate_upstream_healthy",
    "maskgate_upstream_circuit_state",
    "maskgate_upstream_errors_total",
    "maskgate_retries_total",
    "maskgate_upstream_stale_resends_total",
    "maskgate_stream_ttfb_seconds",
    "maskgate_stream_errors_total",
    "maskgate_mask_support_size",
    "maskgate_mask_invariant_violations_total",
    "maskgate_pool_endpoints",
    "maskgate_ready",
]
MASK_CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "return_sampling_mask": True,
    "return_meta_info": True,
    "return_token_ids": True,
    "top_p": 0.9,
}


async def test_every_fixed_metric_is_exported(upstreams, gateway, make_config):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        await gw.post("/v1/completions", {"prompt": "x"})
        await gw.post("/v1/chat/completions", MASK_CHAT)
        await gw.post("/v1/completions", b"{")  # a rejection
        async with gw.client.post(gw.url + "/v1/completions", json={"stream": True}) as resp:
            await resp.read()
        async with gw.client.get(gw.url + "/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    for name in FIXED_NAMES:
        base = name.removesuffix("_total")
        assert base in declared or name in declared, name
    assert 'maskgate_requests_total{pool="general",route="completions",status="200"} 2.0' in text
    assert 'maskgate_requests_total{pool="mask",route="chat",status="200"} 1.0' in text
    assert 'maskgate_requests_total{pool="none",route="completions",status="400"} 1.0' in text
    assert "maskgate_ready 1.0" in text
    assert 'maskgate_upstream_circuit_state{pool="mask",upstream="' in text
    assert 'maskgate_overhead_seconds_count{pool="general",route="completions"} 2.0' in text
    assert 'maskgate_queue_capacity{pool="general"}' in text
    assert 'maskgate_queue_wait_seconds_count{pool="general"} 2.0' in text


async def test_mask_responses_record_support_and_violations(upstreams, gateway, make_config):
    mask = await upstreams()
    async with gateway(make_config([], [mask.url])) as gw:
        status, _, _ = await gw.post("/v1/chat/completions", MASK_CHAT)
        assert status == 200
        text = await gw.metrics()
        # Four tokens with three ids each: all in the <=4 bucket, no violation.
        assert 'maskgate_mask_support_size_count{pool="mask"} 4.0' in text
        assert 'maskgate_mask_support_size_bucket{le="2.0",pool="mask"} 0.0' in text
        assert 'maskgate_mask_support_size_bucket{le="4.0",pool="mask"} 4.0' in text
        assert "maskgate_mask_invariant_violations_total{" not in text

        mask.mask_ids_outside = True
        status, bad, _ = await gw.post("/v1/chat/completions", MASK_CHAT)
        gen = {"text": ["a", "b"], "return_sampling_mask": True, "sampling_params": {"top_k": 3}}
        status_gen, bad_gen, _ = await gw.post("/generate", gen)
        text = await gw.metrics()
    # The client still gets the upstream's body, unchanged.
    assert status == 200 and bad["choices"][0]["token_ids"][-1] == 999
    assert status_gen == 200 and bad_gen[1]["output_ids"][-1] == 999
    assert 'maskgate_mask_invariant_violations_total{kind="token_outside_mask"} 2.0' in text


async def test_separate_metrics_port_app_serves_probes_and_metrics(upstreams, make_config):
    from aiohttp.test_utils import TestClient, TestServer

    from maskgate.gateway.app import create_app, create_probe_app

    app = create_app(make_config(metrics_port=9))
    probe = create_probe_app(app)
    async with TestClient(TestServer(app)) as main, TestClient(TestServer(probe)) as side:
        resp = await side.get("/metrics")
        assert resp.status == 200 and "maskgate_ready" in await resp.text()
        assert (await side.get("/healthz")).status == 200
        # /metrics is not on the traffic port: not declared there, so 404, never proxied.
        resp = await main.get("/metrics")
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "not_found"
