"""The mask fields of a sequence's `meta_info`, as lists or packed (protocol/mask_format.py).

Packed masks never become Python lists: the tokens' int32 id arrays (worker/mask_copy.py)
are joined, each token's ids sorted ascending by one vectorised sort of (token, id) keys,
and the little-endian bytes base64-encoded.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

from maskgate.protocol.mask_format import IDS, MASK, OFFSETS
from maskgate.worker.engine.batch import MaskIds

_LE_INT32 = np.dtype("<i4")


def mask_fields(
    masks: Sequence[MaskIds],
    logprobs: list[float],
    truncated: list[bool],
    *,
    bounded: bool,
    packed: bool,
) -> dict[str, Any]:
    """`meta_info`'s mask fields for these tokens (a stream passes only its new ones)."""
    info: dict[str, Any] = {}
    if packed:
        info[IDS], info[OFFSETS] = pack(masks)
    else:
        info[MASK] = [m if isinstance(m, list) else m.tolist() for m in masks]
    info["output_token_sampling_logprobs"] = logprobs
    info["output_token_sampling_mask_length"] = len(masks)
    if bounded:
        info["output_token_sampling_mask_truncated"] = truncated
    return info


def pack(masks: Sequence[MaskIds]) -> tuple[str, str]:
    """T masks -> (base64 ids, base64 offsets): little-endian int32, ids ascending within
    each token, T + 1 offsets from 0 to the id count."""
    t = len(masks)
    lengths = np.fromiter(map(len, masks), dtype=np.int64, count=t)
    offsets = np.zeros(t + 1, dtype=_LE_INT32)
    np.cumsum(lengths, out=offsets[1:])
    if t and offsets[-1]:
        ids = np.concatenate(masks).astype(np.int64)
        # [n] keys token << 32 | id: one sort orders ids within each token, tokens kept apart.
        keys = (np.repeat(np.arange(t, dtype=np.int64), lengths) << 32) | ids
        keys.sort()
        data = (keys & 0xFFFFFFFF).astype(_LE_INT32).tobytes()
    else:
        data = b""
    return _b64(data), _b64(offsets.tobytes())


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
