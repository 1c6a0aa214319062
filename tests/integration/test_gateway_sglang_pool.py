"""A mask pool of SGLang engines (`pools.mask.engine: sglang`), against the fake SGLang engine
`FakeUpstream(engine="sglang")` (tests/fakes/sglang_engine.py, written to follow SGLang's
source; not a real SGLang): what the policy refuses before the pool, what reaches it, masks
converted to packed, and SGLang's error bodies answered in the gateway's error format."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fakes.upstream import FakeUpstream

from maskgate.gateway import GatewayConfig
from tests.mask_formats import masks_of, sse_events

pytestmark = pytest.mark.integration
CODE = "sampling_mask_engine_unsupported"


@pytest.fixture
async def sglang() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream(engine="sglang", max_mask_tokens=64)
    await up.start()
    yield up
    await up.stop()


@pytest.fixture
def config(sglang: FakeUpstream, make_config: Callable[..., GatewayConfig]) -> GatewayConfig:
    pool = {"engine": "sglang", "sampling_mask_max_tokens": 64}
    return make_config(mask=[sglang.url], pools={"mask": pool})


def generate(sp: dict[str, Any], **extra: Any) -> dict[str, Any]:
    base = {"temperature": 1.0, "max_new_tokens": 5, "sampling_seed": 3}
    return {"text": "hi", "sampling_params": {**base, **sp}, "return_sampling_mask": True, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "return_sampling_mask": True,
        "return_meta_info": True,
        **extra,
    }


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", generate({"top_p": 0.9}), "sampling_params.top_k"),  # top-p only
        ("/generate", generate({"top_k": 65}), "sampling_params.top_k"),  # past the cap
        (
            "/generate",
            {**generate({}), "text": ["a", "b"], "sampling_params": [{"top_k": 5}, {"top_p": 0.5}]},
            "sampling_params[1].top_k",
        ),
        ("/v1/chat/completions", chat(top_p=0.8), "top_k"),
        ("/generate", generate({"top_k": 5}, sampling_mask_mode="bounded"), "sampling_mask_mode"),
        ("/v1/completions", {**chat(top_k=5), "prompt": "hi"}, "return_sampling_mask"),
    ],
)
async def test_requests_sglang_cannot_serve_are_refused(sglang, gateway, config, path, body, param):
    async with gateway(config) as gw:
        status, answer, _ = await gw.post(path, body)
        metrics = await gw.metrics()
    assert status == 400, answer
    err = answer["error"]
    assert (err["code"], err["param"]) == (CODE, param)
    assert "engine: maskgate" in err["message"] and "SGLang" in err["message"]
    assert sglang.bodies() == []
    assert f'maskgate_rejections_total{{code="{CODE}"}} 1.0' in metrics


async def test_chat_stream_with_masks_is_refused(sglang, gateway, config):
    async with gateway(config) as gw:
        status, answer, _ = await gw.post("/v1/chat/completions", chat(top_k=5, stream=True))
    assert status == 400
    assert answer["error"]["code"] == "sampling_mask_stream_unsupported"
    assert sglang.bodies() == []


async def test_maskgate_pool_serves_top_p_only(upstreams, gateway, make_config):
    up = await upstreams()
    async with gateway(make_config(mask=[up.url])) as gw:
        status, _, _ = await gw.post("/generate", generate({"top_p": 0.9}))
    assert status == 200


async def test_packed_masks_from_sglang_lists(sglang, gateway, config):
    async with gateway(config) as gw:
        s1, lists, _ = await gw.post("/generate", generate({"top_k": 20}))
        body = generate({"top_k": 20}, sampling_mask_format="packed")
        s2, packed, _ = await gw.post("/generate", body)
        s3, chat_lists, _ = await gw.post("/v1/chat/completions", chat(top_k=7, seed=2))
        s4, chat_packed, _ = await gw.post(
            "/v1/chat/completions", chat(top_k=7, seed=2, sampling_mask_format="packed")
        )
    assert (s1, s2, s3, s4) == (200, 200, 200, 200), (lists, packed)
    # SGLang knows no sampling_mask_format: the gateway keeps it and converts the answer.
    assert all("sampling_mask_format" not in b for b in sglang.bodies())
    assert "output_token_sampling_mask_ids" in packed["meta_info"]
    assert masks_of(packed["meta_info"]) == masks_of(lists["meta_info"])
    got = masks_of(chat_packed["choices"][0]["meta_info"])
    assert got == masks_of(chat_lists["choices"][0]["meta_info"]) and len(got) == 5


async def test_stream_events_are_packed_one_by_one(sglang, gateway, config):
    texts = {"text": ["a", "b"], "stream": True}

    async def stream(gw: Any, fmt: Any) -> list[Any]:
        body = generate({"top_k": 9}, sampling_mask_format=fmt, **texts)
        async with gw.client.post(gw.url + "/generate", json=body) as resp:
            assert resp.status == 200
            return sse_events(await resp.read())

    async with gateway(config) as gw:
        lists = await stream(gw, "lists")
        packed = await stream(gw, ["packed", "lists"])
    assert len(packed) == len(lists) == 10
    for p, q in zip(packed, lists, strict=True):
        assert p["index"] == q["index"]
        assert masks_of(p["meta_info"]) == masks_of(q["meta_info"])
        is_packed = "output_token_sampling_mask_ids" in p["meta_info"]
        assert is_packed == (p["index"] == 0)


async def test_sglang_generate_error_in_our_format(sglang, gateway, make_config):
    # The gateway's cap (100) admits top_k=80; the engine's own (64) refuses it.
    pool = {"engine": "sglang", "sampling_mask_max_tokens": 100}
    async with gateway(make_config(mask=[sglang.url], pools={"mask": pool})) as gw:
        status, answer, _ = await gw.post("/generate", generate({"top_k": 80}))
    assert status == 400
    err = answer["error"]
    assert err["code"] == "upstream_invalid_request"
    assert err["type"] == "invalid_request_error"
    assert "requires top_k <= 64" in err["message"]


async def test_sglang_chat_error_in_our_format(sglang, gateway, config):
    sglang.chat_error = "return_sampling_mask requires return_meta_info=true."
    async with gateway(config) as gw:
        status, answer, _ = await gw.post("/v1/chat/completions", chat(top_k=5))
    assert status == 400
    assert answer["error"]["code"] == "upstream_invalid_request"
    assert "requires return_meta_info" in answer["error"]["message"]
    assert "object" not in answer


async def test_sglang_stream_error_event_in_our_format(sglang, gateway, config):
    sglang.stream_error_after = 2
    async with gateway(config) as gw:
        body = generate({"top_k": 5}, stream=True, sampling_mask_format="packed")
        async with gw.client.post(gw.url + "/generate", json=body) as resp:
            assert resp.status == 200
            events = sse_events(await resp.read())
    assert len(events) == 3
    assert all("output_token_sampling_mask_ids" in e["meta_info"] for e in events[:2])
    err = events[2]["error"]
    assert err["code"] == "upstream_invalid_request"
    assert "scheduler aborted" in err["message"]
