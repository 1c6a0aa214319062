"""Small building blocks of the Llama-family decoder: RMSNorm, rotary embedding, gated MLP.

Each block has a torch path (the CPU path, and the oracle the Triton kernels are tested
against) and, on CUDA, a fused Triton path chosen per call by `fused` (triton_norm.py,
triton_rope.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from maskgate.worker.model.config import RopeConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, cast back before the weight (as Llama does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, fused: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (norm(x + residual), x + residual); residual None: (norm(x), x). [N, dim] each.
        Fused: one kernel that writes the sum into `residual` in place and the normed rows."""
        if fused:
            from maskgate.worker.model.triton_norm import add_rms_norm  # triton: CUDA only

            return add_rms_norm(x, residual, self.weight, self.eps), (
                x if residual is None else residual
            )
        if residual is not None:
            x = x + residual
        return self(x), x


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32, with linear or llama3 scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        # Llama 3.1 scaling: wavelengths longer than original_len / low_freq_factor are slowed
        # down by `factor`, shorter than original_len / high_freq_factor are kept, and the band
        # in between blends the two linearly in original_len / wavelength.
        wavelen = 2 * math.pi / inv_freq
        ratio = rope.original_max_position_embeddings / wavelen
        blend = (ratio - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        slow = inv_freq / rope.factor
        scaled = torch.where(ratio < rope.low_freq_factor, slow, inv_freq)
        blended = (1 - blend) * inv_freq / rope.factor + blend * inv_freq
        medium = (ratio >= rope.low_freq_factor) & (ratio <= rope.high_freq_factor)
        return torch.where(medium, blended, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Computes cos/sin for the given positions once per step; every layer reuses them."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        # positions: [N] int64 -> cos, sin: [N, 1, head_dim] (broadcast over heads)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, head_dim]; the rotate-half layout of Hugging Face Llama checkpoints."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if fused:
            from maskgate.worker.model.triton_norm import silu_mul  # triton: CUDA only

            return self.down_proj(silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def rope_and_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm: RMSNorm | None,
    k_norm: RMSNorm | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The torch path of triton_rope.rope_and_store: q: [N, H, D], k, v: [N, KVH, D];
    optional per-head norms (Qwen3), rope, then k and v written at [slot, :, position] of
    the caches [slots, KVH, max_len, D]. Returns the rotated q."""
    if q_norm is not None and k_norm is not None:
        q, k = q_norm(q), k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache[slots, :, positions] = k
    v_cache[slots, :, positions] = v
    return q
