"""The mask policy (docs/design.md, Policy): pure functions, no I/O.

The gateway calls, in order: `parse_body` (rule 1), `is_mask_request`, its own allow-list check
(rule 2), then `check_mask_request` (rules 3-9), then admission (rule 10). Workers call the
same functions, so a request answered directly by a worker gets the same status and code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from maskgate.protocol import payload
from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import (
    GREEDY_TEMPERATURE,
    Fields,
    ResolvedParams,
    float32,
    is_int,
    json_type,
)
from maskgate.protocol.mask_format import mask_formats
from maskgate.protocol.transforms import (
    MIN_TOKENS_FIELDS,
    PENALTIES,
    check_adapter,
    check_custom_processor,
    check_logit_transforms,
    check_response_format,
    check_tools,
)

FULL_VOCAB_MESSAGE = (
    "return_sampling_mask cannot return the full vocabulary; set top_p < 1 or a finite top_k."
)
META_INFO_MESSAGE = "return_sampling_mask requires return_meta_info=true"


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
    # Most prompts in one mask request (a /generate batch, a /v1/completions prompt list):
    # checking costs O(items), and this keeps one request's check well under 50 ms.
    max_batch_items: int = 4096


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
    prompts = _prompt_count(body, cfg) if route is Route.COMPLETIONS else 1
    params = _check_sampling_fields(body, "")
    n = _FIELDS.count(body, "n", "") or 1
    best_of = _FIELDS.count(body, "best_of", "") or 1
    max_tokens_field = "max_completion_tokens" if route is Route.CHAT else "max_tokens"
    max_tokens = _FIELDS.count(body, "max_tokens", "")
    if route is Route.CHAT:
        alt = _FIELDS.count(body, max_tokens_field, "")
        max_tokens = max_tokens if max_tokens is not None else alt
    for name in ("return_meta_info", "stream", "return_token_ids"):
        _FIELDS.boolean(body, name)
    _check_mask_mode(body, "")
    mask_formats(body, None)
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
        check_logit_transforms(body, "")
        check_response_format(body)
        check_tools(body)
        check_adapter(body, [True], openai=True)
    # Rules 7-9. Every prompt of a completions list is answered with its own choices.
    _check_support(params, vocab_size, cfg, "")
    _check_payload(
        [(prompts * max(n, best_of), max_tokens, params)],
        cfg,
        "max_tokens" if route is Route.COMPLETIONS else None,
        payload.openai_cost(body, _FIELDS, chat=route is Route.CHAT),
    )
    out = dict(body)
    out.update(params.as_dict())
    return out


# --- SGLang /generate ---------------------------------------------------------------------


def _check_generate(
    body: Mapping[str, Any], cfg: PolicyConfig, vocab_size: int | None
) -> dict[str, Any]:
    size = batch_size(body)
    _check_batch_cap(size, cfg, "text")
    flags = _mask_flags(body, size)
    _FIELDS.boolean(body, "stream")
    _check_mask_mode(body, "")
    mask_formats(body, size)
    sp = body.get("sampling_params")
    if sp is None or isinstance(sp, dict):
        # One object shared by every item: checked once, whatever the batch size.
        shared: Mapping[str, Any] = {} if sp is None else sp
        params, n, max_new = _check_generate_item(shared, "sampling_params.")
        masked = sum(flags)
        if cfg.reject_logit_transforms and masked:
            check_logit_transforms(shared, "sampling_params.")
        if cfg.reject_logit_transforms:
            check_custom_processor(body.get("custom_logit_processor"), flags)
            check_adapter(body, flags, openai=False)
        if masked:
            _check_support(params, vocab_size, cfg, "sampling_params.")
            _check_payload(
                [(masked * n, max_new, params)],
                cfg,
                "sampling_params.max_new_tokens",
                payload.generate_cost(body, _FIELDS),
            )
        return _write_generate_params(body, size, flags, [shared], [params])
    items = _sampling_items(body, size)
    # Rule 3 for every item's sampling fields (the whole batch goes to the mask pool).
    resolved: list[ResolvedParams] = []
    sizes: list[tuple[int, int | None]] = []
    for i, item in enumerate(items):
        params, n, max_new = _check_generate_item(item, f"sampling_params[{i}].")
        resolved.append(params)
        sizes.append((n, max_new))
    # Rule 6 (custom logit processors live at top level, per item or shared).
    if cfg.reject_logit_transforms:
        for i, item in enumerate(items):
            if flags[i]:
                check_logit_transforms(item, f"sampling_params[{i}].")
        check_custom_processor(body.get("custom_logit_processor"), flags)
        check_adapter(body, flags, openai=False)
    # Rules 7, 8 and 9 on the items that ask for a mask.
    for i, params in enumerate(resolved):
        if flags[i]:
            _check_support(params, vocab_size, cfg, f"sampling_params[{i}].")
    _check_payload(
        [(n, mt, p) for (n, mt), p, f in zip(sizes, resolved, flags, strict=True) if f],
        cfg,
        "sampling_params.max_new_tokens",
        payload.generate_cost(body, _FIELDS),
    )
    return _write_generate_params(body, size, flags, items, resolved)


def _check_generate_item(
    sp: Mapping[str, Any], where: str
) -> tuple[ResolvedParams, int, int | None]:
    params = _check_sampling_fields(sp, where)
    n = _FIELDS.count(sp, "n", where) or 1
    max_new = _FIELDS.count(sp, "max_new_tokens", where)
    return params, n, max_new


def batch_size(body: Mapping[str, Any]) -> int | None:
    """The item count of a /generate batch, or None for a single request."""
    text = body.get("text")
    ids = body.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    embeds = body.get("input_embeds")  # [items][tokens][hidden] for a batch
    if not isinstance(embeds, list) or not embeds:
        return None
    first = embeds[0]
    if isinstance(first, list) and first and isinstance(first[0], list):
        return len(embeds)
    return None


def _prompt_count(body: Mapping[str, Any], cfg: PolicyConfig) -> int:
    """Prompts in a /v1/completions request: a string or one token-id list is one prompt; a
    list of strings or of token-id lists is one prompt per entry, each with its own choices."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not is_int(prompt[0]):
        _check_batch_cap(len(prompt), cfg, "prompt")
        return len(prompt)
    return 1


def _check_batch_cap(size: int | None, cfg: PolicyConfig, param: str) -> None:
    if size is not None and size > cfg.max_batch_items:
        raise PolicyError(
            "sampling_mask_batch_too_large",
            f"this mask request holds {size} prompts; the limit is max_batch_items="
            f"{cfg.max_batch_items}. Split it into smaller requests.",
            status=413,
            param=param,
        )


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
    if shared:  # a shared object, some items without a mask: only the masked get the defaults
        items, resolved = items * len(flags), resolved * len(flags)
    per_item: list[dict[str, Any]] = []
    for sp, params, flag in zip(items, resolved, flags, strict=True):
        per_item.append({**sp, **params.as_dict()} if flag else dict(sp))
    out["sampling_params"] = per_item if size is not None else per_item[0]
    return out


# --- rules shared by both shapes --------------------------------------------------------


def _check_sampling_fields(d: Mapping[str, Any], where: str) -> ResolvedParams:
    params = _FIELDS.sampling(d, where)
    for name, _neutral in PENALTIES:
        _FIELDS.number(d, name, where)
    for name in MIN_TOKENS_FIELDS:
        _FIELDS.count(d, name, where)
    return params


def _check_support(
    p: ResolvedParams, vocab_size: int | None, cfg: PolicyConfig, where: str
) -> None:
    # Decided on the float32 values the worker samples with: temperature 1e-7 is greedy,
    # min_p 1e-46 is 0 (off), top_p 0.99999999 is 1 (off).
    top_k_off = p.top_k in (-1, 0) or (vocab_size is not None and p.top_k >= vocab_size)
    sampled = float32(p.temperature) >= GREEDY_TEMPERATURE
    if sampled and top_k_off and float32(p.top_p) >= 1.0 and float32(p.min_p) == 0:
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
    items: list[tuple[int, int | None, ResolvedParams]],
    cfg: PolicyConfig,
    param: str | None,
    cost: payload.LogprobCost,
) -> None:
    """`items`: (answers, max_tokens, params), answers = prompts * choices per prompt."""
    cap = cfg.max_mask_tokens
    payload.check_payload(
        [(n, mt, min(p.top_k, cap) if p.top_k > 0 else cap) for n, mt, p in items],
        cost,
        limit=cfg.max_mask_ids_per_request,
        default_max_tokens=cfg.default_max_tokens,
        param=param,
    )


# --- helpers ----------------------------------------------------------------------------


def _check_mask_mode(d: Mapping[str, Any], where: str) -> None:
    mode = d.get("sampling_mask_mode")
    if mode is not None and mode not in ("exact", "bounded"):
        raise _invalid(where + "sampling_mask_mode", f"must be 'exact' or 'bounded', got {mode!r}")


def _invalid(param: str, problem: str) -> PolicyError:
    return PolicyError("sampling_mask_invalid_param", f"{param} {problem}", param=param)


_FIELDS = Fields(_invalid)  # strict typed reads whose errors carry the policy's code


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
        "sampling_mask_batch_too_large",
        "sampling_mask_engine_unsupported",
        "pool_overloaded",
        "queue_timeout",
    }
)
