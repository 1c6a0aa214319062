"""slime's top-p replay ids: `sampling_params.custom_params.return_top_p_token_ids`.

A row that asks computes its sampling mask (the support S each token was drawn from,
docs/design.md "Mask semantics"), whether or not it asked for `return_sampling_mask`, and its
answer's final `meta_info` (the whole answer, or a stream's last chunk) holds every output
token's support in slime's layout:

- `top_p_token_ids`: base64 of little-endian int32 ids, token after token (each token's ids in
  mask order, the sampled distribution's most likely first);
- `top_p_token_offsets`: base64 of little-endian int32 offsets, one more than the output
  tokens, from 0 to the id count: token i's ids are ids[offsets[i]:offsets[i + 1]].

The supports are exact: a row whose support exceeds `max_mask_tokens` fails with 400
`sampling_mask_overflow`, as an exact mask request does, never a truncated list. The ids a
request may return are bounded as mask payloads are (`max_mask_ids_per_request`).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import PolicyConfig
from maskgate.worker.engine.batch import MaskIds
from maskgate.worker.server.params import GenParams

IDS_FIELD = "top_p_token_ids"
OFFSETS_FIELD = "top_p_token_offsets"


def b64_int32(values: Iterable[int] | np.ndarray) -> str:
    """Base64 of the values as little-endian int32."""
    return base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode("ascii")


def top_p_info(masks: Sequence[MaskIds]) -> dict[str, str]:
    """The two meta_info fields for the supports of a sequence's output tokens (each token's
    ids in mask order, as slime's engine writes them)."""
    offsets = np.zeros(len(masks) + 1, dtype=np.int64)
    np.cumsum([len(m) for m in masks], out=offsets[1:])
    ids = np.concatenate(masks) if len(masks) else np.empty(0, dtype=np.int32)
    return {IDS_FIELD: b64_int32(ids), OFFSETS_FIELD: b64_int32(offsets)}


def check_payload(params: list[GenParams], cfg: PolicyConfig) -> None:
    """Bound the ids a request's top-p rows may return (n * max_new_tokens * the per-token
    cap, summed), as policy rule 9 bounds masks; 400 sampling_mask_payload_too_large."""
    cap = cfg.max_mask_tokens
    total = 0
    for p in params:
        if p.top_p_ids:
            per_token = min(p.sampling.top_k, cap) if p.sampling.top_k > 0 else cap
            total += p.n * p.rule.max_new_tokens * per_token
    if total > cfg.max_mask_ids_per_request:
        raise PolicyError(
            "sampling_mask_payload_too_large",
            f"the top-p token ids of this request could hold up to {total} ids "
            f"(prompts * n * max_new_tokens * min(top_k or cap, cap)); the limit is "
            f"{cfg.max_mask_ids_per_request}. Lower the prompt count, n, max_new_tokens or top_k.",
            param="sampling_params.custom_params",
        )


def add_top_p_info(info: dict[str, Any], masks: Sequence[MaskIds], finished: bool) -> None:
    """On a finished sequence's meta_info only (slime reads them from the final chunk)."""
    if finished:
        info.update(top_p_info(masks))
