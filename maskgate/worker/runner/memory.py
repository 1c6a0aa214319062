"""Releasing and restoring device memory for a co-located trainer (SGLang's
/release_memory_occupation and /resume_memory_occupation).

`weights`: every parameter is copied to host memory (pinned on CUDA) and its device storage
dropped; resume copies the same bytes back. `kv_cache`: the KV tensors are dropped and
reallocated (zeroed) on resume; nothing in them matters once the worker is idle, which release
requires. CUDA graphs captured the old addresses, so releasing anything drops them and they
are captured again, lazily, once everything is back. Engine thread only (between steps).
"""

from __future__ import annotations

import torch

from maskgate.worker.runner.cuda_graphs import DecodeGraphs
from maskgate.worker.runner.runner import ModelRunner

TAGS = ("weights", "kv_cache")


class MemorySaver:
    tags = TAGS  # the tags whose memory this worker frees (cuda_graph follows them)

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.host_weights: dict[str, torch.Tensor] = {}
        self.kv_shape: tuple[int, ...] | None = None
        self.had_graphs = runner.graphs is not None

    @property
    def held(self) -> set[str]:
        out = set()
        if self.host_weights:
            out.add("weights")
        if self.kv_shape is not None:
            out.add("kv_cache")
        return out

    def conflicts(self, tags: list[str], *, releasing: bool) -> list[str]:
        """The tags in the wrong state for this change: already released (releasing) or not
        released (resuming). `cuda_graph` has no state of its own: the graphs go with any
        release and come back once everything is resumed."""
        held = self.held
        return [t for t in tags if t in TAGS and (t in held) == releasing]

    def release(self, tags: list[str]) -> None:
        r = self.runner
        r.graphs = None  # holds the old addresses (and its own memory pool)
        if "weights" in tags and not self.host_weights:
            pin = r.device.type == "cuda"
            for name, p in r.model.named_parameters():
                host = torch.empty(p.shape, dtype=p.dtype, pin_memory=pin)
                host.copy_(p.data)
                self.host_weights[name] = host
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if "kv_cache" in tags and self.kv_shape is None:
            self.kv_shape = tuple(r.kv.k.shape)
            empty = torch.empty(0, dtype=r.kv.k.dtype, device=r.device)
            r.kv.k, r.kv.v = empty, empty
            r.kv_layers = []
        if r.device.type == "cuda":
            torch.cuda.synchronize(r.device)
            torch.cuda.empty_cache()

    def resume(self, tags: list[str]) -> None:
        r = self.runner
        if "weights" in tags and self.host_weights:
            params = dict(r.model.named_parameters())
            for name, host in self.host_weights.items():
                params[name].data = host.to(r.device, non_blocking=True)
            if r.device.type == "cuda":  # the host copies stay until their copies are done
                torch.cuda.synchronize(r.device)
            self.host_weights = {}
        if "kv_cache" in tags and self.kv_shape is not None:
            r.kv.k = torch.zeros(self.kv_shape, dtype=r.loaded.dtype, device=r.device)
            r.kv.v = torch.zeros(self.kv_shape, dtype=r.loaded.dtype, device=r.device)
            r.kv_layers = r.kv.layers()
            r.nan_slots.clear()
            self.kv_shape = None
        if r.device.type == "cuda":
            torch.cuda.synchronize(r.device)
        if not self.held and self.had_graphs and r.graphs is None:
            r.graphs = DecodeGraphs(r.model, r.kv, max_batch=r.max_num_slots, fused=r.fused)
