"""The published schema and the mask policy read their numeric ranges from one table
(protocol/bounds.py), and agree on every value: the schema admits a value exactly when the
policy does, and the policy's float64 bounds decide as the float32 value the worker samples
with would (top_p = 5e-324 is 0 in float32: refused by both)."""

from __future__ import annotations

import math
import struct

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maskgate.gateway.openapi import (
    CHAT_REQUEST,
    COMPLETION_REQUEST,
    GENERATE_REQUEST,
    SAMPLING_PARAMS,
)
from maskgate.protocol.bounds import BOUNDS, F32_INF_EDGE, F32_ONE_EDGE, F32_ZERO_EDGE
from maskgate.protocol.errors import ApiError
from maskgate.protocol.fields import Fields

FIELDS = Fields(lambda param, problem: ApiError("bad", f"{param} {problem}"))


def f32(x: float) -> float:
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


# What each float field means for the float32 value sampled (the policy's contract).
FLOAT32_RULES = {
    "temperature": lambda v: v >= 0 and f32(v) < math.inf,
    "top_p": lambda v: 0 < f32(v) <= 1,
    "min_p": lambda v: v >= 0 and f32(v) <= 1,
}


def policy_admits(name: str, value: object) -> bool:
    try:
        FIELDS.bounded({name: value}, name, "")
    except ApiError:
        return False
    return True


def schema_admits(name: str, value: object) -> bool:
    return jsonschema.Draft202012Validator(BOUNDS[name].schema()).is_valid(value)


def _edges(name: str) -> list[object]:
    b = BOUNDS[name]
    out: list[object] = [0, 1, -1, 2, 0.5, 1e-46, -1e-46, 5e-324, -5e-324, 1 + 1e-9, 1e39, 1e300]
    for edge in (b.minimum, b.maximum, b.exclusive_minimum, b.exclusive_maximum):
        if edge is not None:
            out += [edge, math.nextafter(edge, -math.inf), math.nextafter(edge, math.inf)]
    out += [F32_ZERO_EDGE, F32_ONE_EDGE, F32_INF_EDGE, True, "1", None]
    return out


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_schema_and_policy_agree_on_every_edge(name):
    for value in _edges(name):
        if value is None:
            continue
        if isinstance(value, bool | str):
            assert not policy_admits(name, value) and not schema_admits(name, value)
            continue
        if BOUNDS[name].integer and isinstance(value, float):
            if value != int(value) or abs(value) > 2**53:
                assert not policy_admits(name, value)
                continue
            value = int(value)
        assert policy_admits(name, value) == schema_admits(name, value), (name, value)
        if name in FLOAT32_RULES:
            assert policy_admits(name, value) == FLOAT32_RULES[name](value), (name, value)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(FLOAT32_RULES)),
    value=st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.floats(-1e-40, 1e-40),
        st.floats(0.999999, 1.000001),
    ),
)
def test_float_fields_agree_with_float32(name, value):
    assert policy_admits(name, value) == schema_admits(name, value) == FLOAT32_RULES[name](value)


def test_the_published_schemas_use_the_table():
    nullable = {name: {"anyOf": [b.schema(), {"type": "null"}]} for name, b in BOUNDS.items()}
    where = {
        "temperature": [CHAT_REQUEST, COMPLETION_REQUEST, SAMPLING_PARAMS],
        "top_p": [CHAT_REQUEST, COMPLETION_REQUEST, SAMPLING_PARAMS],
        "min_p": [CHAT_REQUEST, COMPLETION_REQUEST, SAMPLING_PARAMS],
        "n": [CHAT_REQUEST, COMPLETION_REQUEST, SAMPLING_PARAMS],
        "min_tokens": [CHAT_REQUEST, SAMPLING_PARAMS],
        "min_new_tokens": [SAMPLING_PARAMS],
        "best_of": [CHAT_REQUEST, COMPLETION_REQUEST],
        "max_tokens": [CHAT_REQUEST, COMPLETION_REQUEST],
        "max_completion_tokens": [CHAT_REQUEST],
        "max_new_tokens": [SAMPLING_PARAMS],
        "top_logprobs": [CHAT_REQUEST],
    }
    for name, schemas in where.items():
        for schema in schemas:
            assert schema["properties"][name] == nullable[name], name
    top_k = CHAT_REQUEST["properties"]["top_k"]["anyOf"][0]
    assert {k: v for k, v in top_k.items() if k != "description"} == BOUNDS["top_k"].schema()
    for name in ("top_logprobs_num", "logprob_start_len"):
        one = GENERATE_REQUEST["properties"][name]["anyOf"][0]["anyOf"][0]
        assert one == BOUNDS[name].schema()
    every = set(where) | {"top_k", "top_logprobs_num", "logprob_start_len"}
    assert every == set(BOUNDS)  # no row of the table left out of the schema


def test_top_p_of_5e_324_is_refused_by_schema_and_policy():
    body = {"messages": [], "return_sampling_mask": True, "return_meta_info": True}
    validator = jsonschema.Draft202012Validator(CHAT_REQUEST)
    assert not validator.is_valid({**body, "top_p": 5e-324})
    assert validator.is_valid({**body, "top_p": 1e-30})
    assert not policy_admits("top_p", 5e-324) and policy_admits("top_p", 1e-30)
