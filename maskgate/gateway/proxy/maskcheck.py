"""Checks on mask responses that do not stream, and their conversion between formats.

The body is parsed once with orjson to record each token's support size and any broken
invariant: one mask and one log-prob per generated token, and each sampled token inside its
own mask. A `lists` answer to a `lists` request goes to the client as the upstream's bytes,
unchanged; a malformed one is counted, never rewritten.

Packed answers (protocol/mask_format.py) are checked without decoding their ids
(gateway/packed.py): offsets from 0 to the id count and non-decreasing, T + 1 of them where T
is the answer's mask length, completion tokens and sampled ids, no empty mask, and ids below
the vocabulary size rounded up to a power of two, read from the base64 text. A packed answer
that breaks any of these is a 502 `upstream_invalid_mask`. When an answer's format is not the
one its request asked for (an SGLang pool answers lists), the masks are converted and the
body re-encoded; a packed answer converted to lists is decoded anyway, and then also checked
exactly (every id below the vocabulary size, each sampled token inside its mask).

Shapes (SGLang): `/generate` answers an object (a list of objects for a batch) with
`meta_info` and the sampled ids in `output_ids`; chat and completions answer
`choices[i].meta_info`, with the sampled ids in `choices[i].token_ids` when the request set
`return_token_ids`. Without sampled ids only the count invariants can be checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from operator import contains, sub
from typing import Any

import orjson

from maskgate.gateway.observability.loop_metrics import HistogramChild
from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.proxy import packed as packing
from maskgate.protocol.errors import ServerError
from maskgate.protocol.mask_format import IDS, MASK

_IDS_KEY = f'"{IDS}"'.encode()
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


def finish_mask_response(
    route: str,
    raw: bytes,
    pool: str,
    metrics: GatewayMetrics,
    packed: tuple[bool, ...],
    vocab_size: int | None = None,
) -> bytes:
    """Check a 200 mask answer and give each answer the format its request asked for
    (`packed`: one value for all answers, or one per answer). Returns the client's bytes;
    raises ServerError 502 `upstream_invalid_mask` on a malformed packed answer."""
    if not any(packed) and _IDS_KEY not in raw:
        check_mask_response(route, raw, pool, metrics)  # lists both ways: bytes unchanged
        return raw
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict | list):
        metrics.mask_violations.labels("malformed").inc()
        raise _invalid_mask(pool, "the answer is not a JSON object")
    found: set[str] = set()
    changed = False
    support = metrics.mask_support.labels(pool)
    try:
        for k, (meta, ids) in enumerate(_items(route, data)):
            want = packed[min(k, len(packed) - 1)]
            if isinstance(meta, dict) and IDS in meta:
                found |= _check_packed(meta, ids, support, vocab_size, want)
                changed |= not want
                continue
            kinds = _check_item(meta, ids, support)
            found |= kinds
            if want and isinstance(meta, dict) and MASK in meta:
                if "malformed" in kinds:
                    raise packing.PackedMaskError(f"its {MASK} cannot be packed")
                packing.to_packed(meta)
                changed = True
    except packing.PackedMaskError as e:
        found.add("malformed")
        raise _invalid_mask(pool, str(e)) from e
    finally:
        for kind in found:
            metrics.mask_violations.labels(kind).inc()
    return orjson.dumps(data) if changed else raw


def _check_packed(
    meta: dict[str, Any], ids: Any, support: HistogramChild, vocab_size: int | None, want: bool
) -> set[str]:
    """One packed answer's checks (raises PackedMaskError); converts it to lists unless
    `want`. Returns the violations that do not make it malformed."""
    offsets = packing.offsets_of(meta)
    packing.check_ids(meta, offsets, vocab_size)
    t = len(offsets) - 1
    for name in (LENGTH, "completion_tokens"):
        value = meta.get(name)
        if value is not None and value != t:
            raise packing.PackedMaskError(f"{name} is {value}, the packed mask has {t} tokens")
    logprobs = meta.get(LOGPROBS)
    if not isinstance(logprobs, list) or len(logprobs) != t:
        raise packing.PackedMaskError(f"{LOGPROBS} must hold one log-prob per token ({t})")
    if isinstance(ids, list) and len(ids) != t:
        raise packing.PackedMaskError(f"{len(ids)} sampled tokens but {t} masks")
    counts = Counter(map(sub, offsets[1:], offsets))
    if 0 in counts:
        raise packing.PackedMaskError("a token has an empty mask")
    support.observe_counts(counts)
    found = set()
    if not want:  # decoded for the conversion: the exact checks come at no extra cost
        mask_ids, offsets = packing.decode(meta)
        packing.check_vocab(mask_ids, vocab_size)
        if isinstance(ids, list) and packing.tokens_outside(mask_ids, offsets, ids):
            found.add("token_outside_mask")
        packing.to_lists(meta, mask_ids, offsets)
    return found


def _invalid_mask(pool: str, problem: str) -> ServerError:
    return ServerError(
        "upstream_invalid_mask", f"the {pool} pool answered a malformed sampling mask: {problem}"
    )


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
