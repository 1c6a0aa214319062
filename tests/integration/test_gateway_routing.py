"""Routing: general traffic byte for byte to the general pool, mask traffic only to the mask
pool (never the general one, even when the mask pool is down), request ids end to end."""

from __future__ import annotations

import orjson
import pytest
from fakes.bodies import MASK_CHAT

pytestmark = pytest.mark.integration


async def test_general_request_is_forwarded_byte_for_byte(upstreams, gateway, make_config):
    general = await upstreams(name="general")
    mask = await upstreams(name="mask")
    # Odd spacing, key order and an unknown field: only a byte-exact copy keeps all three.
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"hi"}], "zzz_unknown": [1,2]}'
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, body, resp = await gw.post("/v1/chat/completions?x=1", raw)
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "hi"
    assert resp.headers["X-Upstream"] == "general"
    [got] = general.requests
    assert got.body == raw
    assert got.path == "/v1/chat/completions"
    assert mask.requests == []


async def test_mask_request_goes_to_mask_pool_with_resolved_params(upstreams, gateway, make_config):
    general = await upstreams(name="general")
    mask = await upstreams(name="mask")
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, body, resp = await gw.post("/v1/chat/completions", MASK_CHAT)
    assert status == 200, body
    assert resp.headers["X-Upstream"] == "mask"
    assert general.requests == []
    [got] = mask.requests
    sent = got.json()
    assert (sent["temperature"], sent["top_k"], sent["top_p"], sent["min_p"]) == (1.0, 20, 1.0, 0.0)
    assert body["choices"][0]["meta_info"]["output_token_sampling_mask"][0] == [10, 20, 30]


async def test_mask_request_never_falls_back_when_mask_pool_is_down(
    upstreams, gateway, make_config
):
    general = await upstreams(name="general")
    mask = await upstreams(name="mask", healthy=False)
    async with gateway(make_config([general.url], [mask.url])) as gw:
        await mask.stop()  # and now not even reachable
        for _ in range(3):
            status, body, resp = await gw.post("/v1/chat/completions", MASK_CHAT)
            assert status == 503
            assert body["error"]["code"] == "mask_pool_unavailable"
            assert resp.headers["Retry-After"]
        status, _, _ = await gw.post("/v1/chat/completions", {"model": "m", "messages": []})
        assert status == 200
    assert len(general.requests) == 1  # only the general request


async def test_mask_request_with_no_mask_endpoint_configured(upstreams, gateway, make_config):
    general = await upstreams()
    async with gateway(make_config([general.url], [])) as gw:
        status, body, _ = await gw.post(
            "/generate",
            {"text": "a", "return_sampling_mask": True, "sampling_params": {"top_k": 5}},
        )
    assert (status, body["error"]["code"]) == (503, "mask_pool_unavailable")
    assert general.requests == []


async def test_undeclared_paths_get_404_and_models_go_to_general(upstreams, gateway, make_config):
    general = await upstreams(name="general")
    mask = await upstreams(name="mask")
    async with gateway(make_config([general.url], [mask.url])) as gw:
        async with gw.client.get(gw.url + "/v1/models") as resp:
            assert resp.status == 200
            assert (await resp.json())["data"][0]["id"] == "fake-model"
        async with gw.client.get(gw.url + "/some/unknown/path?q=1") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "not_found"
        # A declared route without sampling parameters: passed through as is, no policy.
        status, _, _ = await gw.post("/v1/embeddings", b"not json")
        assert status == 200
    assert [r.path for r in general.requests] == ["/v1/models", "/v1/embeddings"]
    assert general.requests[1].body == b"not json"
    assert mask.requests == []


async def test_request_id_is_accepted_forwarded_and_echoed(upstreams, gateway, make_config):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        _, _, resp = await gw.post(
            "/v1/completions", {"prompt": "x"}, headers={"X-Request-Id": "abc-1"}
        )
        assert resp.headers["X-Request-Id"] == "abc-1"
        _, _, resp = await gw.post("/generate", {"text": "x"})
        generated = resp.headers["X-Request-Id"]
        _, _, resp = await gw.post(
            "/generate",
            {
                "text": ["a", "b"],
                "return_sampling_mask": [True, False],
                "sampling_params": {"top_k": 4},
            },
            headers={"X-Request-Id": "batch-7"},
        )
        assert resp.status == 200
    assert general.requests[0].headers["X-Request-Id"] == "abc-1"
    assert general.requests[0].body == orjson.dumps({"prompt": "x"})
    assert len(generated) == 32
    # General bodies go upstream byte for byte; the id travels in the header.
    assert general.requests[1].body == orjson.dumps({"text": "x"})
    assert general.requests[1].headers["X-Request-Id"] == generated
    # A mask batch gets one rid string (the upstream numbers the items): bounded growth.
    assert mask.requests[0].json()["rid"] == "batch-7"


async def test_policy_rejection_sends_nothing_upstream(upstreams, gateway, make_config):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, body, resp = await gw.post(
            "/v1/chat/completions", {**MASK_CHAT, "top_k": -1, "top_p": 0.99999999}
        )
        assert status == 400
        assert body["error"]["code"] == "sampling_mask_full_vocabulary"
        assert body["error"]["type"] == "invalid_request_error"
        assert resp.headers["X-Request-Id"]
        text = await gw.metrics()
    assert 'maskgate_rejections_total{code="sampling_mask_full_vocabulary"} 1.0' in text
    assert general.requests == [] and mask.requests == []


async def test_trailing_slash_does_not_dodge_the_policy(upstreams, gateway, make_config):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, body, _ = await gw.post("/v1/chat/completions/", {**MASK_CHAT, "top_k": -1})
    assert (status, body["error"]["code"]) == (404, "not_found")  # not a declared route
    assert general.requests == [] and mask.requests == []
