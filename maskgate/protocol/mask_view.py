"""Rule 3 of the mask policy: every request shape (chat, completions, a `/generate` request
or batch) is read once, with strict types and ranges, into one `MaskView`. The later rules
(rules.py) read only the view; `MaskView.rewrite` makes the body that goes upstream.

A chat or completions request is one item, the body itself; a `/generate` request is one item
per prompt, or one shared item when `sampling_params` is one object for the whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import Fields, ResolvedParams, is_int, json_type
from maskgate.protocol.mask_format import mask_formats
from maskgate.protocol.policy_settings import PolicySettings
from maskgate.protocol.transforms import MIN_TOKENS_FIELDS, PENALTIES


class Route(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    GENERATE = "generate"


@dataclass(slots=True)
class MaskItem:
    """One set of sampling fields: `where` prefixes its params in error messages."""

    where: str
    fields: Mapping[str, Any]
    params: ResolvedParams
    answers: int  # answers it makes: prompts x choices (a shared item: masked prompts x n)
    max_tokens: int | None
    masked: bool


@dataclass(slots=True)
class MaskView:
    route: Route
    body: Mapping[str, Any]
    cfg: PolicySettings
    vocab_size: int | None
    size: int | None  # a /generate batch's prompt count, else None
    flags: list[bool]  # per prompt: asks for a mask ([True] on chat and completions)
    items: list[MaskItem]
    shared: bool  # /generate: one sampling_params object for every prompt
    budget_param: str | None  # the param rule 9 names
    openai: bool  # chat or completions (not /generate)

    def rewrite(self) -> dict[str, Any]:
        """The body to forward: the resolved sampling parameters written in explicitly (on a
        batch, only into the items that ask for a mask)."""
        out = dict(self.body)
        if self.openai:
            out.update(self.items[0].params.as_dict())
            return out
        items = self.items
        if self.shared and all(self.flags):
            out["sampling_params"] = {**items[0].fields, **items[0].params.as_dict()}
            return out
        if self.shared:  # a shared object, some items without a mask
            items = items * len(self.flags)
        per_item = [
            {**it.fields, **it.params.as_dict()} if flag else dict(it.fields)
            for it, flag in zip(items, self.flags, strict=True)
        ]
        out["sampling_params"] = per_item if self.size is not None else per_item[0]
        return out


def normalise(
    route: Route, body: Mapping[str, Any], cfg: PolicySettings, vocab_size: int | None
) -> MaskView:
    """Rule 3 (and the batch cap): raises PolicyError on the first bad field."""
    if route is Route.GENERATE:
        return _generate(body, cfg, vocab_size)
    return _openai(route, body, cfg, vocab_size)


def _openai(
    route: Route, body: Mapping[str, Any], cfg: PolicySettings, vocab_size: int | None
) -> MaskView:
    FIELDS.boolean(body, "return_sampling_mask", required=True)
    prompts = _prompt_count(body, cfg) if route is Route.COMPLETIONS else 1
    params = sampling_fields(body, "")
    n = FIELDS.count(body, "n", "") or 1
    best_of = FIELDS.count(body, "best_of", "") or 1
    max_tokens = FIELDS.count(body, "max_tokens", "")
    if route is Route.CHAT:
        alt = FIELDS.count(body, "max_completion_tokens", "")
        max_tokens = max_tokens if max_tokens is not None else alt
    for name in ("return_meta_info", "stream", "return_token_ids"):
        FIELDS.boolean(body, name)
    _check_mask_mode(body)
    mask_formats(body, None)
    # Every prompt of a completions list is answered with its own choices.
    item = MaskItem("", body, params, prompts * max(n, best_of), max_tokens, True)
    param = "max_tokens" if route is Route.COMPLETIONS else None
    return MaskView(route, body, cfg, vocab_size, None, [True], [item], False, param, True)


def _generate(body: Mapping[str, Any], cfg: PolicySettings, vocab_size: int | None) -> MaskView:
    size = batch_size(body)
    _check_batch_cap(size, cfg, "text")
    flags = _mask_flags(body, size)
    FIELDS.boolean(body, "stream")
    _check_mask_mode(body)
    mask_formats(body, size)
    sp = body.get("sampling_params")
    shared = sp is None or isinstance(sp, dict)
    if shared:
        # One object shared by every item: checked once, whatever the batch size.
        masked = sum(flags)
        items = [_generate_item({} if sp is None else sp, "sampling_params.", masked, masked)]
    else:
        items = [
            _generate_item(item, f"sampling_params[{i}].", 1, flag)
            for i, (item, flag) in enumerate(zip(_sampling_items(body, size), flags, strict=True))
        ]
    param = "sampling_params.max_new_tokens"
    return MaskView(Route.GENERATE, body, cfg, vocab_size, size, flags, items, shared, param, False)


def _generate_item(sp: Mapping[str, Any], where: str, prompts: int, masked: int) -> MaskItem:
    params = sampling_fields(sp, where)
    n = FIELDS.count(sp, "n", where) or 1
    max_new = FIELDS.count(sp, "max_new_tokens", where)
    return MaskItem(where, sp, params, prompts * n, max_new, masked > 0)


def sampling_fields(d: Mapping[str, Any], where: str) -> ResolvedParams:
    params = FIELDS.sampling(d, where)
    for name, _neutral in PENALTIES:
        FIELDS.number(d, name, where)
    for name in MIN_TOKENS_FIELDS:
        FIELDS.count(d, name, where)
    return params


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


def _prompt_count(body: Mapping[str, Any], cfg: PolicySettings) -> int:
    """Prompts in a /v1/completions request: a string or one token-id list is one prompt; a
    list of strings or of token-id lists is one prompt per entry, each with its own choices."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not is_int(prompt[0]):
        _check_batch_cap(len(prompt), cfg, "prompt")
        return len(prompt)
    return 1


def _check_batch_cap(size: int | None, cfg: PolicySettings, param: str) -> None:
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
            raise invalid("return_sampling_mask", f"must be {want}")
        return list(flag)
    if not isinstance(flag, bool):
        raise invalid("return_sampling_mask", f"must be a bool, not {json_type(flag)}")
    return [flag] * (size or 1)


def _sampling_items(body: Mapping[str, Any], size: int | None) -> list[Mapping[str, Any]]:
    """A per-prompt `sampling_params` list (a shared object is read by `_generate`)."""
    sp = body.get("sampling_params")
    if isinstance(sp, list) and size is not None and len(sp) == size:
        for i, item in enumerate(sp):
            if not isinstance(item, dict):
                raise invalid(f"sampling_params[{i}]", "must be an object")
        return sp
    want = "an object" if size is None else f"an object or a list of {size} objects"
    raise invalid("sampling_params", f"must be {want}")


def _check_mask_mode(d: Mapping[str, Any]) -> None:
    mode = d.get("sampling_mask_mode")
    if mode is not None and mode not in ("exact", "bounded"):
        raise invalid("sampling_mask_mode", f"must be 'exact' or 'bounded', got {mode!r}")


def invalid(param: str, problem: str) -> PolicyError:
    return PolicyError("sampling_mask_invalid_param", f"{param} {problem}", param=param)


FIELDS = Fields(invalid)  # strict typed reads whose errors carry the policy's code
