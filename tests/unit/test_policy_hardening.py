"""Classes of policy holes: every multiplier in the payload bound, tool calling as a
logit transform, float32 full-vocabulary and range checks, and the batch-item cap."""

from __future__ import annotations

import time

import pytest

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import float32
from maskgate.protocol.policy import PolicyConfig, Route, check_mask_request
from tests.fakes.bodies import chat_body as chat
from tests.fakes.bodies import completion_body as completion

CFG = PolicyConfig()


def reject(route, body, *, cfg=CFG, vocab_size=None) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        check_mask_request(route, body, cfg, vocab_size=vocab_size)
    return info.value


# --- the payload bound counts prompts x choices x tokens x ids per token -----------------


@pytest.mark.parametrize(
    ("fields", "answers"),
    [
        ({"prompt": "one"}, 1),
        ({"prompt": [1, 2, 3]}, 1),  # one prompt as token ids
        ({"prompt": ["a", "b", "c"]}, 3),
        ({"prompt": [[1], [2], [3], [4]]}, 4),  # four prompts as token ids
        ({"prompt": ["a", "b"], "n": 3}, 6),
        ({"prompt": "a", "n": 2, "best_of": 5}, 5),
    ],
)
def test_completions_payload_counts_prompts_and_choices(fields, answers):
    per_answer = 10 * 100  # top_k * max_tokens
    check_mask_request(
        Route.COMPLETIONS,
        completion(**fields),
        PolicyConfig(max_mask_ids_per_request=answers * per_answer),
    )
    err = reject(
        Route.COMPLETIONS,
        completion(**fields),
        cfg=PolicyConfig(max_mask_ids_per_request=answers * per_answer - 1),
    )
    assert (err.status, err.code) == (400, "sampling_mask_payload_too_large")


def test_the_reported_completions_list_is_refused():
    body = completion(prompt=["x"] * 1000, top_k=4096, max_tokens=16384)
    assert reject(Route.COMPLETIONS, body).code == "sampling_mask_payload_too_large"


@pytest.mark.parametrize("shared", [True, False])
def test_generate_payload_counts_items_n_and_tokens(shared):
    sp = {"top_k": 10, "max_new_tokens": 100, "n": 2}
    body = {
        "text": ["a", "b", "c"],
        "return_sampling_mask": True,
        "sampling_params": sp if shared else [dict(sp) for _ in range(3)],
    }
    check_mask_request(Route.GENERATE, body, PolicyConfig(max_mask_ids_per_request=6000))
    err = reject(Route.GENERATE, body, cfg=PolicyConfig(max_mask_ids_per_request=5999))
    assert err.code == "sampling_mask_payload_too_large"
    # Items that ask for no mask add nothing.
    body["return_sampling_mask"] = [True, False, False]
    check_mask_request(Route.GENERATE, body, PolicyConfig(max_mask_ids_per_request=2000))


def test_generate_unset_max_new_tokens_counts_the_default():
    body = {"text": ["a", "b"], "return_sampling_mask": True, "sampling_params": {"top_k": 1}}
    cfg = PolicyConfig(max_mask_ids_per_request=2 * 2048, default_max_tokens=2048)
    check_mask_request(Route.GENERATE, body, cfg)
    cfg = PolicyConfig(max_mask_ids_per_request=2 * 2048 - 1, default_max_tokens=2048)
    assert reject(Route.GENERATE, body, cfg=cfg).code == "sampling_mask_payload_too_large"


# --- the batch-item cap -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (Route.GENERATE, {"text": ["a"] * 9, "sampling_params": {"top_k": 1}}),
        (Route.GENERATE, {"input_ids": [[1]] * 9, "sampling_params": {"top_k": 1}}),
        (Route.GENERATE, {"input_embeds": [[[0.0]]] * 9, "sampling_params": {"top_k": 1}}),
        (Route.COMPLETIONS, completion(prompt=["a"] * 9)),
        (Route.COMPLETIONS, completion(prompt=[[1]] * 9)),
    ],
)
def test_batch_item_cap(route, body):
    body = {**body, "return_sampling_mask": True}
    cfg = PolicyConfig(max_batch_items=9)
    check_mask_request(route, body, cfg)
    err = reject(route, body, cfg=PolicyConfig(max_batch_items=8))
    assert (err.status, err.code) == (413, "sampling_mask_batch_too_large")
    assert "max_batch_items=8" in err.message


def test_shared_params_batch_checks_in_constant_time_per_item():
    """A batch at the cap is checked well within the 50 ms a request may hold the loop (a
    coarse sanity bound; bench/gateway_policy_cost.py measures it)."""
    body = {"text": ["a"] * 4096, "return_sampling_mask": True, "sampling_params": {"top_k": 5}}
    t0 = time.perf_counter()
    out = check_mask_request(Route.GENERATE, body, CFG)
    assert time.perf_counter() - t0 < 1.0
    assert out["sampling_params"]["top_k"] == 5


# --- tool calling constrains decoding ---------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": TOOLS},  # tool_choice defaults to "auto"
        {"tools": TOOLS, "tool_choice": "auto"},
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"functions": [TOOLS[0]["function"]], "function_call": {"name": "f"}},
    ],
)
def test_tool_calling_is_a_logit_transform(fields):
    err = reject(Route.CHAT, chat(**fields))
    assert (err.status, err.code) == (400, "sampling_mask_logit_transform")
    assert err.param in ("tool_choice", "function_call")


def test_tools_with_tool_choice_none_or_no_tools_are_admitted():
    check_mask_request(Route.CHAT, chat(tools=TOOLS, tool_choice="none"), CFG)
    check_mask_request(Route.CHAT, chat(tools=[], tool_choice="required"), CFG)
    check_mask_request(Route.CHAT, chat(tool_choice="auto"), CFG)
    cfg = PolicyConfig(reject_logit_transforms=False)
    check_mask_request(Route.CHAT, chat(tools=TOOLS, tool_choice="required"), cfg)


# --- float32: what the worker samples with ----------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"min_p": 1e-46},  # 0 in float32: min-p is off
        {"min_p": 1e-46, "temperature": 2e-6},
        {"top_p": 0.99999999, "min_p": 1e-46},
    ],
)
def test_full_vocabulary_in_float32(fields):
    body = chat(top_k=..., **fields)
    err = reject(Route.CHAT, body)
    assert err.code == "sampling_mask_full_vocabulary"


@pytest.mark.parametrize(
    "fields",
    [
        {"min_p": 1e-45},  # the smallest float32 above 0: min-p is on
        {"temperature": 9.99e-7},  # greedy in the worker
        {"temperature": 1e-6},  # float32(1e-6) is just below the greedy threshold 1e-6
        {"temperature": 1e-46},  # 0 in float32: greedy
        {"temperature": 0},
    ],
)
def test_not_full_vocabulary_in_float32(fields):
    check_mask_request(Route.CHAT, chat(top_k=..., **fields), CFG)


@pytest.mark.parametrize(
    ("name", "value"),
    [("top_p", 1e-46), ("top_p", 1e-50), ("temperature", 1e39), ("temperature", 3.5e38)],
)
def test_ranges_hold_in_float32(name, value):
    assert float32(1e-46) == 0.0 and float32(1e39) == float("inf")
    for route, body in (
        (Route.CHAT, chat(**{name: value})),
        (
            Route.GENERATE,
            {"text": "a", "return_sampling_mask": True, "sampling_params": {name: value}},
        ),
    ):
        err = reject(route, body)
        assert (err.status, err.code) == (400, "sampling_mask_invalid_param")
        assert err.param.endswith(name)
    check_mask_request(Route.CHAT, chat(temperature=3.4e38), CFG)  # finite in float32
