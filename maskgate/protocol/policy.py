"""The mask policy (docs/design.md, Policy): pure functions, no I/O.

The gateway calls, in order: `parse_body` (rule 1), `is_mask_request`, its own allow-list check
(rule 2), then `check_mask_request` (rules 3-9), then admission (rule 10). Workers call the
same functions, so a request answered directly by a worker gets the same status and code.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import Fields, ResolvedParams, json_type

FULL_VOCAB_MESSAGE = (
    "return_sampling_mask cannot return the full vocabulary; set top_p < 1 or a finite top_k."
)
META_INFO_MESSAGE = "return_sampling_mask requires return_meta_info=true"

# Fields that change logits in a way a trainer cannot replay from the mask alone (rule 6).
_PENALTIES = (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0))
GRAMMAR_FIELDS = (
    "regex",
    "ebnf",
    "json_schema",
    "structural_tag",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
_MIN_TOKENS_FIELDS = ("min_tokens", "min_new_tokens")


class Route(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    GENERATE = "generate"


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    max_mask_tokens: int = 4096  # cap C on |mask| per token (rule 8)
    max_mask_ids_per_request: int = 64 * 1024 * 1024  # rule 9 budget, in ids
    reject_logit_transforms: bool = True  # rule 6
    # Used by rule 9 when a request leaves max_tokens unset (upstream default is unknown).
    default_max_tokens: int = 2048


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
    cfg: PolicyConfig,
    *,
    vocab_size: int | None = None,
) -> dict[str, Any]:
    """Rules 3-9 for a mask request. Returns the body to forward, with the resolved sampling
    parameters written in explicitly. Raises PolicyError on the first failed rule."""
    if route is Route.GENERATE:
        return _check_generate(body, cfg, vocab_size)
    return _check_openai(route, body, cfg, vocab_size)


# --- OpenAI-style endpoints -------------------------------------------------------------


def _check_openai(
    route: Route, body: Mapping[str, Any], cfg: PolicyConfig, vocab_size: int | None
) -> dict[str, Any]:
    # Rule 3: types and ranges.
    _FIELDS.boolean(body, "return_sampling_mask", required=True)
    params = _check_sampling_fields(body, "")
    n = _FIELDS.integer(body, "n", "", minimum=1)
    max_tokens_field = "max_completion_tokens" if route is Route.CHAT else "max_tokens"
    max_tokens = _FIELDS.integer(body, "max_tokens", "", minimum=0)
    if route is Route.CHAT:
        alt = _FIELDS.integer(body, max_tokens_field, "", minimum=0)
        max_tokens = max_tokens if max_tokens is not None else alt
    for name in ("return_meta_info", "stream", "return_token_ids"):
        _FIELDS.boolean(body, name)
    _check_mask_mode(body, "")
    # Rule 4.
    if body.get("return_meta_info") is not True:
        raise PolicyError(
            "sampling_mask_requires_meta_info", META_INFO_MESSAGE, param="return_meta_info"
        )
    # Rule 5.
    if body.get("stream") is True:
        raise PolicyError(
            "sampling_mask_stream_unsupported",
            f"return_sampling_mask cannot be combined with stream=true on /v1/{_path(route)}: "
            "meta_info is not streamed there; use stream=false or the /generate endpoint",
            param="stream",
        )
    # Rule 6.
    if cfg.reject_logit_transforms:
        _check_logit_transforms(body, "")
        _check_response_format(body)
    # Rules 7-9.
    _check_support(params, vocab_size, cfg, "")
    _check_payload(
        [(n or 1, max_tokens, params)], cfg, "max_tokens" if route is Route.COMPLETIONS else None
    )
    out = dict(body)
    out.update(params.as_dict())
    return out


# --- SGLang /generate ---------------------------------------------------------------------


def _check_generate(
    body: Mapping[str, Any], cfg: PolicyConfig, vocab_size: int | None
) -> dict[str, Any]:
    size = batch_size(body)
    flags = _mask_flags(body, size)
    items = _sampling_items(body, size)
    _FIELDS.boolean(body, "stream")
    _check_mask_mode(body, "")
    # Rule 3 for every item's sampling fields (the whole batch goes to the mask pool).
    resolved: list[ResolvedParams] = []
    sizes: list[tuple[int, int | None]] = []
    for i, sp in enumerate(items):
        where = _item_where(i, size, body)
        resolved.append(_check_sampling_fields(sp, where))
        n = _FIELDS.integer(sp, "n", where, minimum=1)
        max_new = _FIELDS.integer(sp, "max_new_tokens", where, minimum=0)
        sizes.append((n or 1, max_new))
    # Rule 6 (custom logit processors live at top level, per item or shared).
    if cfg.reject_logit_transforms:
        for i, sp in enumerate(items):
            if flags[i]:
                _check_logit_transforms(sp, _item_where(i, size, body))
        _check_custom_processor(body.get("custom_logit_processor"), flags)
    # Rules 7, 8 and 9 on the items that ask for a mask.
    for i, params in enumerate(resolved):
        if flags[i]:
            _check_support(params, vocab_size, cfg, _item_where(i, size, body))
    _check_payload(
        [(n, mt, p) for (n, mt), p, f in zip(sizes, resolved, flags, strict=True) if f],
        cfg,
        "sampling_params.max_new_tokens",
    )
    return _write_generate_params(body, size, flags, items, resolved)


def batch_size(body: Mapping[str, Any]) -> int | None:
    """The item count of a /generate batch, or None for a single request."""
    text = body.get("text")
    ids = body.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def _mask_flags(body: Mapping[str, Any], size: int | None) -> list[bool]:
    flag = body.get("return_sampling_mask")
    if isinstance(flag, list):
        if size is None or len(flag) != size or not all(isinstance(f, bool) for f in flag):
            want = "a bool" if size is None else f"a bool or a list of {size} bools"
            raise _invalid("return_sampling_mask", f"must be {want}")
        return list(flag)
    if not isinstance(flag, bool):
        raise _invalid("return_sampling_mask", f"must be a bool, not {json_type(flag)}")
    return [flag] * (size or 1)


def _sampling_items(body: Mapping[str, Any], size: int | None) -> list[Mapping[str, Any]]:
    sp = body.get("sampling_params")
    if sp is None:
        return [{}] * (size or 1)
    if isinstance(sp, dict):
        return [sp] * (size or 1)
    if isinstance(sp, list) and size is not None and len(sp) == size:
        for i, item in enumerate(sp):
            if not isinstance(item, dict):
                raise _invalid(f"sampling_params[{i}]", "must be an object")
        return sp
    want = "an object" if size is None else f"an object or a list of {size} objects"
    raise _invalid("sampling_params", f"must be {want}")


def _item_where(i: int, size: int | None, body: Mapping[str, Any]) -> str:
    if isinstance(body.get("sampling_params"), list):
        return f"sampling_params[{i}]."
    return "sampling_params."


def _check_custom_processor(value: Any, flags: list[bool]) -> None:
    if isinstance(value, list):
        hit = any(v not in (None, "") and f for v, f in zip(value, flags, strict=False))
    else:
        hit = value not in (None, "")
    if hit:
        raise _transform("custom_logit_processor", "a custom logit processor")


def _write_generate_params(
    body: Mapping[str, Any],
    size: int | None,
    flags: list[bool],
    items: list[Mapping[str, Any]],
    resolved: list[ResolvedParams],
) -> dict[str, Any]:
    out = dict(body)
    shared = not isinstance(body.get("sampling_params"), list)
    if shared and all(flags):
        out["sampling_params"] = {**items[0], **resolved[0].as_dict()}
        return out
    per_item: list[dict[str, Any]] = []
    for sp, params, flag in zip(items, resolved, flags, strict=True):
        per_item.append({**sp, **params.as_dict()} if flag else dict(sp))
    out["sampling_params"] = per_item if size is not None else per_item[0]
    return out


# --- rules shared by both shapes --------------------------------------------------------


def _check_sampling_fields(d: Mapping[str, Any], where: str) -> ResolvedParams:
    params = _FIELDS.sampling(d, where)
    for name, _neutral in _PENALTIES:
        _FIELDS.number(d, name, where)
    for name in _MIN_TOKENS_FIELDS:
        _FIELDS.integer(d, name, where, minimum=0)
    return params


def _check_logit_transforms(d: Mapping[str, Any], where: str) -> None:
    for name, neutral in _PENALTIES:
        value = d.get(name)
        if value is not None and value != neutral:
            raise _transform(where + name, f"{name}={value}")
    bias = d.get("logit_bias")
    if bias not in (None, {}, []):
        raise _transform(where + "logit_bias", "a non-empty logit_bias")
    for name in GRAMMAR_FIELDS:
        if d.get(name) not in (None, "", [], {}):
            raise _transform(where + name, f"a grammar constraint ({name})")
    for name in _MIN_TOKENS_FIELDS:
        if (d.get(name) or 0) > 0:
            raise _transform(where + name, f"{name} (it suppresses end-of-sequence tokens)")
    if d.get("custom_logit_processor") not in (None, ""):
        raise _transform(where + "custom_logit_processor", "a custom logit processor")


def _check_response_format(body: Mapping[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind not in (None, "text"):
        raise _transform("response_format", f"a grammar constraint (response_format {kind!r})")


def _check_support(
    p: ResolvedParams, vocab_size: int | None, cfg: PolicyConfig, where: str
) -> None:
    top_k_off = p.top_k in (-1, 0) or (vocab_size is not None and p.top_k >= vocab_size)
    if p.temperature > 0 and top_k_off and float32(p.top_p) >= 1.0 and p.min_p == 0:
        raise PolicyError(
            "sampling_mask_full_vocabulary", FULL_VOCAB_MESSAGE, param=where + "top_p"
        )
    if p.top_k > cfg.max_mask_tokens:
        raise PolicyError(
            "sampling_mask_top_k_exceeds_cap",
            f"top_k={p.top_k} exceeds the mask cap max_mask_tokens={cfg.max_mask_tokens}; "
            f"use top_k <= {cfg.max_mask_tokens}",
            param=where + "top_k",
        )


def _check_payload(
    items: list[tuple[int, int | None, ResolvedParams]], cfg: PolicyConfig, param: str | None
) -> None:
    cap = cfg.max_mask_tokens
    total = 0
    for n, max_tokens, p in items:
        per_token = min(p.top_k, cap) if p.top_k > 0 else cap
        tokens = cfg.default_max_tokens if max_tokens is None else max_tokens
        total += n * tokens * per_token
    if total > cfg.max_mask_ids_per_request:
        raise PolicyError(
            "sampling_mask_payload_too_large",
            f"the masks of this request could hold up to {total} token ids "
            f"(n * max_tokens * min(top_k or cap, cap)); the limit is "
            f"{cfg.max_mask_ids_per_request}. Lower n, max_tokens or top_k.",
            param=param,
        )


# --- helpers ----------------------------------------------------------------------------


def float32(x: float) -> float:
    """Round a Python float to the nearest float32 (0.99999999 -> 1.0)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _check_mask_mode(d: Mapping[str, Any], where: str) -> None:
    mode = d.get("sampling_mask_mode")
    if mode is not None and mode not in ("exact", "bounded"):
        raise _invalid(where + "sampling_mask_mode", f"must be 'exact' or 'bounded', got {mode!r}")


def _invalid(param: str, problem: str) -> PolicyError:
    return PolicyError("sampling_mask_invalid_param", f"{param} {problem}", param=param)


_FIELDS = Fields(_invalid)  # strict typed reads whose errors carry the policy's code


def _transform(param: str, what: str) -> PolicyError:
    return PolicyError(
        "sampling_mask_logit_transform",
        f"return_sampling_mask cannot be combined with {what}: the trainer cannot replay "
        "that logit transform from the mask",
        param=param,
    )


def _path(route: Route) -> str:
    return "chat/completions" if route is Route.CHAT else "completions"


# Every code the gateway's policy can answer with (docs/design.md, Policy), for tests and docs.
POLICY_CODES = frozenset(
    {
        "invalid_json",
        "body_too_large",
        "sampling_mask_forbidden",
        "sampling_mask_invalid_param",
        "sampling_mask_requires_meta_info",
        "sampling_mask_stream_unsupported",
        "sampling_mask_logit_transform",
        "sampling_mask_full_vocabulary",
        "sampling_mask_top_k_exceeds_cap",
        "sampling_mask_payload_too_large",
        "pool_overloaded",
        "queue_timeout",
    }
)
