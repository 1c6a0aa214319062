"""The worker's side of an RL weight sync: where new weights come from (a checkpoint on disk,
a trainer's broadcast, a co-located trainer's shared tensors) up to staged tensors, and the
apply on the engine thread that makes them live under a new weight version.

Blocking parts (reading files, waiting on a broadcast, forming a group) run in threads the
HTTP layer starts, never on the event loop nor the engine thread, so generation and /health
go on meanwhile; only `apply` (the copy) runs between two engine steps.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing.reductions  # registers the tensor rebuilders unpickling needs

from maskgate.worker.engine import Engine
from maskgate.worker.memory import MemorySaver
from maskgate.worker.runner import ModelRunner
from maskgate.worker.weight_group import GroupError, WeightGroup, create_group
from maskgate.worker.weights import Target, WeightMap, WeightUpdateError, apply, read_checkpoint

Staged = list[tuple[Target, torch.Tensor]]

# What a /update_weights_from_tensor payload may name when unpickled: torch's tensor and
# storage rebuilders and dtypes, nothing else (an allow-list; see _TensorUnpickler).
_REDUCTIONS = "torch.multiprocessing.reductions"
_ALLOWED = {
    "torch": {"Tensor", "Size", "device"},
    "torch.storage": {"UntypedStorage", "TypedStorage"},
    "torch._utils": {"_rebuild_tensor_v2", "_rebuild_parameter"},
    "torch.nn.parameter": {"Parameter"},
    "collections": {"OrderedDict"},
}


class WeightSync:
    def __init__(self, runner: ModelRunner, engine: Engine, timeout_s: float) -> None:
        self.runner = runner
        self.engine = engine
        self.timeout_s = timeout_s
        self.wmap = WeightMap(runner.model)
        self.memory = MemorySaver(runner)
        self.groups: dict[str, WeightGroup] = {}

    # --- sources (worker threads) -----------------------------------------------------------

    def stage_disk(self, model_path: str) -> Staged:
        return read_checkpoint(Path(model_path).expanduser(), self.wmap)

    def init_group(
        self, address: str, port: int, rank: int, world_size: int, name: str, backend: str
    ) -> None:
        if name in self.groups:
            raise GroupError(f"group {name!r} already exists; destroy it first")
        self.groups[name] = create_group(
            master_address=address,
            master_port=port,
            rank=rank,
            world_size=world_size,
            group_name=name,
            backend=backend,
            timeout_s=self.timeout_s,
        )

    def destroy_group(self, name: str) -> bool:
        group = self.groups.pop(name, None)
        if group is None:
            return False
        group.destroy()
        return True

    def receive(
        self, name: str, names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]]
    ) -> Staged:
        """Check the announced tensors, then receive them from rank 0 into fresh buffers.
        Any failure destroys the group (the trainer's side cannot be resynchronised)."""
        group = self.groups.get(name)
        if group is None:
            raise WeightUpdateError(
                f"group {name!r} does not exist; call /init_weights_update_group first"
            )
        try:
            self.wmap.check(names, dtypes, shapes)
            device = "cuda" if group.backend == "nccl" else "cpu"
            bufs = [
                torch.empty(s, dtype=d, device=device) for d, s in zip(dtypes, shapes, strict=True)
            ]
            group.broadcast(bufs)
        except (WeightUpdateError, GroupError):
            self.destroy_group(name)
            raise
        return self.wmap.stage(zip(names, bufs, strict=True))

    def stage_tensors(self, payload: str) -> Staged:
        """One base64 ForkingPickler dump of [(name, tensor), ...] (see docs/worker.md)."""
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise WeightUpdateError("serialized_named_tensors[0] is not valid base64") from None
        try:
            obj = _TensorUnpickler(io.BytesIO(raw)).load()
        except WeightUpdateError:
            raise
        except Exception as e:  # a truncated pickle, a vanished shared-memory file, ...
            raise WeightUpdateError(f"cannot unpickle serialized_named_tensors[0]: {e}") from None
        if not isinstance(obj, list | tuple) or not all(
            isinstance(x, list | tuple) and len(x) == 2 for x in obj
        ):
            raise WeightUpdateError(
                "serialized_named_tensors[0] must unpickle to a list of (name, tensor) pairs"
            )
        return self.wmap.stage((n, t) for n, t in obj)

    # --- apply (engine thread, between steps) -----------------------------------------------

    def apply(self, staged: Staged, version: str | None) -> None:
        if "weights" in self.memory.held:
            raise WeightUpdateError("weights are released; resume them first")
        apply(staged)
        self.engine.scheduler.flush_cache()  # cached K/V came from the old weights
        if version is not None:
            self.engine.weight_version = version


class _TensorUnpickler(pickle.Unpickler):
    """Unpickles only tensors (shared memory or CUDA IPC) and plain containers: a payload
    naming any other global is refused before anything runs."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get(module, set())
        if (
            (module == _REDUCTIONS and name.startswith("rebuild_"))
            or name in allowed
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        ):
            return super().find_class(module, name)
        if module == "multiprocessing.resource_sharer":
            raise WeightUpdateError(
                "serialized_named_tensors[0] shares CPU tensors by file descriptor, which only "
                "works between a parent process and its children; call "
                "torch.multiprocessing.set_sharing_strategy('file_system') before pickling"
            )
        raise WeightUpdateError(
            f"serialized_named_tensors[0] names {module}.{name}, which is not a tensor part"
        )
