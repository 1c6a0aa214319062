"""Rules 1 and 3-9 of the mask policy, each with its status and code (docs/design.md, Policy)."""

from __future__ import annotations

import orjson
import pytest

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import (
    FULL_VOCAB_MESSAGE,
    META_INFO_MESSAGE,
    PolicyConfig,
    Route,
    check_mask_request,
    float32,
    is_mask_request,
    parse_body,
)

CFG = PolicyConfig()


def chat(**fields):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "return_sampling_mask": True,
        "return_meta_info": True,
        "top_p": 0.9,
        "max_tokens": 16,
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not ...}


def gen(**fields):
    body = {"text": "hi", "return_sampling_mask": True, "sampling_params": {"top_p": 0.9}}
    body.update(fields)
    return body


def reject(route, body, *, vocab_size=None, cfg=CFG) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        check_mask_request(route, body, cfg, vocab_size=vocab_size)
    return info.value


def test_rule1_body_must_be_json_object_within_limit():
    assert parse_body(b'{"a": 1}', 100) == {"a": 1}
    for raw in (b"{", b"[1, 2]", b'"x"', b"", b"NaN"):
        with pytest.raises(PolicyError) as info:
            parse_body(raw, 100)
        assert (info.value.status, info.value.code) == (400, "invalid_json")
    with pytest.raises(PolicyError) as info:
        parse_body(b'{"a": "' + b"x" * 200 + b'"}', 100)
    assert (info.value.status, info.value.code) == (413, "body_too_large")


@pytest.mark.parametrize(
    ("body", "wants"),
    [
        ({}, False),
        ({"return_sampling_mask": False}, False),
        ({"return_sampling_mask": None}, False),
        ({"return_sampling_mask": True}, True),
        ({"return_sampling_mask": "yes"}, True),  # malformed still goes to rule 3
        ({"return_sampling_mask": [False, True]}, True),
        ({"return_sampling_mask": [False, False]}, False),
    ],
)
def test_classification(body, wants):
    assert is_mask_request(Route.GENERATE, body) is wants


@pytest.mark.parametrize(
    "fields",
    [
        {"return_sampling_mask": "true"},
        {"top_k": "20"},
        {"top_k": 20.0},
        {"top_k": True},
        {"top_k": -2},
        {"top_p": True},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_p": "0.9"},
        {"min_p": -0.1},
        {"min_p": 1.01},
        {"temperature": -1},
        {"temperature": "1"},
        {"n": 0},
        {"max_tokens": "16"},
        {"frequency_penalty": "0"},
        {"sampling_mask_mode": "loose"},
    ],
)
def test_rule3_types_and_ranges(fields):
    err = reject(Route.CHAT, chat(**fields))
    assert (err.status, err.code) == (400, "sampling_mask_invalid_param")
    assert err.param


def test_rule4_meta_info_required():
    for value in (..., False, None):
        err = reject(Route.COMPLETIONS, chat(return_meta_info=value))
        assert (err.status, err.code, err.message) == (
            400,
            "sampling_mask_requires_meta_info",
            META_INFO_MESSAGE,
        )


def test_rule5_stream_rejected_on_openai_routes_but_not_generate():
    err = reject(Route.CHAT, chat(stream=True))
    assert (err.status, err.code) == (400, "sampling_mask_stream_unsupported")
    out = check_mask_request(Route.GENERATE, gen(stream=True), CFG)
    assert out["stream"] is True


@pytest.mark.parametrize(
    "fields",
    [
        {"frequency_penalty": 0.5},
        {"presence_penalty": -1},
        {"repetition_penalty": 1.1},
        {"logit_bias": {"5": 10}},
        {"regex": "a+"},
        {"response_format": {"type": "json_object"}},
        {"min_tokens": 3},
    ],
)
def test_rule6_logit_transforms(fields):
    err = reject(Route.CHAT, chat(**fields))
    assert (err.status, err.code) == (400, "sampling_mask_logit_transform")
    # Neutral values and the opt-out pass.
    check_mask_request(Route.CHAT, chat(**fields), PolicyConfig(reject_logit_transforms=False))


def test_rule6_neutral_values_pass():
    check_mask_request(
        Route.CHAT,
        chat(frequency_penalty=0, presence_penalty=0.0, repetition_penalty=1, logit_bias={}),
        CFG,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"top_p": ...},
        {"top_p": 1.0},
        {"top_p": 0.99999999},  # float32 rounds it to 1.0
        {"top_p": 1, "top_k": 0},
        {"top_p": 1, "top_k": -1, "min_p": 0},
        {"top_p": ..., "temperature": 0.7},
    ],
)
def test_rule7_full_vocabulary(fields):
    err = reject(Route.CHAT, chat(**fields))
    assert (err.status, err.code, err.message) == (
        400,
        "sampling_mask_full_vocabulary",
        FULL_VOCAB_MESSAGE,
    )


def test_rule7_boundaries():
    assert float32(0.99999999) == 1.0
    assert float32(0.9999999) < 1.0
    check_mask_request(Route.CHAT, chat(top_p=0.9999999), CFG)  # admitted
    check_mask_request(Route.CHAT, chat(top_p=..., temperature=0), CFG)  # greedy
    check_mask_request(Route.CHAT, chat(top_p=..., min_p=0.05), CFG)  # min-p only
    check_mask_request(Route.CHAT, chat(top_p=..., top_k=50), CFG)
    # top_k >= vocab size is "off" once the vocab size is known.
    err = reject(Route.CHAT, chat(top_p=..., top_k=1000), vocab_size=1000)
    assert err.code == "sampling_mask_full_vocabulary"


def test_rule8_top_k_cap():
    err = reject(Route.CHAT, chat(top_k=5000))
    assert (err.status, err.code) == (400, "sampling_mask_top_k_exceeds_cap")
    check_mask_request(Route.CHAT, chat(top_k=4096), CFG)


def test_rule9_payload_estimate():
    cfg = PolicyConfig(max_mask_ids_per_request=1000)
    check_mask_request(Route.COMPLETIONS, chat(top_k=10, max_tokens=100), cfg)  # 1000 ids
    err = reject(Route.COMPLETIONS, chat(top_k=10, max_tokens=100, n=2), cfg=cfg)
    assert (err.status, err.code) == (400, "sampling_mask_payload_too_large")
    # top-p-only masks count at the cap.
    err = reject(
        Route.COMPLETIONS, chat(max_tokens=1), cfg=PolicyConfig(max_mask_ids_per_request=4095)
    )
    assert err.code == "sampling_mask_payload_too_large"


def test_rules_apply_in_order():
    # Breaks rules 4, 5, 7 and 8: rule 4 answers.
    err = reject(Route.CHAT, chat(return_meta_info=False, stream=True, top_p=1, top_k=9000))
    assert err.code == "sampling_mask_requires_meta_info"
    err = reject(Route.CHAT, chat(stream=True, top_p=1))
    assert err.code == "sampling_mask_stream_unsupported"
    err = reject(Route.CHAT, chat(top_k="x", return_meta_info=False))
    assert err.code == "sampling_mask_invalid_param"


def test_resolved_params_written_into_forwarded_body():
    out = check_mask_request(Route.CHAT, chat(top_p=0.9), CFG)
    assert (out["temperature"], out["top_k"], out["top_p"], out["min_p"]) == (1.0, -1, 0.9, 0.0)
    out = check_mask_request(Route.GENERATE, gen(), CFG)
    assert out["sampling_params"] == {"temperature": 1.0, "top_k": -1, "top_p": 0.9, "min_p": 0.0}


def test_generate_batch_per_item_params_and_flags():
    body = {
        "text": ["a", "b", "c"],
        "return_sampling_mask": [True, False, True],
        "sampling_params": [{"top_p": 0.5}, {}, {"top_k": 5, "top_p": 1}],
    }
    out = check_mask_request(Route.GENERATE, body, CFG)
    assert out["sampling_params"][0]["top_p"] == 0.5
    assert out["sampling_params"][1] == {}  # the non-mask item is untouched
    assert out["sampling_params"][2]["top_k"] == 5
    # A full-vocabulary item anywhere in the batch rejects the batch.
    body["sampling_params"][2] = {"top_p": 0.99999999}
    err = reject(Route.GENERATE, body)
    assert err.code == "sampling_mask_full_vocabulary"
    assert err.param == "sampling_params[2].top_p"
    # ... but not when that item does not ask for a mask.
    body["return_sampling_mask"] = [True, False, False]
    check_mask_request(Route.GENERATE, body, CFG)


def test_generate_batch_shared_params_and_bad_shapes():
    body = {"input_ids": [[1, 2], [3]], "return_sampling_mask": True, "sampling_params": {}}
    assert reject(Route.GENERATE, body).code == "sampling_mask_full_vocabulary"
    body["sampling_params"] = {"top_k": 20}
    out = check_mask_request(Route.GENERATE, body, CFG)
    assert out["sampling_params"]["top_k"] == 20
    for bad in ([True], [True, 1], "yes"):
        err = reject(Route.GENERATE, {**body, "return_sampling_mask": bad})
        assert err.code == "sampling_mask_invalid_param"
    err = reject(Route.GENERATE, {**body, "sampling_params": [{"top_k": 1}]})
    assert err.code == "sampling_mask_invalid_param"
    err = reject(Route.GENERATE, {**body, "custom_logit_processor": "x"})
    assert err.code == "sampling_mask_logit_transform"


def test_error_body_is_openai_shaped():
    err = reject(Route.CHAT, chat(top_p=1))
    body = orjson.loads(err.to_bytes())
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
