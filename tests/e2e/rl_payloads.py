"""The `/update_weights_from_tensor` entries RL trainers send, built here in our own code:

- slime's and Miles' co-located path (`load_format: "flattened_bucket"`): SGLang's
  FlattenedTensorBucket as `{"flattened_tensor": 1-D tensor, "metadata":
  [FlattenedTensorMetadata(name, shape, dtype, start_idx, end_idx, numel)]}`, element
  offsets into the concatenation of the flattened tensors (one dtype per bucket), dumped by
  SGLang's MultiprocessingSerializer (torch's ForkingPickler, then base64);
- verl's (SGLang's `update_weights` helper, `load_format: null`): `[(name,
  LocalSerializedTensor(values=[one ForkingPickler dump of the tensor per TP rank]))]`,
  dumped once more;
- the pickle-free `load_format: "safetensors"`: base64 of a safetensors file.

The two dataclasses are ours, with SGLang's module and class names: a pickle names a class by
(module, qualified name), and the worker resolves exactly those pairs. They are visible under
those module names only while a payload is pickled. CPU tensors travel as shared memory by
file name (torch's `file_system` strategy), so the worker need not be this process's child;
the caller keeps the returned tensors alive until the update answered.
"""

from __future__ import annotations

import base64
import io
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

BUCKET_MODULE = "sglang.srt.weight_sync.tensor_bucket"
RUNNER_MODULE = "sglang.srt.model_executor.model_runner"


@dataclass
class FlattenedTensorMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


@dataclass
class LocalSerializedTensor:
    values: list[bytes]  # one dump per TP rank of the engine


FlattenedTensorMetadata.__module__ = BUCKET_MODULE
LocalSerializedTensor.__module__ = RUNNER_MODULE
_CLASSES = {BUCKET_MODULE: FlattenedTensorMetadata, RUNNER_MODULE: LocalSerializedTensor}


@contextmanager
def _sglang_names() -> Iterator[None]:
    """Our two classes importable under SGLang's module names (pickle checks that a class
    is found where it says it lives), removed again afterwards."""
    added, replaced = [], []
    for module, cls in _CLASSES.items():
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                mod = types.ModuleType(name)
                mod.__path__ = []  # a package, so that its children import
                sys.modules[name] = mod
                added.append(name)
        target = sys.modules[module]
        replaced.append((target, cls.__name__, getattr(target, cls.__name__, None)))
        setattr(target, cls.__name__, cls)
    try:
        yield
    finally:
        for target, attr, before in replaced:
            if before is not None:  # an installed SGLang's own class
                setattr(target, attr, before)
        for name in reversed(added):
            del sys.modules[name]


def dumps(obj: Any) -> bytes:
    """SGLang's MultiprocessingSerializer.serialize without output_str."""
    from multiprocessing.reduction import ForkingPickler

    torch.multiprocessing.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    with _sglang_names():
        ForkingPickler(buf).dump(obj)
    return buf.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


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
