"""The payload budget (rule 9) counts every field that grows an answer: `n` / `best_of` even
with `max_tokens: 0`, and the log-prob fields (top log-probs, requested token ids, prompt
rows); a LoRA adapter with a mask is a logit transform (rule 6) on every route."""

from __future__ import annotations

import pytest

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import PolicyConfig, Route, check_mask_request
from tests.fakes.bodies import chat_body as chat
from tests.fakes.bodies import completion_body as completion
from tests.fakes.bodies import generate_body as generate

CFG = PolicyConfig(max_mask_ids_per_request=100_000)


BODIES = {Route.GENERATE: generate, Route.COMPLETIONS: completion, Route.CHAT: chat}


def code(route: Route, body: dict) -> str | None:
    try:
        check_mask_request(route, body, CFG)
    except PolicyError as e:
        assert e.status in (400, 413)
        return e.code
    return None


TOO_LARGE = "sampling_mask_payload_too_large"


@pytest.mark.parametrize(
    ("route", "ok", "big"),
    [
        (Route.COMPLETIONS, {"max_tokens": 0, "n": 4}, {"max_tokens": 0, "n": 20_000}),
        (Route.COMPLETIONS, {"max_tokens": 0, "best_of": 4}, {"max_tokens": 0, "best_of": 20_000}),
        (Route.CHAT, {"max_tokens": 0, "n": 4}, {"max_tokens": 0, "n": 20_000}),
        (
            Route.GENERATE,
            {"sampling_params": {"top_k": 10, "max_new_tokens": 0, "n": 4}},
            {"sampling_params": {"top_k": 10, "max_new_tokens": 0, "n": 20_000}},
        ),
    ],
)
def test_zero_max_tokens_still_counts_every_answer(route, ok, big):
    assert code(route, BODIES[route](**ok)) is None
    assert code(route, BODIES[route](**big)) == TOO_LARGE


LONG = "x" * 50_000


@pytest.mark.parametrize(
    ("route", "ok", "big"),
    [
        # top log-probs per output token
        (
            Route.GENERATE,
            {"return_logprob": True, "top_logprobs_num": 5},
            {"return_logprob": True, "top_logprobs_num": 1000},
        ),
        # the same field with return_logprob off costs nothing
        (
            Route.GENERATE,
            {"top_logprobs_num": 1000},
            {"return_logprob": [True], "text": ["hi"], "top_logprobs_num": [1000]},
        ),
        # requested token ids per output token
        (
            Route.GENERATE,
            {"return_logprob": True, "token_ids_logprob": list(range(10))},
            {"return_logprob": True, "token_ids_logprob": list(range(1000))},
        ),
        # prompt rows: only from logprob_start_len >= 0
        (
            Route.GENERATE,
            {"text": LONG, "return_logprob": True, "logprob_start_len": -1},
            {"text": LONG, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5},
        ),
        (
            Route.GENERATE,
            {"input_ids": list(range(100)), "return_logprob": True, "logprob_start_len": 0},
            {
                "input_ids": list(range(50_000)),
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": 5,
            },
        ),
        (
            Route.CHAT,
            {"logprobs": True, "top_logprobs": 5},
            {"logprobs": True, "top_logprobs": 1000},
        ),
        (Route.COMPLETIONS, {"logprobs": 5}, {"logprobs": 1000}),
        (
            Route.COMPLETIONS,
            {"prompt": LONG, "logprobs": 1},
            {"prompt": LONG, "logprobs": 1, "echo": True},
        ),
    ],
)
def test_log_prob_fields_count_in_the_budget(route, ok, big):
    assert code(route, BODIES[route](**ok)) is None
    assert code(route, BODIES[route](**big)) == TOO_LARGE


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        (Route.GENERATE, {"top_logprobs_num": -1, "return_logprob": True}),
        (Route.GENERATE, {"top_logprobs_num": "5", "return_logprob": True}),
        (Route.GENERATE, {"return_logprob": "yes"}),
        (Route.GENERATE, {"return_logprob": True, "logprob_start_len": -2}),
        (Route.GENERATE, {"return_logprob": True, "token_ids_logprob": ["a"]}),
        (Route.CHAT, {"logprobs": True, "top_logprobs": -1}),
        (Route.COMPLETIONS, {"logprobs": True}),
    ],
)
def test_bad_log_prob_fields_are_invalid_params(route, fields):
    assert code(route, BODIES[route](**fields)) == "sampling_mask_invalid_param"


ADAPTERS = [{"lora_path": "adapter-a"}, {"lora_id": "7"}, {"lora_name": "a"}]


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize("fields", ADAPTERS)
def test_a_lora_adapter_is_a_logit_transform_on_every_route(route, fields):
    assert code(route, BODIES[route](**fields)) == "sampling_mask_logit_transform"
    assert code(route, BODIES[route](**{k: None for k in fields})) is None


@pytest.mark.parametrize("route", [Route.CHAT, Route.COMPLETIONS])
def test_an_adapter_named_in_the_model_is_a_logit_transform(route):
    assert code(route, BODIES[route](model="base:adapter-a")) == "sampling_mask_logit_transform"
    assert code(route, BODIES[route](model="base")) is None


def test_a_per_item_adapter_counts_only_for_masked_items():
    body = generate(
        text=["a", "b"], return_sampling_mask=[True, False], lora_path=[None, "adapter"]
    )
    assert code(Route.GENERATE, body) is None
    body["lora_path"] = ["adapter", None]
    assert code(Route.GENERATE, body) == "sampling_mask_logit_transform"
