"""The mask policy (docs/design.md, Policy): pure functions, no I/O.

The gateway calls, in order: `parse_body` (rule 1), `is_mask_request`, its own allow-list check
(rule 2), then `check_mask_request` (rules 3-9), then the pool's engine rule and admission
(rule 10). Workers call the same functions, so a request answered directly by a worker gets
the same status and code.

`check_mask_request` reads the request once into a `MaskView` (rule 3, mask_view.py) and runs
the ordered rules of rules.py on it; `RULES` there is the rule table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import ResolvedParams, float32, json_type
from maskgate.protocol.mask_view import Route, batch_size, normalise
from maskgate.protocol.policy_settings import PolicySettings
from maskgate.protocol.rules import FULL_VOCAB_MESSAGE, META_INFO_MESSAGE, RULES, check_view

# The name the policy's functions take their settings by.
PolicyConfig = PolicySettings

__all__ = [
    "FULL_VOCAB_MESSAGE",
    "META_INFO_MESSAGE",
    "POLICY_CODES",
    "PolicyConfig",
    "PolicyError",
    "ResolvedParams",
    "Route",
    "batch_size",
    "check_mask_request",
    "float32",
    "is_mask_request",
    "parse_body",
]


def parse_body(raw: bytes, max_bytes: int) -> dict[str, Any]:
    """Rule 1: the body is a JSON object within the size limit."""
    if len(raw) > max_bytes:
        raise PolicyError(
            "body_too_large",
            f"request body is {len(raw)} bytes; the limit is {max_bytes}",
            status=413,
        )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise PolicyError("invalid_json", f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise PolicyError(
            "invalid_json", f"request body must be a JSON object, not {json_type(body)}"
        )
    return body


def is_mask_request(route: Route, body: Mapping[str, Any]) -> bool:
    """True when the request asks for a mask (any value other than absent, null or false).

    A malformed value (a string, a number) still counts: it must reach rule 3 and be
    rejected there, never slip through to the general pool.
    """
    flag = body.get("return_sampling_mask")
    if flag is None or flag is False:
        return False
    if isinstance(flag, list):
        return any(item is not None and item is not False for item in flag)
    return True


def check_mask_request(
    route: Route,
    body: Mapping[str, Any],
    cfg: PolicySettings,
    *,
    vocab_size: int | None = None,
) -> dict[str, Any]:
    """Rules 3-9 for a mask request. Returns the body to forward, with the resolved sampling
    parameters written in explicitly. Raises PolicyError on the first failed rule."""
    view = normalise(route, body, cfg, vocab_size)
    check_view(view)
    return view.rewrite()


# Every code the gateway's policy can answer with (docs/design.md, Policy), for tests and docs.
POLICY_CODES = frozenset(code for rule in RULES for code in rule.codes)
