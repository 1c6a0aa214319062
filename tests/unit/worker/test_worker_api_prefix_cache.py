"""The prefix cache through the worker's HTTP surface: `cached_tokens` in meta_info and in
OpenAI usage, /flush_cache emptying it, and `disable_radix_cache` turning it off."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from maskgate.worker.config import WorkerConfig
from maskgate.worker.server import create_app
from maskgate.worker.server.backend import Backend
from tests.unit.worker.test_worker_weight_control import payload
from tests.unit.worker.worker_calls import post_ok as post

CONFIG = WorkerConfig(model="tiny-random", device="cpu", max_model_len=96, max_num_seqs=4)
PROMPT = [(i * 13) % 400 + 5 for i in range(40)]
SP = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 4, "sampling_seed": 5, "n": 3}


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


async def test_generate_reports_cached_tokens_and_flush_empties_the_cache(
    client: TestClient,
) -> None:
    body = {"input_ids": PROMPT, "sampling_params": SP, "return_sampling_mask": True}
    first = await post(client, "/generate", body)
    # One choice prefills the prompt; the other two copy all of it but the last token.
    assert sorted(r["meta_info"]["cached_tokens"] for r in first) == [0, 39, 39]
    again = await post(client, "/generate", body)
    assert [r["meta_info"]["cached_tokens"] for r in again] == [39, 39, 39]
    # Same seeded samples and masks (log-probs agree to rounding: test_worker_prefix_cache_model).
    for a, b in zip(first, again, strict=True):
        assert a["output_ids"] == b["output_ids"]
        mask = "output_token_sampling_mask"
        assert a["meta_info"][mask] == b["meta_info"][mask]
    r = await client.post("/flush_cache")
    assert r.status == 200
    flushed = await post(client, "/generate", body)
    assert sorted(r["meta_info"]["cached_tokens"] for r in flushed) == [0, 39, 39]


async def test_openai_usage_counts_each_prompt_once(client: TestClient) -> None:
    await client.post("/flush_cache")
    body = {"prompt": [PROMPT, PROMPT[::-1]], "max_tokens": 3, "n": 2, "seed": 3}
    first = await post(client, "/v1/completions", body)
    assert first["usage"]["prompt_tokens"] == 80
    # Each prompt was computed once for its two choices: nothing of it came from a cache.
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    again = await post(client, "/v1/completions", body)
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 2 * 39}
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in first["choices"]]


async def test_disable_radix_cache_turns_it_off(backend: Backend) -> None:
    cfg = CONFIG.model_copy(update={"disable_radix_cache": True})
    async with TestClient(TestServer(create_app(cfg, backend=backend))) as client:
        body = {"input_ids": PROMPT, "sampling_params": SP}
        for _ in range(2):
            out = await post(client, "/generate", body)
            assert [r["meta_info"]["cached_tokens"] for r in out] == [0, 0, 0]


async def cached(client: TestClient) -> list[int]:
    out = await post(client, "/generate", {"input_ids": PROMPT, "sampling_params": SP})
    return sorted(r["meta_info"]["cached_tokens"] for r in out)


async def test_weight_updates_and_released_kv_memory_empty_the_cache(
    client: TestClient, backend: Backend
) -> None:
    await cached(client)
    assert await cached(client) == [39, 39, 39]
    head = backend.runner.model.lm_head.weight  # type: ignore[attr-defined]
    body = {"serialized_named_tensors": [payload([("lm_head.weight", head.detach().clone())])]}
    assert (await post(client, "/update_weights_from_tensor", body))["success"]
    assert await cached(client) == [0, 39, 39]
    r = await client.post("/release_memory_occupation", json={"tags": ["kv_cache"]})
    assert r.status == 200
    r = await client.post("/resume_memory_occupation", json={"tags": ["kv_cache"]})
    assert r.status == 200
    assert await cached(client) == [0, 39, 39]
