"""Masks through the real gateway and a real mask worker (tiny-random, CPU), checked against
an independent forward pass: transformers' Llama over the same weights, with
docs/design.md's mask semantics applied below in float64."""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import aiohttp
import pytest
import torch

pytestmark = pytest.mark.e2e

PROMPT = [1, 40, 41, 42, 43, 44, 45, 46]  # token ids; any ids of the 512-id vocabulary


def f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def design3(
    x: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[list[int], torch.Tensor]:
    """x: [V] float32 logits of one step -> (S in mask order, z as float64 over [V])."""
    z = (x.float() / torch.tensor(temperature, dtype=torch.float32)).double()  # float32 divide
    vocab = z.numel()
    # z descending, then id ascending: a stable sort of -z over ids already ascending.
    order = torch.sort(-z, stable=True).indices
    keep = order
    if 0 < top_k < vocab:
        keep = keep[:top_k]
    if f32(top_p) < 1:
        p = torch.softmax(z[keep], dim=0)
        before = torch.cumsum(p, dim=0) - p
        keep = keep[before < f32(top_p)]
    if min_p > 0:
        keep = keep[torch.exp(z[keep] - z.max()) >= min_p]
    return keep.tolist(), z


def step_logits(oracle: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), V] float32: the logits each output token was sampled from."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = oracle(ids).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]


async def generate(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
        return r.status, await r.json()


def check_masks(
    result: dict[str, Any], oracle: Any, prompt: list[int], params: dict[str, Any]
) -> None:
    """One mask and one log-prob per token, the token inside its mask, and both equal to
    what the mask semantics give over the oracle's logits."""
    ids = result["output_ids"]
    meta = result["meta_info"]
    masks = meta["output_token_sampling_mask"]
    logprobs = meta["output_token_sampling_logprobs"]
    assert len(ids) > 0
    assert len(masks) == len(logprobs) == len(ids) == meta["output_token_sampling_mask_length"]
    t, k = params.get("temperature", 1.0), params.get("top_k", -1)
    p, m = params.get("top_p", 1.0), params.get("min_p", 0.0)
    for step, (x, y, mask, lp) in enumerate(
        zip(step_logits(oracle, prompt, ids), ids, masks, logprobs, strict=True)
    ):
        assert y in mask, f"step {step}: token {y} outside its mask"
        support, z = design3(x, t, k, p, m)
        assert mask == support, f"step {step}: mask differs from the mask semantics over the oracle"
        expected = float(z[y] - torch.logsumexp(z[support], dim=0))
        assert lp == pytest.approx(expected, abs=1e-4), f"step {step}"
        assert lp <= 0.0


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.8, "top_k": 20, "top_p": 0.9},
        {"temperature": 1.0, "top_p": 0.5},  # top-p only
        {"temperature": 1.3, "top_k": 16, "min_p": 0.05},
    ],
    ids=["topk-topp", "topp-only", "topk-minp"],
)
async def test_masks_and_logprobs_match_an_independent_forward_pass(
    cluster: Any, oracle: Any, params: dict[str, Any]
) -> None:
    sp = {**params, "max_new_tokens": 12, "sampling_seed": 7}
    status, result = await generate(
        cluster.gateway, {"input_ids": PROMPT, "sampling_params": sp, "return_sampling_mask": True}
    )
    assert status == 200, result
    check_masks(result, oracle, PROMPT, params)


async def test_greedy_masks_are_singletons_with_logprob_zero(cluster: Any, oracle: Any) -> None:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
        "return_sampling_mask": True,
    }
    status, result = await generate(cluster.gateway, body)
    assert status == 200, result
    meta = result["meta_info"]
    assert meta["output_token_sampling_mask"] == [[t] for t in result["output_ids"]]
    assert meta["output_token_sampling_logprobs"] == [0.0] * 10
    argmax = step_logits(oracle, PROMPT, result["output_ids"]).argmax(dim=-1).tolist()
    assert result["output_ids"] == argmax


async def test_top_p_only_chat_through_the_openai_sdk(cluster: Any) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=cluster.gateway + "/v1", api_key="unused")
    r = await client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=6,
        top_p=0.3,
        seed=3,
        extra_body={
            "return_sampling_mask": True,
            "return_meta_info": True,
            "return_token_ids": True,
        },
    )
    choice = r.choices[0].model_dump()
    meta = choice["meta_info"]
    assert len(meta["output_token_sampling_mask"]) == len(choice["token_ids"])
    assert r.usage is not None and r.usage.completion_tokens == len(choice["token_ids"])
    for token, mask in zip(choice["token_ids"], meta["output_token_sampling_mask"], strict=True):
        assert token in mask and len(mask) <= cluster.mask_cap
    await client.close()


WIDE = {"temperature": 3.0, "top_p": 0.99, "max_new_tokens": 4, "sampling_seed": 11}


async def test_exact_mode_overflow_answers_400_naming_the_sizes(cluster: Any) -> None:
    body = {"input_ids": PROMPT, "sampling_params": WIDE, "return_sampling_mask": True}
    status, result = await generate(cluster.gateway, body)
    assert status == 400, result
    err = result["error"]
    assert err["code"] == "sampling_mask_overflow"
    assert f"C={cluster.mask_cap}" in err["message"] and "|S|=" in err["message"]
    assert "bounded" in err["message"]


async def test_bounded_mode_truncates_and_flags_with_logprob_over_full_support(
    cluster: Any, oracle: Any
) -> None:
    body = {
        "input_ids": PROMPT,
        "sampling_params": WIDE,
        "return_sampling_mask": True,
        "sampling_mask_mode": "bounded",
    }
    status, result = await generate(cluster.gateway, body)
    assert status == 200, result
    ids, meta = result["output_ids"], result["meta_info"]
    flags = meta["output_token_sampling_mask_truncated"]
    assert len(flags) == len(ids) == len(meta["output_token_sampling_mask"])
    for x, y, mask, lp, flag in zip(
        step_logits(oracle, PROMPT, ids),
        ids,
        meta["output_token_sampling_mask"],
        meta["output_token_sampling_logprobs"],
        flags,
        strict=True,
    ):
        support, z = design3(x, 3.0, -1, 0.99, 0.0)
        assert len(support) > cluster.mask_cap and flag is True
        assert len(mask) == cluster.mask_cap and y in mask
        head = support[: cluster.mask_cap]
        expected_mask = head if y in head else [*head[:-1], y]
        assert mask == expected_mask
        full = float(z[y] - torch.logsumexp(z[support], dim=0))
        assert lp == pytest.approx(full, abs=1e-4)
        assert math.isfinite(lp)


async def test_the_gateway_parses_the_workers_masks_without_violations(cluster: Any) -> None:
    # Runs after the tests above in this file: the gateway has parsed their mask responses.
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": 0.9, "top_k": 12, "max_new_tokens": 6},
        "return_sampling_mask": True,
    }
    status, _ = await generate(cluster.gateway, body)
    assert status == 200
    async with aiohttp.ClientSession() as s, s.get(cluster.gateway + "/metrics") as r:
        text = await r.text()
    count = re.search(r'^maskgate_mask_support_size_count\{pool="mask"\} (\S+)$', text, re.M)
    assert count is not None and float(count.group(1)) >= 6
    violations = re.findall(r"^maskgate_mask_invariant_violations_total\{.*\} (\S+)$", text, re.M)
    assert all(float(v) == 0 for v in violations), violations
