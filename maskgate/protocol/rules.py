"""The mask policy's rules, in the order of the rule table in docs/design.md (Policy).

`RULES` is that table: one `Rule` per row, in the order requests meet them. The rules that
read a normalised request (`MaskView`, mask_view.py) carry their check here and run in
`check_view`; the others name where they are applied. Adding a rule is one function, one
`Rule` in `RULES`, one row in the table (tests/unit/test_policy_table.py compares the two)
and one test.

A rule's check is either `view` (the whole request) or `item` (one set of sampling fields
that asks for a mask). Consecutive item rules run together, item by item, so on a batch the
first item that breaks any of them answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from maskgate.protocol import payload
from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import GREEDY_TEMPERATURE, float32
from maskgate.protocol.mask_view import FIELDS, MaskItem, MaskView, Route
from maskgate.protocol.transforms import (
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

ViewCheck = Callable[[MaskView], None]
ItemCheck = Callable[[MaskView, MaskItem], None]


@dataclass(frozen=True, slots=True)
class Rule:
    number: str  # its row in docs/design.md's table
    codes: tuple[str, ...]  # the codes it answers with, as the table lists them
    view: ViewCheck | None = None
    item: ItemCheck | None = None
    applied_by: str = "check_view"  # where a rule without a check here is applied


def meta_info(view: MaskView) -> None:
    """Rule 4: chat and completions carry the mask in meta_info, so they must ask for it."""
    if view.openai and view.body.get("return_meta_info") is not True:
        raise PolicyError(
            "sampling_mask_requires_meta_info", META_INFO_MESSAGE, param="return_meta_info"
        )


def no_openai_stream(view: MaskView) -> None:
    """Rule 5: meta_info is not streamed on chat and completions; /generate may stream."""
    if view.openai and view.body.get("stream") is True:
        path = "chat/completions" if view.route is Route.CHAT else "completions"
        raise PolicyError(
            "sampling_mask_stream_unsupported",
            f"return_sampling_mask cannot be combined with stream=true on /v1/{path}: "
            "meta_info is not streamed there; use stream=false or the /generate endpoint",
            param="stream",
        )


def no_logit_transform(view: MaskView) -> None:
    """Rule 6 (transforms.py): each masked item's fields, then the request's own."""
    if not view.cfg.reject_logit_transforms:
        return
    for item in view.items:
        if item.masked:
            check_logit_transforms(item.fields, item.where)
    body = view.body
    if view.openai:
        check_response_format(body)
        check_tools(body)
    else:  # custom logit processors live at top level, per item or shared
        check_custom_processor(body.get("custom_logit_processor"), view.flags)
    check_adapter(body, view.flags, openai=view.openai)


def not_full_vocabulary(view: MaskView, item: MaskItem) -> None:
    """Rule 7, decided on the float32 values the worker samples with: temperature 1e-7 is
    greedy, min_p 1e-46 is 0 (off), top_p 0.99999999 is 1 (off)."""
    p = item.params
    vocab_size = view.vocab_size
    top_k_off = p.top_k in (-1, 0) or (vocab_size is not None and p.top_k >= vocab_size)
    sampled = float32(p.temperature) >= GREEDY_TEMPERATURE
    if sampled and top_k_off and float32(p.top_p) >= 1.0 and float32(p.min_p) == 0:
        raise PolicyError(
            "sampling_mask_full_vocabulary", FULL_VOCAB_MESSAGE, param=item.where + "top_p"
        )


def top_k_within_cap(view: MaskView, item: MaskItem) -> None:
    """Rule 8."""
    top_k, cap = item.params.top_k, view.cfg.max_mask_tokens
    if top_k > cap:
        raise PolicyError(
            "sampling_mask_top_k_exceeds_cap",
            f"top_k={top_k} exceeds the mask cap max_mask_tokens={cap}; use top_k <= {cap}",
            param=item.where + "top_k",
        )


def payload_budget(view: MaskView) -> None:
    """Rule 9 (payload.py) over the items that ask for a mask. A shared /generate item with no
    masked prompt has nothing to bound."""
    if view.shared and not view.items[0].masked:
        return
    cfg = view.cfg
    cap = cfg.max_mask_tokens
    if view.openai:
        cost = payload.openai_cost(view.body, FIELDS, chat=view.route is Route.CHAT)
    else:
        cost = payload.generate_cost(view.body, FIELDS)
    payload.check_payload(
        [
            (it.answers, it.max_tokens, min(it.params.top_k, cap) if it.params.top_k > 0 else cap)
            for it in view.items
            if it.masked
        ],
        cost,
        limit=cfg.max_mask_ids_per_request,
        default_max_tokens=cfg.default_max_tokens,
        param=view.budget_param,
    )


RULES: tuple[Rule, ...] = (
    Rule("1", ("invalid_json", "body_too_large"), applied_by="policy.parse_body"),
    Rule("2", ("sampling_mask_forbidden",), applied_by="gateway: check_mask_allowed"),
    Rule(
        "3",
        ("sampling_mask_invalid_param", "sampling_mask_batch_too_large"),
        applied_by="mask_view.normalise",
    ),
    Rule("4", ("sampling_mask_requires_meta_info",), view=meta_info),
    Rule("5", ("sampling_mask_stream_unsupported",), view=no_openai_stream),
    Rule("6", ("sampling_mask_logit_transform",), view=no_logit_transform),
    Rule("7", ("sampling_mask_full_vocabulary",), item=not_full_vocabulary),
    Rule("8", ("sampling_mask_top_k_exceeds_cap",), item=top_k_within_cap),
    Rule("9", ("sampling_mask_payload_too_large",), view=payload_budget),
    Rule("9a", ("sampling_mask_engine_unsupported",), applied_by="engine_rules.check_engine"),
    Rule("10", ("pool_overloaded", "queue_timeout"), applied_by="gateway: Admission.acquire"),
)


def _item_step(checks: tuple[ItemCheck, ...]) -> ViewCheck:
    def step(view: MaskView) -> None:
        for item in view.items:
            if item.masked:
                for check in checks:
                    check(view, item)

    return step


def _steps(rules: tuple[Rule, ...]) -> tuple[ViewCheck, ...]:
    """The checks of `rules` in order, consecutive item rules joined into one step."""
    steps: list[ViewCheck] = []
    group: list[ItemCheck] = []
    for rule in rules:
        if rule.item is not None:
            group.append(rule.item)
            continue
        if group:
            steps.append(_item_step(tuple(group)))
            group = []
        if rule.view is not None:
            steps.append(rule.view)
    if group:
        steps.append(_item_step(tuple(group)))
    return tuple(steps)


_STEPS = _steps(RULES)


def check_view(view: MaskView) -> None:
    """Rules 4-9 on a normalised request; raises PolicyError on the first that fails."""
    for step in _STEPS:
        step(view)
