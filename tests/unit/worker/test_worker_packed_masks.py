"""`sampling_mask_format` on the worker (tiny-random model, in-process): the same seeded
request answers the same masks as lists and as packed, on every route, streamed and not."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp.test_utils import TestClient

from examples.unpack_masks import dense, unpack
from maskgate.worker.config import WorkerConfig
from tests.mask_formats import masks_of, sse_events
from tests.unit.worker.worker_calls import post_ok as post

CONFIG = WorkerConfig(model="tiny-random", device="cpu", max_model_len=64, max_num_seqs=8)
SAMPLING = {"temperature": 1.0, "top_p": 0.9, "top_k": 40, "sampling_seed": 7}
GEN = {**SAMPLING, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


def generate(fmt: Any, **extra: Any) -> dict[str, Any]:
    body = {"text": "hello", "sampling_params": GEN, "return_sampling_mask": True, **extra}
    if fmt is not None:
        body["sampling_mask_format"] = fmt
    return body


async def test_generate_single_lists_and_packed_carry_the_same_masks(client: TestClient) -> None:
    lists = await post(client, "/generate", generate(None))
    packed = await post(client, "/generate", generate("packed"))
    assert packed["output_ids"] == lists["output_ids"]
    got, want = masks_of(packed["meta_info"]), masks_of(lists["meta_info"])
    assert got == want and len(got) == 6
    assert all(t in m for t, m in zip(packed["output_ids"], got, strict=True))
    meta = packed["meta_info"]
    # to float32 rounding: the second request's prompt comes from the prefix cache
    want_lp = lists["meta_info"]["output_token_sampling_logprobs"]
    assert meta["output_token_sampling_logprobs"] == pytest.approx(want_lp, abs=2e-5)
    assert meta["output_token_sampling_mask_length"] == 6
    # The example's NumPy lines: a boolean [T, vocab] mask.
    ids, offsets = unpack(meta)
    table = dense(ids, offsets, 512)
    assert [sorted(np.flatnonzero(row).tolist()) for row in table] == want


async def test_generate_batch_formats_per_item_or_shared(client: TestClient) -> None:
    body = generate(["lists", "packed"], text=["hello", "hello"])
    one, two = await post(client, "/generate", body)
    assert "output_token_sampling_mask" in one["meta_info"]
    assert "output_token_sampling_mask_ids" in two["meta_info"]
    shared = await post(client, "/generate", generate("packed", text=["hello", "hi"]))
    lists = await post(client, "/generate", generate("lists", text=["hello", "hi"]))
    for p, q in zip(shared, lists, strict=True):
        assert masks_of(p["meta_info"]) == masks_of(q["meta_info"])


async def test_generate_stream_chunks_carry_their_own_packed_segment(client: TestClient) -> None:
    async def stream(fmt: str) -> list[list[int]]:
        body = generate(fmt, stream=True, incremental_streaming_output=True)
        r = await client.post("/generate", json=body)
        assert r.status == 200
        masks: list[list[int]] = []
        for ev in sse_events(await r.read()):
            meta = ev["meta_info"]
            seg = masks_of(meta)
            assert len(seg) == len(ev["output_ids"]) == meta["output_token_sampling_mask_length"]
            masks += seg
        return masks

    packed, lists = await stream("packed"), await stream("lists")
    assert packed == lists and len(packed) == 6


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_openai_routes_lists_and_packed(client: TestClient, route: str) -> None:
    body: dict[str, Any] = {
        "max_tokens": 5,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 3,
        "n": 2,
        "return_sampling_mask": True,
        "return_meta_info": True,
        "return_token_ids": True,
    }
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    lists = await post(client, route, body)
    packed = await post(client, route, {**body, "sampling_mask_format": "packed"})
    for p, q in zip(packed["choices"], lists["choices"], strict=True):
        assert p["token_ids"] == q["token_ids"]
        assert masks_of(p["meta_info"]) == masks_of(q["meta_info"])
        assert "output_token_sampling_mask_offsets" in p["meta_info"]


@pytest.mark.parametrize(
    ("fmt", "extra"),
    [
        ("dense", {}),
        (["packed"], {}),
        (["packed"], {"text": ["a", "b"]}),
        (1, {}),
        ("x" * 5000, {"return_sampling_mask": False}),  # not a mask request: refused too
    ],
)
async def test_invalid_format_is_refused(client: TestClient, fmt: Any, extra: Any) -> None:
    r = await client.post("/generate", json=generate(fmt, **extra))
    assert r.status == 400
    err = orjson.loads(await r.read())["error"]
    assert err["code"] == "sampling_mask_invalid_param"
    assert err["param"].startswith("sampling_mask_format")
    assert len(err["message"]) < 200  # the value is not echoed whole
