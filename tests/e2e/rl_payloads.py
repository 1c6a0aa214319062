"""The `/update_weights_from_tensor` entries slime, Miles and verl send, from the pieces in
tests/fakes/trainer_payloads.py (SGLang's dataclasses and serializer, in our own code):
slime's and Miles' `flattened_bucket` (element offsets, one dtype per bucket), verl's
`LocalSerializedTensor` (`load_format: null`) and the pickle-free `safetensors` form. The
caller keeps the returned tensors alive until the update answered.
"""

from __future__ import annotations

from typing import Any

import torch
from fakes.trainer_payloads import FlattenedTensorMetadata, LocalSerializedTensor, b64, dumps


def flattened_bucket(named: list[tuple[str, torch.Tensor]]) -> tuple[str, dict[str, Any]]:
    """(the entry, the tensors to keep alive) for one dtype's bucket."""
    if len({t.dtype for _, t in named}) != 1:
        raise ValueError("a flattened bucket holds one dtype")
    metadata, start = [], 0
    for name, t in named:
        n = t.numel()
        metadata.append(FlattenedTensorMetadata(name, t.shape, t.dtype, start, start + n, n))
        start += n
    data = {"flattened_tensor": torch.cat([t.flatten() for _, t in named]), "metadata": metadata}
    return b64(dumps(data)), data


def by_dtype(named: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    """slime's / Miles' split of a bucket into one flattened bucket per dtype."""
    groups: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, t in named:
        groups.setdefault(t.dtype, []).append((name, t))
    return list(groups.values())


def local_serialized(
    named: list[tuple[str, torch.Tensor]], tp_ranks: int = 1
) -> tuple[str, list[Any]]:
    """verl's entry (one engine rank's copy) and the tensors to keep alive."""
    held = [t.contiguous() for _, t in named]
    inner = [
        (name, LocalSerializedTensor(values=[dumps(t) for _ in range(tp_ranks)]))
        for (name, _), t in zip(named, held, strict=True)
    ]
    return b64(dumps(inner)), held


def safetensors_entry(named: list[tuple[str, torch.Tensor]]) -> str:
    from safetensors.torch import save

    return b64(save({name: t.contiguous() for name, t in named}))
