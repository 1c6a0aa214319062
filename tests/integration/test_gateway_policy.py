"""Every mask-policy rule through HTTP: its status and code, and nothing sent upstream."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.bodies import MASK_CHAT as CHAT

pytestmark = pytest.mark.integration

COMPLETION: dict[str, Any] = {**{k: v for k, v in CHAT.items() if k != "messages"}, "prompt": "x"}
GENERATE: dict[str, Any] = {
    "text": "hello",
    "return_sampling_mask": True,
    "sampling_params": {"top_k": 20, "max_new_tokens": 8},
}


def batch(**kw: Any) -> dict[str, Any]:
    return {"text": ["a", "b", "c"], **kw}


CASES = [
    # rule 1
    ("/v1/chat/completions", b"{not json", 400, "invalid_json"),
    ("/v1/chat/completions", b"[1, 2]", 400, "invalid_json"),
    ("/generate", b'"a string"', 400, "invalid_json"),
    # rule 3
    (
        "/v1/chat/completions",
        {**CHAT, "return_sampling_mask": "yes"},
        400,
        "sampling_mask_invalid_param",
    ),
    ("/v1/chat/completions", {**CHAT, "top_k": "20"}, 400, "sampling_mask_invalid_param"),
    ("/v1/completions", {**COMPLETION, "temperature": True}, 400, "sampling_mask_invalid_param"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "sampling_mask_invalid_param"),
    ("/v1/chat/completions", {**CHAT, "min_p": 1.5}, 400, "sampling_mask_invalid_param"),
    ("/v1/chat/completions", {**CHAT, "top_k": -2}, 400, "sampling_mask_invalid_param"),
    ("/generate", batch(return_sampling_mask=[True, False]), 400, "sampling_mask_invalid_param"),
    (
        "/generate",
        batch(return_sampling_mask=True, sampling_params=[{"top_k": 5}, {"top_k": "5"}, {}]),
        400,
        "sampling_mask_invalid_param",
    ),
    # rule 4
    (
        "/v1/chat/completions",
        {**CHAT, "return_meta_info": False},
        400,
        "sampling_mask_requires_meta_info",
    ),
    (
        "/v1/completions",
        {k: v for k, v in COMPLETION.items() if k != "return_meta_info"},
        400,
        "sampling_mask_requires_meta_info",
    ),
    # rule 5
    ("/v1/chat/completions", {**CHAT, "stream": True}, 400, "sampling_mask_stream_unsupported"),
    ("/v1/completions", {**COMPLETION, "stream": True}, 400, "sampling_mask_stream_unsupported"),
    # rule 6
    ("/v1/chat/completions", {**CHAT, "lora_path": "a"}, 400, "sampling_mask_logit_transform"),
    ("/v1/completions", {**COMPLETION, "lora_id": "7"}, 400, "sampling_mask_logit_transform"),
    ("/v1/chat/completions", {**CHAT, "model": "m:a"}, 400, "sampling_mask_logit_transform"),
    ("/generate", {**GENERATE, "lora_path": "a"}, 400, "sampling_mask_logit_transform"),
    (
        "/v1/chat/completions",
        {**CHAT, "frequency_penalty": 0.5},
        400,
        "sampling_mask_logit_transform",
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "logit_bias": {"5": 1}},
        400,
        "sampling_mask_logit_transform",
    ),
    (
        "/generate",
        {**GENERATE, "sampling_params": {"top_k": 5, "regex": "a+"}},
        400,
        "sampling_mask_logit_transform",
    ),
    (
        "/generate",
        {**GENERATE, "custom_logit_processor": "x"},
        400,
        "sampling_mask_logit_transform",
    ),
    # rule 7 (0.99999999 is 1.0 in float32)
    (
        "/v1/chat/completions",
        {**CHAT, "top_k": -1, "top_p": 0.99999999},
        400,
        "sampling_mask_full_vocabulary",
    ),
    ("/v1/completions", {**COMPLETION, "top_k": 0}, 400, "sampling_mask_full_vocabulary"),
    ("/generate", {**GENERATE, "sampling_params": {}}, 400, "sampling_mask_full_vocabulary"),
    (
        "/generate",
        batch(
            return_sampling_mask=[False, True, False],
            sampling_params=[{"top_k": 5}, {"top_p": 1.0}, {"top_k": 5}],
        ),
        400,
        "sampling_mask_full_vocabulary",
    ),
    # top_k at the vocab size (1000, fetched from the mask endpoint) is the full vocabulary too
    ("/v1/chat/completions", {**CHAT, "top_k": 1000}, 400, "sampling_mask_full_vocabulary"),
    # rule 8
    (
        "/v1/chat/completions",
        {**CHAT, "top_k": 900, "top_p": 0.9},
        400,
        "sampling_mask_top_k_exceeds_cap",
    ),
    # rule 9
    (
        "/v1/completions",
        {**COMPLETION, "max_tokens": 0, "n": 1 << 20},
        400,
        "sampling_mask_payload_too_large",
    ),
    (
        "/generate",
        {
            **GENERATE,
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 30_000,
            "text": "x" * 3000,  # 3,000 prompt rows of 30,001 entries
        },
        400,
        "sampling_mask_payload_too_large",
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "n": 64, "max_tokens": 4000, "top_p": 0.9, "top_k": -1},
        400,
        "sampling_mask_payload_too_large",
    ),
    (
        "/generate",
        batch(return_sampling_mask=True, sampling_params={"top_k": 500, "max_new_tokens": 400}),
        400,
        "sampling_mask_payload_too_large",
    ),
]


@pytest.fixture
async def policy_gateway(upstreams, gateway, make_config):
    general = await upstreams(name="general")
    mask = await upstreams(name="mask", vocab_size=1000)
    config = make_config(
        [general.url],
        [mask.url],
        policy={"max_mask_tokens": 512, "max_mask_ids_per_request": 500_000},
        max_body_bytes=4096,
    )
    async with gateway(config) as gw:
        await wait_vocab(gw)
        yield gw, general, mask


async def wait_vocab(gw) -> None:
    import asyncio

    for _ in range(200):
        if gw.state.pools["mask"].vocab_size is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("vocab size never fetched")


@pytest.mark.parametrize(("path", "body", "status", "code"), CASES)
async def test_rule_rejects_with_status_and_code(policy_gateway, path, body, status, code):
    gw, general, mask = policy_gateway
    got_status, got, _ = await gw.post(path, body)
    assert (got_status, got["error"]["code"]) == (status, code), got
    assert got["error"]["type"] == "invalid_request_error"
    assert got["error"]["message"]
    assert general.requests == [] and mask.requests == []


async def test_body_too_large_is_413_on_every_pool(policy_gateway):
    gw, general, mask = policy_gateway
    big = {"model": "m", "prompt": "x" * 5000}
    for path, body in [
        ("/v1/completions", big),
        ("/generate", {**GENERATE, "pad": "x" * 5000}),
        ("/v1/embeddings", b"x" * 5000),  # a route without the mask policy
    ]:
        status, got, _ = await gw.post(path, body)
        assert (status, got["error"]["code"]) == (413, "body_too_large")
    assert general.requests == [] and mask.requests == []


async def test_general_requests_skip_the_mask_policy(policy_gateway):
    gw, general, mask = policy_gateway
    # Would break rules 3-9 if it asked for a mask; it does not, so it passes untouched.
    body = {
        "model": "m",
        "prompt": "x",
        "top_k": "20",
        "frequency_penalty": 2,
        "stream": False,
        "return_sampling_mask": False,
    }
    status, _, _ = await gw.post("/v1/completions", body)
    assert status == 200
    assert len(general.requests) == 1 and mask.requests == []


async def test_generate_batches_are_admitted_and_resolved_per_item(policy_gateway):
    gw, general, mask = policy_gateway
    body = batch(
        return_sampling_mask=[True, False, True],
        sampling_params=[
            {"top_k": 5, "max_new_tokens": 4},
            {"max_new_tokens": 4},
            {"top_p": 0.5, "temperature": 0.7, "max_new_tokens": 4},
        ],
    )
    status, got, _ = await gw.post("/generate", body)
    assert status == 200, got
    assert len(got) == 3 and "output_token_sampling_mask" in got[0]["meta_info"]
    sent = mask.requests[0].json()
    sp = sent["sampling_params"]
    assert sp[0] == {
        "top_k": 5,
        "max_new_tokens": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "min_p": 0.0,
    }
    assert sp[1] == {"max_new_tokens": 4}  # no mask asked: left as sent
    assert (sp[2]["temperature"], sp[2]["top_k"], sp[2]["top_p"]) == (0.7, -1, 0.5)
    # A shared sampling_params with one flag for the whole batch.
    status, _, _ = await gw.post(
        "/generate",
        batch(return_sampling_mask=True, sampling_params={"min_p": 0.1, "max_new_tokens": 4}),
    )
    assert status == 200
    assert mask.requests[1].json()["sampling_params"]["min_p"] == 0.1
    assert general.requests == []
