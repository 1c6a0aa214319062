"""Large bodies and large mask batches are checked in a worker process, with the same answers
as on the event loop (bodycheck.py)."""

from __future__ import annotations

import pickle
from typing import Any

import orjson
import pytest

from maskgate.gateway.config import OffloadConfig
from maskgate.gateway.proxy.bodycheck import BodyChecker, BodyJob, check_body
from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import PolicyConfig, Route

pytestmark = pytest.mark.integration


def mask_batch(items: int, **sp: Any) -> dict[str, Any]:
    return {
        "text": ["a"] * items,
        "return_sampling_mask": True,
        "sampling_params": {"top_k": 3, "max_new_tokens": 2, **sp},
    }


def test_api_errors_cross_process_boundaries_whole():
    err = PolicyError("sampling_mask_batch_too_large", "m", status=413, param="text")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.code, back.status, back.param) == (
        PolicyError,
        "sampling_mask_batch_too_large",
        413,
        "text",
    )


@pytest.mark.parametrize(
    ("body", "mask", "code"),
    [
        (mask_batch(300), True, None),
        (mask_batch(300, top_k=-1), True, "sampling_mask_full_vocabulary"),
        (mask_batch(5000), True, "sampling_mask_batch_too_large"),
        ({"text": ["a"] * 300}, False, None),
    ],
)
async def test_offloaded_and_inline_checks_agree(body, mask, code):
    job = BodyJob(Route.GENERATE, 1 << 23, PolicyConfig(), None, "rid-1", None, None)
    raw = orjson.dumps(body)
    inline = check_body(job, raw)
    checker = BodyChecker(OffloadConfig(min_bytes=0, workers=1))
    try:
        offloaded = await checker.check(job, raw)
    finally:
        checker.close()
    for got in (inline, offloaded):
        assert got.mask is mask
        assert (got.error.code if got.error else None) == code
    assert inline.raw == offloaded.raw
    if mask and code is None:
        assert orjson.loads(offloaded.raw)["rid"] == "rid-1"
    if not mask:
        assert offloaded.raw == raw  # general bytes untouched


async def test_large_mask_batches_go_through_a_worker_process(upstreams, gateway, make_config):
    mask = await upstreams()
    config = make_config([], [mask.url], offload={"min_items": 8, "min_bytes": 4096})
    async with gateway(config) as gw:
        status, _, _ = await gw.post("/generate", mask_batch(9))  # by items
        assert status == 200
        status, body, _ = await gw.post("/generate", mask_batch(9, top_k=-1))
        assert (status, body["error"]["code"]) == (400, "sampling_mask_full_vocabulary")
        big = {"text": "x" * 5000, "return_sampling_mask": True, "sampling_params": {"top_k": 2}}
        status, _, _ = await gw.post("/generate", big)  # by size
        assert status == 200
        status, body, _ = await gw.post("/generate", b"{" + b" " * 5000)
        assert (status, body["error"]["code"]) == (400, "invalid_json")
        status, _, _ = await gw.post("/generate", mask_batch(2))  # small: on the loop
        assert status == 200
        text = await gw.metrics()
    assert "maskgate_policy_offloads_total 4.0" in text
    assert 'maskgate_requests_total{pool="mask",route="generate",status="400"} 1.0' in text
    assert len(mask.requests) == 3
