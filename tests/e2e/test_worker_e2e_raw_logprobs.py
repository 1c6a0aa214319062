"""Raw-distribution log-probs (return_logprob, OpenAI logprobs) from real worker processes,
checked against an independent forward pass: transformers' model over the same weights, its
float32 logits scaled in float32 (the worker's division) and normalised in float64."""

from __future__ import annotations

import struct
from typing import Any

import aiohttp
import orjson
import pytest
import torch

pytestmark = pytest.mark.e2e

PROMPT = [1, 40, 41, 42, 43, 44, 45, 46]  # token ids of the 512-id tiny-random vocabulary
TOL = 1e-4


def f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def oracle_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] float32 logits at every position."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def raw_logprobs(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(x / T) in float64 over the float32 quotient; T = 1 for greedy rows."""
    t = temperature if temperature >= 1e-6 else 1.0
    return torch.log_softmax((x / torch.tensor(f32(t), dtype=torch.float32)).double(), dim=-1)


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        return r.status, await r.json()


def check_generate(result: dict[str, Any], model: Any, prompt: list[int], t: float) -> None:
    """output_token_logprobs, output_top_logprobs (3), input_token_logprobs and
    input_top_logprobs (logprob_start_len 0) against the oracle, in SGLang's layout."""
    ids, meta = result["output_ids"], result["meta_info"]
    assert ids and meta["output_token_logprobs_length"] == len(ids)
    x = oracle_logits(model, prompt + ids)
    out_lp = raw_logprobs(x[len(prompt) - 1 : -1], t)  # the rows each output token came from
    assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == len(ids)
    for step, (triple, top, y) in enumerate(
        zip(meta["output_token_logprobs"], meta["output_top_logprobs"], ids, strict=True)
    ):
        lp, tid, text = triple
        assert tid == y and text is None
        assert lp == pytest.approx(float(out_lp[step, y]), abs=TOL), f"step {step}"
        want = torch.topk(out_lp[step], 3)
        assert [e[1] for e in top] == want.indices.tolist(), f"step {step}"
        assert [e[0] for e in top] == pytest.approx(want.values.tolist(), abs=TOL)
    # Prompt tokens: log_softmax at T = 1 (SGLang's input log-probs); the first has none.
    in_lp = torch.log_softmax(x[: len(prompt) - 1].double(), dim=-1)
    inputs, in_top = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert [e[1] for e in inputs] == prompt and inputs[0][0] is None
    assert in_top[0] is None and len(in_top) == len(prompt)
    for p in range(1, len(prompt)):
        assert inputs[p][0] == pytest.approx(float(in_lp[p - 1, prompt[p]]), abs=TOL)
        assert [e[1] for e in in_top[p]] == torch.topk(in_lp[p - 1], 3).indices.tolist()


LOGPROBS = {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}


@pytest.mark.parametrize(
    ("params", "masked"),
    [
        ({"temperature": 0}, False),
        ({"temperature": 0.8, "sampling_seed": 3}, False),
        ({"temperature": 1.0, "top_p": 0.7, "sampling_seed": 5}, False),
        ({"temperature": 0.8, "top_k": 20, "top_p": 0.9, "sampling_seed": 7}, True),
        ({"temperature": 0}, True),
    ],
    ids=["greedy", "sampled", "top-p", "masked-topk-topp", "masked-greedy"],
)
async def test_generate_raw_logprobs_match_float64(
    cluster: Any, oracle: Any, params: dict[str, Any], masked: bool
) -> None:
    sp = {**params, "max_new_tokens": 10, "ignore_eos": True}
    body = {"input_ids": PROMPT, "sampling_params": sp, **LOGPROBS}
    if masked:
        body["return_sampling_mask"] = True
    # Through the gateway: it routes mask requests to the mask worker, others to the general.
    status, result = await post(cluster.gateway, "/generate", body)
    assert status == 200, result
    check_generate(result, oracle, PROMPT, params["temperature"])
    if masked:  # the mask log-prob renormalises over the support: never below the raw one
        meta = result["meta_info"]
        for mask_lp, (raw, _, _) in zip(
            meta["output_token_sampling_logprobs"], meta["output_token_logprobs"], strict=True
        ):
            assert mask_lp >= raw - 1e-6


async def test_generate_defaults_text_batches_and_scoring(cluster: Any, oracle: Any) -> None:
    # Output only (logprob_start_len -1), no top: SGLang's empty input list, no top keys.
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 3}}
    status, r = await post(cluster.general, "/generate", {**body, "return_logprob": True})
    assert status == 200, r
    meta = r["meta_info"]
    assert meta["input_token_logprobs"] == [] and len(meta["output_token_logprobs"]) == 3
    assert "output_top_logprobs" not in meta and "input_top_logprobs" not in meta
    # Asking nothing adds nothing.
    _, plain = await post(cluster.general, "/generate", body)
    assert "output_token_logprobs" not in plain["meta_info"]
    assert plain["output_ids"] == r["output_ids"]
    # A batch with per-prompt options, text in the triples, and logprob_start_len 3.
    batch = {
        "input_ids": [PROMPT, PROMPT[:4]],
        "sampling_params": {"temperature": 0, "max_new_tokens": 2},
        "return_logprob": [True, False],
        "logprob_start_len": [3, -1],
        "return_text_in_logprobs": True,
    }
    status, (a, b) = await post(cluster.general, "/generate", batch)
    assert status == 200
    inputs = a["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in inputs] == PROMPT[3:] and inputs[0][0] is None
    assert all(isinstance(e[2], str) for e in inputs + a["meta_info"]["output_token_logprobs"])
    assert "output_token_logprobs" not in b["meta_info"]
    # Scoring a prompt: max_new_tokens 0 with logprob_start_len 0 returns its log-probs.
    score = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 0}, **LOGPROBS}
    status, s = await post(cluster.general, "/generate", score)
    assert status == 200 and s["output_ids"] == []
    in_lp = torch.log_softmax(oracle_logits(oracle, PROMPT).double(), dim=-1)
    got = [e[0] for e in s["meta_info"]["input_token_logprobs"][1:]]
    want = [float(in_lp[p - 1, PROMPT[p]]) for p in range(1, len(PROMPT))]
    assert got == pytest.approx(want, abs=TOL)


async def sse_chunks(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    """The JSON events of an SSE answer (without the final [DONE])."""
    chunks = []
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                chunks.append(orjson.loads(line[6:]))
    return chunks


async def test_generate_stream_carries_logprobs(cluster: Any) -> None:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 5},
        "stream": True,
        "incremental_streaming_output": True,
        **LOGPROBS,
    }
    chunks = await sse_chunks(cluster.general, "/generate", body)
    _, whole = await post(cluster.general, "/generate", {**body, "stream": False})
    joined = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert joined == whole["meta_info"]["output_token_logprobs"]
    assert (
        chunks[0]["meta_info"]["input_token_logprobs"] == whole["meta_info"]["input_token_logprobs"]
    )


async def test_openai_logprobs_shapes_and_values(cluster: Any, oracle: Any) -> None:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 6, "temperature": 0.9, "seed": 11}
    status, r = await post(cluster.general, "/v1/completions", {**body, "logprobs": 2})
    assert status == 200, r
    choice = r["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = len(lp["tokens"])
    assert n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert n == r["usage"]["completion_tokens"] and lp["text_offset"][0] == 0
    assert all(isinstance(t, dict) and 1 <= len(t) <= 2 for t in lp["top_logprobs"])
    # The values: the same seeded request with return_token_ids gives the ids.
    _, again = await post(
        cluster.general, "/v1/completions", {**body, "logprobs": 2, "return_token_ids": True}
    )
    ids = again["choices"][0]["token_ids"]
    x = oracle_logits(oracle, PROMPT + ids)
    want = raw_logprobs(x[len(PROMPT) - 1 : -1], 0.9)
    got = again["choices"][0]["logprobs"]["token_logprobs"]
    assert got == pytest.approx([float(want[i, y]) for i, y in enumerate(ids)], abs=TOL)

    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    status, c = await post(cluster.general, "/v1/chat/completions", chat)
    assert status == 200, c
    content = c["choices"][0]["logprobs"]["content"]
    assert len(content) == c["usage"]["completion_tokens"]
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert e["bytes"] == list(e["token"].encode()) and e["logprob"] <= 0
        assert len(e["top_logprobs"]) == 2
        # Greedy: the token is the most likely one.
        assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"], abs=1e-6)
    # A stream carries each new token's entries; joined, they are the whole answer's. The
    # prompt is computed afresh, as the first time: a prefix cache hit computes its last
    # token in a one-token row, which rounds log-probs differently (docs/worker.md).
    async with aiohttp.ClientSession() as s, s.post(cluster.general + "/flush_cache") as r:
        assert r.status == 200
    streamed = await sse_chunks(cluster.general, "/v1/chat/completions", {**chat, "stream": True})
    joined = [
        e
        for ch in streamed
        for c in ch["choices"]
        if c.get("logprobs")
        for e in c["logprobs"]["content"]
    ]
    assert joined == content
    status, err = await post(cluster.general, "/v1/chat/completions", {**chat, "logprobs": 1})
    assert status == 400 and err["error"]["code"] == "invalid_parameter"
    assert err["error"]["param"] == "logprobs"


async def test_smollm2_raw_logprobs_match_float64(smollm2_worker: str) -> None:
    from transformers import AutoModelForCausalLM

    from maskgate.worker.model.gguf_convert import ensure_smollm2

    model = AutoModelForCausalLM.from_pretrained(ensure_smollm2(), dtype=torch.float32).eval()
    prompt = [1, 504, 3458, 282, 4649, 314, 260]
    for params in ({"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "sampling_seed": 2}):
        sp = {**params, "max_new_tokens": 8, "ignore_eos": True}
        status, r = await post(
            smollm2_worker, "/generate", {"input_ids": prompt, "sampling_params": sp, **LOGPROBS}
        )
        assert status == 200, r
        check_generate(r, model, prompt, params["temperature"])
