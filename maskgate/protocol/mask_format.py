"""`sampling_mask_format`: how a mask answer carries its masks (docs/design.md, Mask formats).

`lists` (the default, SGLang's layout): `meta_info.output_token_sampling_mask` holds one list
of ids per generated token, in mask order (the argmax first).

`packed`: `meta_info.output_token_sampling_mask_ids` is the base64 of little-endian int32
ids, each token's ids ascending, one token after another, and
`meta_info.output_token_sampling_mask_offsets` the base64 of little-endian int32 offsets,
T + 1 of them, from 0 to the id count; token t's ids are ids[offsets[t]:offsets[t + 1]].
They replace `output_token_sampling_mask`; the log-prob, length and truncation fields are
the same in both formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from maskgate.protocol.errors import PolicyError

FIELD = "sampling_mask_format"
LISTS = "lists"
PACKED = "packed"
FORMATS = (LISTS, PACKED)

MASK = "output_token_sampling_mask"
IDS = "output_token_sampling_mask_ids"
OFFSETS = "output_token_sampling_mask_offsets"


def mask_formats(body: Mapping[str, Any], size: int | None) -> list[bool]:
    """Whether each prompt asks for packed masks: one value, or on a `/generate` batch of
    `size` prompts a list of one value per prompt (as `return_sampling_mask`). Absent or
    null means lists. Anything else is 400 `sampling_mask_invalid_param` (policy rule 3),
    whether or not the request asks for masks."""
    value = body.get(FIELD)
    if isinstance(value, list):
        if size is None or len(value) != size:
            want = "not a list here" if size is None else f"a list of {size} values"
            raise _invalid(FIELD, f"must be 'lists' or 'packed' ({want})")
        return [_one(v, f"{FIELD}[{i}]") for i, v in enumerate(value)]
    return [_one(value, FIELD)] * (size or 1)


def _one(value: Any, param: str) -> bool:
    if value is None or value == LISTS:
        return False
    if value == PACKED:
        return True
    raise _invalid(param, f"must be 'lists' or 'packed', got {value!r:.40}")


def _invalid(param: str, problem: str) -> PolicyError:
    return PolicyError("sampling_mask_invalid_param", f"{param} {problem}", param=param)


def answer_formats(body: Mapping[str, Any], size: int | None) -> tuple[bool, ...]:
    """Whether each answer of a checked mask request wants packed masks: one value for all
    answers, or on a `/generate` batch that mixes formats one per answer, prompt-major (each
    prompt's `n` answers together, the order SGLang and the worker answer in)."""
    packed = mask_formats(body, size)
    if len(set(packed)) <= 1:
        return (packed[0],)
    sp = body.get("sampling_params")
    items = sp if isinstance(sp, list) else [sp] * len(packed)
    counts = [item.get("n", 1) if isinstance(item, dict) else 1 for item in items]
    return tuple(p for p, n in zip(packed, counts, strict=True) for _ in range(n or 1))
