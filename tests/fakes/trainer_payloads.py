"""The pieces of a trainer's `/update_weights_from_tensor` payload, in our own code, shared by
the worker's unit tests and the real-client e2e tests: SGLang's `FlattenedTensorMetadata` and
verl's `LocalSerializedTensor` as our own dataclasses with SGLang's module and class names (a
pickle names a class by (module, qualified name), and the worker resolves exactly those
pairs; the names are visible only inside `sglang_names()`), SGLang's MultiprocessingSerializer
(`dumps`: torch's ForkingPickler), and CPU tensors in shared memory by file name (torch's
`file_system` strategy, so the worker need not be this process's child).
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
def sglang_names() -> Iterator[None]:
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
    with sglang_names():
        ForkingPickler(buf).dump(obj)
    return buf.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def shared(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor in shared memory, named by file (torch's `file_system` strategy)."""
    torch.multiprocessing.set_sharing_strategy("file_system")
    return t.contiguous().share_memory_()
