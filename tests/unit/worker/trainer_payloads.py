"""How trainers build `/update_weights_from_tensor` payloads for the worker's unit tests: a
plain ForkingPickler dump (`forking`, inside the `sglang_names()` of
tests/fakes/trainer_payloads.py when it holds SGLang's dataclasses) and SGLang's multi-dtype
FlattenedTensorBucket (`bucket`: one uint8 buffer, byte offsets)."""

from __future__ import annotations

import io
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from fakes.trainer_payloads import FlattenedTensorMetadata, shared


def forking(obj: Any) -> bytes:
    torch.multiprocessing.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return buf.getvalue()


def bucket(named: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """SGLang's multi-dtype FlattenedTensorBucket: one uint8 buffer, byte offsets."""
    metas, parts, at = [], [], 0
    for name, t in named:
        raw = t.contiguous().flatten().view(torch.uint8)
        metas.append(
            FlattenedTensorMetadata(name, t.shape, t.dtype, at, at + raw.numel(), raw.numel())
        )
        parts.append(raw)
        at += raw.numel()
    return {"flattened_tensor": shared(torch.cat(parts)), "metadata": metas}
