"""Serving through the real gateway and real workers: batches, streaming, abort on client
disconnect, continuous batching equivalence, and the workers' roles."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp
import orjson
import pytest

pytestmark = pytest.mark.e2e

MASKED = {"temperature": 0.9, "top_k": 8, "max_new_tokens": 6}


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        return r.status, await r.json()


async def sse_events(resp: aiohttp.ClientResponse) -> list[Any]:
    """All `data:` payloads of an SSE body, `[DONE]` included as the string."""
    events = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


async def metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} missing from {url}/metrics"
    return float(found.group(1))


async def test_generate_batch_of_mask_requests(cluster: Any) -> None:
    texts = ["Hello!", "The gateway sends", "Once upon a time"]
    body = {"text": texts, "sampling_params": MASKED, "return_sampling_mask": True}
    status, results = await post(cluster.gateway, "/generate", body)
    assert status == 200, results
    assert isinstance(results, list) and len(results) == 3
    for r in results:
        masks = r["meta_info"]["output_token_sampling_mask"]
        assert (
            len(masks)
            == len(r["output_ids"])
            == len(r["meta_info"]["output_token_sampling_logprobs"])
        )
        assert all(t in m and len(m) <= 8 for t, m in zip(r["output_ids"], masks, strict=True))


async def test_general_batches_and_n_choices_carry_no_masks(cluster: Any) -> None:
    body = {"model": "m", "prompt": ["a b", "c d"], "max_tokens": 4, "n": 2, "seed": 5}
    status, result = await post(cluster.gateway, "/v1/completions", body)
    assert status == 200, result
    assert [c["index"] for c in result["choices"]] == [0, 1, 2, 3]
    assert all("meta_info" not in c for c in result["choices"])
    assert result["usage"]["completion_tokens"] <= 16
    status, gen = await post(
        cluster.gateway, "/generate", {"text": ["x", "y"], "sampling_params": {"max_new_tokens": 3}}
    )
    assert status == 200 and len(gen) == 2
    assert all("output_token_sampling_mask" not in g["meta_info"] for g in gen)


async def test_generate_stream_is_cumulative_and_matches_the_seeded_result(
    cluster: Any,
) -> None:
    sp = {**MASKED, "sampling_seed": 1234}
    body = {"text": "Hello!", "sampling_params": sp, "return_sampling_mask": True}
    _, whole = await post(cluster.gateway, "/generate", body)
    async with aiohttp.ClientSession() as s:
        async with s.post(cluster.gateway + "/generate", json={**body, "stream": True}) as r:
            assert r.status == 200
            cumulative = await sse_events(r)
        incremental_body = {**body, "stream": True, "incremental_streaming_output": True}
        async with s.post(cluster.gateway + "/generate", json=incremental_body) as r:
            deltas = await sse_events(r)
    assert cumulative[-1] == "[DONE]" and deltas[-1] == "[DONE]"
    last = cumulative[-2]
    assert last["output_ids"] == whole["output_ids"]  # seeded: same draw in any batch
    assert (
        last["meta_info"]["output_token_sampling_mask"]
        == (whole["meta_info"]["output_token_sampling_mask"])
    )
    lengths = [len(c["output_ids"]) for c in cumulative[:-1]]
    assert lengths == sorted(lengths) and len(lengths) > 1
    joined_ids = [t for d in deltas[:-1] for t in d["output_ids"]]
    joined_masks = [m for d in deltas[:-1] for m in d["meta_info"]["output_token_sampling_mask"]]
    assert joined_ids == whole["output_ids"]
    assert joined_masks == whole["meta_info"]["output_token_sampling_mask"]
    assert "".join(d["text"] for d in deltas[:-1]) == whole["text"]


async def test_chat_stream_for_general_traffic(cluster: Any) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    _, whole = await post(cluster.gateway, "/v1/chat/completions", body)
    async with (
        aiohttp.ClientSession() as s,
        s.post(cluster.gateway + "/v1/chat/completions", json={**body, "stream": True}) as r,
    ):
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    usage = chunks[-1]["usage"]
    cached = usage.pop("prompt_tokens_details")["cached_tokens"]
    whole["usage"].pop("prompt_tokens_details")
    assert usage == whole["usage"]
    # The same prompt again: all of it but its last token comes from the prefix cache.
    assert cached == usage["prompt_tokens"] - 1


# A batch of long generations (several seconds on a CPU), so that an abort is what ends them.
LONG = {"max_new_tokens": 2000, "ignore_eos": True}  # e2e workers: max_model_len 2048
BATCH = ["go", "one", "two", "three"]


async def test_stream_abort_on_client_disconnect_frees_the_worker(cluster: Any) -> None:
    before = await metric(cluster.general, "maskgate_worker_generated_tokens_total")
    body = {"text": BATCH, "stream": True, "sampling_params": LONG}
    async with aiohttp.ClientSession() as s, s.post(cluster.gateway + "/generate", json=body) as r:
        assert r.status == 200
        seen = 0
        async for line in r.content:
            seen += line.startswith(b"data: ")
            if seen == 3:
                break  # leaving the block closes the connection mid-stream
    await _wait_idle(cluster.general)
    after = await metric(cluster.general, "maskgate_worker_generated_tokens_total")
    assert after - before < len(BATCH) * LONG["max_new_tokens"]  # aborted, not run out


async def test_non_stream_abort_on_client_disconnect(cluster: Any) -> None:
    before = await metric(cluster.general, "maskgate_worker_generated_tokens_total")
    body = {"text": BATCH, "sampling_params": LONG}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as s:
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(cluster.general + "/generate", json=body) as r:
                await r.read()
    await _wait_idle(cluster.general)
    after = await metric(cluster.general, "maskgate_worker_generated_tokens_total")
    assert after - before < len(BATCH) * LONG["max_new_tokens"]


async def _wait_idle(url: str) -> None:
    deadline = time.monotonic() + 20
    while await metric(url, "maskgate_worker_running_requests") != 0:
        assert time.monotonic() < deadline, "the aborted request still runs"
        await asyncio.sleep(0.1)


async def test_continuous_batching_gives_the_same_greedy_tokens(cluster: Any) -> None:
    prompts = [[1, 50 + i, 60 + 2 * i, 70] + [80 + i] * i for i in range(6)]

    def body(i: int) -> dict[str, Any]:
        sp = {"temperature": 0, "max_new_tokens": 10 + 3 * i, "ignore_eos": True}
        return {"input_ids": prompts[i], "sampling_params": sp}

    alone = [(await post(cluster.gateway, "/generate", body(i)))[1] for i in range(6)]
    together = await asyncio.gather(
        *(post(cluster.gateway, "/generate", body(i)) for i in range(6))
    )
    assert [r["output_ids"] for _, r in together] == [r["output_ids"] for r in alone]


async def test_roles_refuse_the_other_pools_traffic(cluster: Any) -> None:
    mask_body = {"text": "hi", "sampling_params": MASKED, "return_sampling_mask": True}
    status, err = await post(cluster.general, "/generate", mask_body)
    assert (status, err["error"]["code"]) == (400, "sampling_mask_not_served")
    status, err = await post(cluster.mask, "/generate", {"text": "hi"})
    assert (status, err["error"]["code"]) == (400, "sampling_mask_required")
    # The worker applies the gateway's policy to direct calls, with the same codes.
    full = {"text": "hi", "sampling_params": {"temperature": 1.0}, "return_sampling_mask": True}
    status, err = await post(cluster.mask, "/generate", full)
    assert (status, err["error"]["code"]) == (400, "sampling_mask_full_vocabulary")
    async with aiohttp.ClientSession() as s, s.get(cluster.mask + "/get_model_info") as r:
        info = await r.json()
    assert info["vocab_size"] == 512 and info["role"] == "mask"
