"""Sampling parameters: strict types, ranges, defaults, refusals, per-choice seeds."""

from __future__ import annotations

from typing import Any

import pytest

from maskgate.protocol.errors import ApiError
from maskgate.worker.server.params import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_SEED,
    parse_generate_params,
    parse_openai_params,
)


def code_of(fn: Any, *args: Any) -> tuple[str, str | None]:
    with pytest.raises(ApiError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value.code, info.value.param


def test_generate_defaults() -> None:
    gp = parse_generate_params(None)
    assert gp.n == 1
    assert (gp.sampling.temperature, gp.sampling.top_k, gp.sampling.top_p) == (1.0, -1, 1.0)
    assert (gp.sampling.min_p, gp.sampling.seed) == (0.0, None)
    assert gp.rule.max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert (gp.rule.stop, gp.rule.stop_token_ids, gp.rule.ignore_eos) == ((), frozenset(), False)


def test_generate_fields_are_parsed() -> None:
    gp = parse_generate_params(
        {
            "temperature": 0.5,
            "top_k": 20,
            "top_p": 0.9,
            "min_p": 0.1,
            "max_new_tokens": 7,
            "stop": "END",
            "stop_token_ids": [3, 4],
            "ignore_eos": True,
            "sampling_seed": 42,
            "n": 3,
            "frequency_penalty": 0.0,  # neutral values are accepted
            "repetition_penalty": 1.0,
            "skip_special_tokens": True,
        }
    )
    s = gp.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.5, 20, 0.9, 0.1, 42)
    assert gp.rule.stop == ("END",) and gp.rule.stop_token_ids == frozenset({3, 4})
    assert gp.rule.ignore_eos and gp.rule.max_new_tokens == 7 and gp.n == 3


@pytest.mark.parametrize(
    ("sp", "param"),
    [
        ({"top_k": "20"}, "sampling_params.top_k"),  # strict: a string is not an int
        ({"temperature": True}, "sampling_params.temperature"),  # a bool is not a number
        ({"top_p": 0}, "sampling_params.top_p"),
        ({"top_p": 1.5}, "sampling_params.top_p"),
        ({"min_p": -0.1}, "sampling_params.min_p"),
        ({"temperature": -1}, "sampling_params.temperature"),
        ({"top_k": -2}, "sampling_params.top_k"),
        ({"max_new_tokens": -1}, "sampling_params.max_new_tokens"),
        ({"n": 0}, "sampling_params.n"),
        ({"stop": [1]}, "sampling_params.stop"),
        ({"stop": [""]}, "sampling_params.stop"),
        ({"stop_token_ids": [-1]}, "sampling_params.stop_token_ids"),
        ({"ignore_eos": "yes"}, "sampling_params.ignore_eos"),
        ({"sampling_seed": -1}, "sampling_params.sampling_seed"),
        ({"sampling_seed": MAX_SEED + 1}, "sampling_params.sampling_seed"),
        ({"tempreature": 1.0}, "sampling_params.tempreature"),  # unknown: a typo is an error
        ({"temperature": float("nan")}, "sampling_params.temperature"),
    ],
)
def test_generate_rejects_bad_values(sp: dict[str, Any], param: str) -> None:
    assert code_of(parse_generate_params, sp) == ("invalid_parameter", param)


@pytest.mark.parametrize("field", ["frequency_penalty", "presence_penalty", "min_new_tokens"])
def test_logit_transforms_the_worker_cannot_apply_are_refused(field: str) -> None:
    code, param = code_of(parse_generate_params, {field: 1})
    assert (code, param) == ("unsupported_parameter", f"sampling_params.{field}")


def test_choice_seeds_are_distinct_deterministic_and_keep_choice_zero() -> None:
    gp = parse_generate_params({"sampling_seed": 9, "n": 4})
    seeds = [gp.choice_params(j).seed for j in range(4)]
    assert seeds[0] == 9 and len(set(seeds)) == 4
    assert all(s is not None and 0 <= s <= MAX_SEED for s in seeds)
    assert seeds == [
        parse_generate_params({"sampling_seed": 9}).choice_params(j).seed for j in range(4)
    ]
    unseeded = parse_generate_params({"n": 2})
    assert unseeded.choice_params(1).seed is None


def test_openai_fields_and_defaults() -> None:
    gp = parse_openai_params({"seed": 5, "top_k": 3, "stop": ["a", "b"]}, 99)
    assert gp.sampling.seed == 5 and gp.sampling.top_k == 3 and gp.rule.stop == ("a", "b")
    assert gp.rule.max_new_tokens == 99  # the route's default
    assert parse_openai_params({"max_completion_tokens": 4}, 99).rule.max_new_tokens == 4
    assert (
        parse_openai_params({"max_tokens": 3, "max_completion_tokens": 4}, 9).rule.max_new_tokens
        == 3
    )
    ok = {"logprobs": False, "response_format": {"type": "text"}, "logit_bias": {}, "user": "u"}
    assert parse_openai_params(ok, 1).n == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"echo": True}, "echo"),
        ({"best_of": 2}, "best_of"),
    ],
)
def test_openai_unsupported_features_are_refused(body: dict[str, Any], param: str) -> None:
    assert code_of(parse_openai_params, body, 16) == ("unsupported_parameter", param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 65}, "n"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_openai_rejects_bad_values(body: dict[str, Any], param: str) -> None:
    assert code_of(parse_openai_params, body, 16) == ("invalid_parameter", param)
