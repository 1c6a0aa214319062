"""Fuzzing the three inference endpoints (hypothesis) against an in-process gateway in
front of recording upstreams. For every generated body:

- the gateway never answers 5xx;
- every 4xx is an OpenAI-style JSON error with a code from docs/design.md, Policy;
- the answer is the mask policy's verdict (gateway.policy as the oracle), and a rejected
  request reaches no upstream;
- nothing that breaks the policy reaches the mask upstream: each body it receives passes
  `check_mask_request` again and carries the resolved sampling parameters;
- no valid request is rejected: mask requests valid by construction get 200, and general
  requests (whatever they hold) are forwarded to the general pool;
- the published OpenAPI schema agrees: valid requests validate against it, and a single
  request it admits is never rejected for a type, shape or transform rule.

MASKGATE_FUZZ_EXAMPLES sets the examples per test (bench/fuzz_long.py runs thousands).
"""

from __future__ import annotations

import os
from typing import Any

import jsonschema
import orjson
import pytest
from fuzz_bodies import (
    garbage_case,
    general_case,
    mutated_mask_case,
    targeted_break_case,
    valid_mask_case,
)
from fuzz_rig import Rig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskgate.gateway.openapi import openapi_spec, request_schema
from maskgate.protocol import policy
from maskgate.protocol.errors import PolicyError

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("MASKGATE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
ROUTES = {
    "/v1/chat/completions": policy.Route.CHAT,
    "/v1/completions": policy.Route.COMPLETIONS,
    "/generate": policy.Route.GENERATE,
}
# Rules the schema expresses; arithmetic rules (7-9) are prose in the spec.
SCHEMA_RULE_CODES = {
    "invalid_json",
    "sampling_mask_invalid_param",
    "sampling_mask_requires_meta_info",
    "sampling_mask_stream_unsupported",
    "sampling_mask_logit_transform",
}


def _strict_validator(schema: dict[str, Any]) -> jsonschema.Validator:
    """JSON Schema counts 1.0 as an integer and the gateway does not; check as it does."""
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
    )
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


VALIDATORS = {path: _strict_validator(request_schema(path)) for path in ROUTES}
ERROR_VALIDATOR = _strict_validator(openapi_spec(())["components"]["schemas"]["Error"])


def _verdict(rig: Rig, path: str, raw: bytes) -> tuple[str, Any]:
    """What the policy says: ("reject", error), ("mask", body to forward) or ("general", body)."""
    route = ROUTES[path]
    try:
        body = policy.parse_body(raw, rig.state.config.max_body_bytes)
        if not policy.is_mask_request(route, body):
            return "general", body
        vocab = rig.state.pools["mask"].vocab_size
        return "mask", policy.check_mask_request(route, body, rig.state.policy, vocab_size=vocab)
    except PolicyError as e:
        return "reject", e


def _without_rid(body: Any) -> Any:
    return {k: v for k, v in body.items() if k != "rid"} if isinstance(body, dict) else body


def _is_batch(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    ids = body.get("input_ids")
    return isinstance(body.get("text"), list) or (
        isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    )


async def check_case(rig: Rig, path: str, raw: bytes) -> str:
    """Send one body and check every property; returns the outcome's label."""
    general0, mask0 = rig.general.received, rig.mask.received
    status, answer = await rig.post(path, raw)
    assert status < 500, (status, answer)
    kind, expected = _verdict(rig, path, raw)
    to_general = rig.general.received - general0
    to_mask = rig.mask.received - mask0

    if status >= 400:
        assert isinstance(answer, dict), answer
        ERROR_VALIDATOR.validate(answer)
        assert answer["error"]["code"] in policy.POLICY_CODES, answer
    if kind == "reject":
        assert (status, answer["error"]["code"]) == (expected.status, expected.code), answer
        assert to_general == to_mask == 0
        outcome = f"rejected:{expected.code}"
    elif kind == "mask":
        assert status == 200, answer
        assert (to_general, to_mask) == (0, 1)
        got = orjson.loads(rig.mask.last(1)[0])
        # Re-check what the mask upstream received: it must pass the policy as sent.
        route = ROUTES[path]
        vocab = rig.state.pools["mask"].vocab_size
        policy.check_mask_request(route, got, rig.state.policy, vocab_size=vocab)
        assert _without_rid(got) == _without_rid(expected)
        if route is not policy.Route.GENERATE:
            assert all(got[name] is not None for name in policy.ResolvedParams.__slots__)
        outcome = "mask:200"
    else:
        assert status == 200, answer
        assert (to_general, to_mask) == (1, 0)
        got_raw = rig.general.last(1)[0]
        if path == "/generate" and "rid" not in expected:
            assert _without_rid(orjson.loads(got_raw)) == expected  # rid added, else intact
        else:
            assert got_raw == raw  # byte for byte
        outcome = "general:200"
    rig.outcomes[outcome] += 1
    return outcome


def _check_schema_agrees(path: str, raw: bytes, outcome: str) -> None:
    """A single request the published schema admits is never rejected by a rule the schema
    expresses (types, shapes, meta info, streaming, transforms)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    if not isinstance(body, dict) or _is_batch(body):
        return
    if VALIDATORS[path].is_valid(body):
        code = outcome.removeprefix("rejected:")
        assert code not in SCHEMA_RULE_CODES, f"schema admits a body rejected with {code}"


@FUZZ
@given(case=valid_mask_case())
async def test_fuzz_valid_mask_requests_are_admitted_and_forwarded_intact(
    rig: Rig, case: tuple[str, bytes, Any]
) -> None:
    path, raw, body = case
    VALIDATORS[path].validate(body)  # the published schema admits it too
    assert await check_case(rig, path, raw) == "mask:200"


# Four broken mask requests (random and rule by rule) for every garbage body: garbage
# mostly stops at rule 1.
@FUZZ
@given(
    case=st.one_of(
        mutated_mask_case(),
        mutated_mask_case(),
        targeted_break_case(),
        targeted_break_case(),
        garbage_case(),
    )
)
async def test_fuzz_broken_mask_requests_get_the_policy_verdict(
    rig: Rig, case: tuple[str, bytes, Any]
) -> None:
    path, raw, _ = case
    outcome = await check_case(rig, path, raw)
    _check_schema_agrees(path, raw, outcome)


@FUZZ
@given(case=general_case())
async def test_fuzz_general_requests_pass_through(rig: Rig, case: tuple[str, bytes, Any]) -> None:
    path, raw, _ = case
    assert await check_case(rig, path, raw) == "general:200"
