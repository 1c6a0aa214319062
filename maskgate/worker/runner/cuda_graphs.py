"""CUDA graphs for decode steps, one per (batch bucket, key bucket), captured on first use.

A decode step of a small model is dominated by kernel-launch overhead (hundreds of small
kernels per token); replaying a captured graph removes it. Shapes must be static inside a
graph, so rows are padded up to a batch bucket (padding rows write to the KV cache's scratch
slot) and attention reads a fixed number of keys, the next power of two >= the longest
context (min 256, at most max_model_len). The graph ends at the final hidden states; lm_head
and the sampler run eagerly, so graphs hold no [batch, vocab] buffers.

With the fused kernels (the runner's default on CUDA) a captured step is the Triton decode
attention reading the slots in place plus ~9 kernels a layer; the key bucket then only
bounds the keys a row may have (it fixes the attention's split count), since each row
reads its own context and no more.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.engine.kv_cache import KVCache
from maskgate.worker.model.attention import AttnBatch, AttnGroup, key_mask
from maskgate.worker.model.llama import LlamaForCausalLM

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512)
MIN_KEYS = 256


class DecodeGraphs:
    def __init__(
        self, model: LlamaForCausalLM, kv: KVCache, max_batch: int, fused: bool = False
    ) -> None:
        self.model = model
        self.fused = fused
        self.kv = kv
        self.kv_layers = kv.layers()
        self.buckets = [b for b in BATCH_BUCKETS if b < max_batch] + [max_batch]
        dev = kv.k.device
        # Static inputs [3, width]: token ids, positions, slots. An even width keeps each row
        # 16-byte aligned, the alignment Triton specialises pointers on (one kernel variant).
        width = self.buckets[-1] + self.buckets[-1] % 2
        self.inputs = torch.zeros((3, width), dtype=torch.int64, device=dev)
        # Their pinned host twin: one asynchronous copy a step, issued without waiting on the
        # device. It is rewritten only once the last copy from it has completed.
        self.host = torch.zeros((3, width), dtype=torch.int64, pin_memory=True)
        self.host_rows = self.host.numpy()
        self.copied = torch.cuda.Event()
        # bucket_of[n]: the smallest batch bucket >= n, for n in 1..max_batch.
        top = self.buckets[-1]
        self.bucket_of = [0] + [next(x for x in self.buckets if x >= n) for n in range(1, top + 1)]
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.num_replays = 0

    def can_run(self, rows: list[RowWork]) -> bool:
        return len(rows) <= self.buckets[-1] and all(
            r.sample and len(r.token_ids) == 1 for r in rows
        )

    def run(
        self, rows: list[RowWork], pending: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """Decode rows -> logits [len(rows), vocab] float32. `pending` writes the tokens of
        rows that feed PENDING into the ids on the device (ModelRunner._pending)."""
        n = len(rows)
        b = self.bucket_of[n]
        context = max(r.start_pos for r in rows) + 1
        # The next power of two >= context, at least MIN_KEYS (a power of two).
        keys = min(max(MIN_KEYS, 1 << (context - 1).bit_length()), self.kv.max_model_len)
        # The previous copy from the host buffer: long complete, as every step ends in a copy
        # back; this only guards the rewrite.
        self.copied.synchronize()
        h = self.host_rows
        h[0, :n] = [r.token_ids[0] for r in rows]
        h[1, :n] = [r.start_pos for r in rows]
        h[2, :n] = [r.slot for r in rows]
        h[:2, n:b] = 0  # padding rows: token 0 at position 0 of the scratch slot
        h[2, n:b] = self.kv.scratch_slot
        # The whole buffer: a contiguous copy is one DMA (a [3, b] slice is strided).
        self.inputs.copy_(self.host, non_blocking=True)
        self.copied.record()
        if pending is not None:
            pending(self.inputs[0])
        entry = self.graphs.get((b, keys))
        if entry is None:
            entry = self._capture(b, keys)
            self.graphs[(b, keys)] = entry
        entry[0].replay()
        self.num_replays += 1
        return self.model.compute_logits(entry[1][:n])

    def _forward(self, b: int, keys: int) -> torch.Tensor:
        ids, pos, slots = self.inputs[0, :b], self.inputs[1, :b], self.inputs[2, :b]
        window = self.model.config.sliding_window
        mask = None if self.fused else key_mask(pos, keys, window, self.kv.k.dtype)
        group = AttnGroup(
            slots=slots,
            mask=None if mask is None else mask[:, None, None, :],
            num_keys=keys,
            num_rows=b,
            lq=1,
            num_tokens=b,
            pad_index=None,
            unpad_index=None,
        )
        batch = AttnBatch(slots, pos, decode=group, prefill=None, fused=self.fused)
        return self.model(ids, pos, self.kv_layers, batch)

    def _capture(self, b: int, keys: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm up on a side stream first (lazy cuBLAS/SDPA init must not happen in capture).
        # The warm-up writes the same K/V the replay writes, so running it is harmless.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(b, keys)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self._forward(b, keys)
        return graph, hidden
