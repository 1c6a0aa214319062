"""How trainers build `/update_weights_from_tensor` payloads, for the tests: SGLang's
MultiprocessingSerializer (ForkingPickler, base64) over shared-memory tensors, SGLang's
FlattenedTensorBucket and verl's LocalSerializedTensor under SGLang's own module names (so
pickle writes them exactly as a trainer with SGLang installed does), and the safetensors form."""

from __future__ import annotations

import base64
import io
import sys
import types
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def forking(obj: Any) -> bytes:
    torch.multiprocessing.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return buf.getvalue()


def shared(t: torch.Tensor) -> torch.Tensor:
    torch.multiprocessing.set_sharing_strategy("file_system")
    return t.contiguous().share_memory_()


@dataclass
class FlattenedTensorMetadata:  # the fields of SGLang's, pickled under SGLang's module name
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


@dataclass
class LocalSerializedTensor:
    values: list[bytes]


def sglang_modules(monkeypatch: Any) -> None:
    """SGLang's module names for the two dataclasses, so pickle writes them as SGLang does."""
    for module, cls in (
        ("sglang.srt.weight_sync.tensor_bucket", FlattenedTensorMetadata),
        ("sglang.srt.model_executor.model_runner", LocalSerializedTensor),
    ):
        parts = module.split(".")
        for k in range(1, len(parts)):  # the parent packages, so that the import succeeds
            parent = ".".join(parts[:k])
            if parent not in sys.modules:
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
        mod = types.ModuleType(module)
        setattr(mod, cls.__name__, cls)
        monkeypatch.setitem(sys.modules, module, mod)
        monkeypatch.setattr(cls, "__module__", module)


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
