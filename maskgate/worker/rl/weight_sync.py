"""The worker's side of an RL weight sync: where new weights come from (a checkpoint on disk,
a trainer's broadcast, a co-located trainer's shared tensors) up to staged tensors, and the
apply on the engine thread that makes them live under a new weight version.

Blocking parts (reading files, waiting on a broadcast, forming a group) run in threads the
HTTP layer starts, never on the event loop nor the engine thread, so generation and /health
go on meanwhile; only `apply` (the copy) runs between two engine steps.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from maskgate.worker.engine.engine import Engine
from maskgate.worker.rl.tensor_decode import decode
from maskgate.worker.rl.weight_group import GroupError, WeightGroup, create_group
from maskgate.worker.rl.weights import Target, WeightMap, WeightUpdateError, apply, read_checkpoint
from maskgate.worker.runner.memory import MemorySaver
from maskgate.worker.runner.runner import ModelRunner

Staged = list[tuple[Target, torch.Tensor]]


class WeightSync:
    def __init__(self, runner: ModelRunner, engine: Engine, timeout_s: float) -> None:
        self.runner = runner
        self.engine = engine
        self.timeout_s = timeout_s
        self.wmap = WeightMap(runner.model)
        self.memory = MemorySaver(runner)
        self.groups: dict[str, WeightGroup] = {}
        self.model_path: str | None = None  # the last checkpoint loaded from disk
        self.session: str | None = None  # the selector of an open /begin_weight_update
        # Bytes of tensor data one /update_weights_from_tensor payload may reference: three
        # float32 copies of every parameter (split names, a tied head, dtype conversions).
        numel = sum(p.numel() for p in runner.model.parameters())
        self.max_payload_bytes = 12 * numel + (1 << 24)
        self._lock = threading.Lock()

    # --- sources (worker threads) -----------------------------------------------------------

    def stage_disk(self, model_path: str) -> Staged:
        return read_checkpoint(Path(model_path).expanduser(), self.wmap)

    def init_group(
        self, address: str, port: int, rank: int, world_size: int, name: str, backend: str
    ) -> None:
        """Join a trainer's group within timeout_s of wall time. Forming a group waits twice
        (the store, then the backend), so it runs on its own thread; one that has not formed
        by the bound is abandoned (and destroyed should it form later), and the call fails."""
        if name in self.groups:
            raise GroupError(f"group {name!r} already exists; destroy it first")
        box: dict[str, Any] = {}
        done = threading.Event()

        def form() -> None:
            try:
                group = create_group(master_address=address, master_port=port, rank=rank,
                                     world_size=world_size, group_name=name, backend=backend,
                                     timeout_s=self.timeout_s)  # fmt: skip
            except GroupError as e:
                box["error"] = e
                done.set()
                return
            with self._lock:
                if box.get("abandoned"):
                    group.destroy()
                    return
                box["group"] = group
            done.set()

        threading.Thread(target=form, name=f"weight-group-{name}", daemon=True).start()
        done.wait(self.timeout_s)
        with self._lock:
            if "group" not in box and "error" not in box:
                box["abandoned"] = True
                raise GroupError(
                    f"group {name!r} did not form within {self.timeout_s:g} s (did the trainer "
                    f"join at {address}:{port} as rank 0 of {world_size}?)"
                )
        if "error" in box:
            raise box["error"]
        self.groups[name] = box["group"]

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

    def stage_tensors(self, payload: str, load_format: str | None) -> Staged:
        """One entry of serialized_named_tensors, decoded by `tensor_decode` (docs/worker.md,
        "Tensor payloads")."""
        return self.wmap.stage(decode(payload, load_format, self.max_payload_bytes))

    # --- apply (engine thread, between steps) -----------------------------------------------

    def apply(self, staged: Staged, version: str | None) -> None:
        if "weights" in self.memory.held:
            raise WeightUpdateError("weights are released; resume them first")
        apply(staged)
        self.engine.scheduler.flush_cache()  # cached K/V came from the old weights
        if version is not None:
            self.engine.weight_version = version
