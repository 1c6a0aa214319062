"""Checks on mask responses that do not stream.

The body is parsed once with orjson to record each token's support size and any broken
invariant: one mask and one log-prob per generated token, and each sampled token inside its
own mask. The bytes sent to the client are the upstream's, unchanged; a malformed answer is
counted, never rewritten.

Shapes (SGLang): `/generate` answers an object (a list of objects for a batch) with
`meta_info` and the sampled ids in `output_ids`; chat and completions answer
`choices[i].meta_info`, with the sampled ids in `choices[i].token_ids` when the request set
`return_token_ids`. Without sampled ids only the count invariants can be checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from operator import contains
from typing import Any

import orjson

from maskgate.gateway.loop_metrics import HistogramChild
from maskgate.gateway.metrics import GatewayMetrics

MASK = "output_token_sampling_mask"
LOGPROBS = "output_token_sampling_logprobs"
LENGTH = "output_token_sampling_mask_length"


def check_mask_response(route: str, raw: bytes, pool: str, metrics: GatewayMetrics) -> set[str]:
    """Record support sizes and violations for one response; returns the violation kinds."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    found: set[str] = set()
    items = list(_items(route, data)) if isinstance(data, dict | list) else None
    if items is None:
        found.add("malformed")
    else:
        support = metrics.mask_support.labels(pool)
        for meta, ids in items:
            found |= _check_item(meta, ids, support)
    for kind in found:
        metrics.mask_violations.labels(kind).inc()
    return found


def _items(route: str, data: Any) -> Iterator[tuple[Any, Any]]:
    """(meta_info, sampled ids or None) for every answer in the response."""
    if route == "generate":
        for item in data if isinstance(data, list) else [data]:
            if isinstance(item, dict):
                yield item.get("meta_info"), item.get("output_ids")
            else:
                yield None, None
        return
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        yield None, None
        return
    for choice in choices:
        if isinstance(choice, dict):
            yield choice.get("meta_info"), choice.get("token_ids")
        else:
            yield None, None


def _check_item(meta: Any, ids: Any, support: HistogramChild) -> set[str]:
    # One pass in C per check (map, set, Counter): an answer of 4096 tokens with large
    # masks must not hold the event loop for a Python iteration per token.
    if not isinstance(meta, dict):
        return {"malformed"}
    masks = meta.get(MASK)
    if masks is None:
        return set()  # this row did not ask for a mask
    logprobs = meta.get(LOGPROBS)
    if not isinstance(masks, list) or not isinstance(logprobs, list):
        return {"malformed"}
    found: set[str] = set()
    lists = set(map(type, masks)) <= {list}
    sizes = list(map(len, masks)) if lists else [len(m) for m in masks if isinstance(m, list)]
    if not lists or 0 in sizes:
        found.add("malformed")
    counts = Counter(sizes)
    counts.pop(0, None)
    support.observe_counts(counts)
    if len(logprobs) != len(masks):
        found.add("logprob_count")
    length = meta.get(LENGTH)
    if length is not None and length != len(masks):
        found.add("mask_count")
    if isinstance(ids, list):
        if len(ids) != len(masks):
            found.add("mask_count")
        elif not (lists and all(map(contains, masks, ids))) and _outside(masks, ids):
            found.add("token_outside_mask")
    return found


def _outside(masks: list[list[Any]], ids: list[Any]) -> bool:
    """A sampled id outside its mask (masks that are not lists, or empty, are `malformed`)."""
    return any(
        isinstance(mask, list) and mask and token not in mask
        for token, mask in zip(ids, masks, strict=True)
    )
