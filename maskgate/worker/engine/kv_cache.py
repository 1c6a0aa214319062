"""The KV cache: one fixed slot per running sequence, preallocated from a memory budget.

Layout per layer: k, v: [num_slots + 1, kv_heads, max_model_len, head_dim]. A slot holds one
sequence's keys and values at their positions, so no block table is needed and a slot is
reusable as soon as its sequence ends (attention masks by position, stale entries are never
read). The extra last slot is scratch: CUDA-graph padding rows write there.

Slots rather than pages: simpler, and with fixed-length rollouts (the RL case this worker is
for) the over-reservation of a slot is small. The cost is that a slot always reserves
max_model_len tokens, so a budget holds budget / bytes_per_slot sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from maskgate.worker.model import ModelConfig


def bytes_per_slot(cfg: ModelConfig, max_model_len: int, dtype: torch.dtype) -> int:
    """K and V of all layers for max_model_len tokens."""
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    return per_token * max_model_len * dtype.itemsize


@dataclass(slots=True)
class KVCache:
    k: torch.Tensor  # [layers, num_slots + 1, kv_heads, max_model_len, head_dim]
    v: torch.Tensor  # same
    num_slots: int  # usable slots; index num_slots is the scratch slot
    max_model_len: int

    @property
    def scratch_slot(self) -> int:
        return self.num_slots

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.k[i], self.v[i]) for i in range(self.k.shape[0])]


def allocate_kv_cache(
    cfg: ModelConfig,
    *,
    max_num_slots: int,
    max_model_len: int,
    budget_bytes: int,
    device: torch.device,
    dtype: torch.dtype,
) -> KVCache:
    """As many slots as the budget holds (the scratch slot included), at most max_num_slots."""
    per_slot = bytes_per_slot(cfg, max_model_len, dtype)
    fit = budget_bytes // per_slot - 1
    if fit < 1:
        raise ValueError(
            f"the KV cache budget of {budget_bytes / 2**20:.1f} MiB holds no sequence of "
            f"max_model_len={max_model_len} tokens (each needs {per_slot / 2**20:.1f} MiB, "
            "plus one scratch slot); raise the budget or lower max_model_len"
        )
    num_slots = min(max_num_slots, fit)
    shape = (
        cfg.num_hidden_layers,
        num_slots + 1,
        cfg.num_key_value_heads,
        max_model_len,
        cfg.head_dim,
    )
    k = torch.zeros(shape, device=device, dtype=dtype)
    v = torch.zeros(shape, device=device, dtype=dtype)
    return KVCache(k=k, v=v, num_slots=num_slots, max_model_len=max_model_len)
