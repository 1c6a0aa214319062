"""Helpers for tests that compare `lists` and `packed` mask answers (one place, shared by the
worker and gateway tests): both formats unpacked to per-token sorted id lists."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import orjson

from examples.unpack_masks import unpack


def masks_of(meta: dict[str, Any]) -> list[list[int]]:
    """Each token's mask, ids ascending, whichever format `meta` carries."""
    if "output_token_sampling_mask" in meta:
        assert "output_token_sampling_mask_ids" not in meta
        return [sorted(m) for m in meta["output_token_sampling_mask"]]
    ids, offsets = unpack(meta)
    assert "output_token_sampling_mask" not in meta
    assert offsets[0] == 0 and offsets[-1] == len(ids)
    out = [ids[a:b].tolist() for a, b in pairwise(offsets)]
    assert all(m == sorted(m) for m in out), "packed ids ascend within each token"
    return out


def sse_events(raw: bytes) -> list[Any]:
    """The JSON events of an SSE body, without the final [DONE]."""
    events = []
    for frame in raw.split(b"\n\n"):
        if frame.startswith(b"data: ") and frame != b"data: [DONE]":
            events.append(orjson.loads(frame[6:]))
    return events
