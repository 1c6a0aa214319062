"""Triton kernel: rotary embedding on q and k in one pass, with Qwen3's per-head q/k RMSNorm
in front when the model has it, and k and v stored straight into the slot KV cache.

This replaces, per layer and step, the torch path's ~10 rope kernels, the two q/k norms and
the two advanced-indexing writes into the cache. The rotation uses the cos/sin tables the
model already computes once per step (RotaryEmbedding, with linear or llama3 scaling), in
the model dtype, and rounds as `x * cos + rotate_half(x) * sin` does in torch.
CUDA only; layers.rope_and_store is the CPU path and the test oracle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from maskgate.kernels import FP_FUSION


@triton.jit
def _rope_store_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    slot_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    qkv_row,
    cos_row,
    c_slot,
    c_head,
    c_pos,
    eps,
    H: tl.constexpr,
    KVH: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    # One program per token; a [BLOCK_H, BLOCK_HALF] tile holds the two halves of every head.
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    col_ok = cols < HALF
    row = qkv_ptr + t * qkv_row
    c = tl.load(cos_ptr + t * cos_row + cols, mask=col_ok, other=0.0)
    s = tl.load(sin_ptr + t * cos_row + cols, mask=col_ok, other=0.0)

    # q heads, in place in the qkv buffer.
    ok = (heads < H) & col_ok
    q1 = tl.load(row + heads * (2 * HALF) + cols, mask=ok, other=0.0)
    q2 = tl.load(row + heads * (2 * HALF) + HALF + cols, mask=ok, other=0.0)
    if QK_NORM:
        q1, q2 = _head_norm(q1, q2, qw_ptr, cols, col_ok, eps, HALF)
    r1, r2 = _rotate(q1, q2, c, s)
    tl.store(row + heads * (2 * HALF) + cols, r1, mask=ok)
    tl.store(row + heads * (2 * HALF) + HALF + cols, r2, mask=ok)

    # k heads -> the cache only (attention reads k from there); v copied unchanged.
    ok = (heads < KVH) & col_ok
    k_at = row + H * 2 * HALF + heads * (2 * HALF)
    k1 = tl.load(k_at + cols, mask=ok, other=0.0)
    k2 = tl.load(k_at + HALF + cols, mask=ok, other=0.0)
    if QK_NORM:
        k1, k2 = _head_norm(k1, k2, kw_ptr, cols, col_ok, eps, HALF)
    r1, r2 = _rotate(k1, k2, c, s)
    slot = tl.load(slot_ptr + t)
    pos = tl.load(pos_ptr + t)
    dst = slot * c_slot + heads * c_head + pos * c_pos + cols
    tl.store(kc_ptr + dst, r1, mask=ok)
    tl.store(kc_ptr + dst + HALF, r2, mask=ok)
    v_at = k_at + KVH * 2 * HALF
    tl.store(vc_ptr + dst, tl.load(v_at + cols, mask=ok), mask=ok)
    tl.store(vc_ptr + dst + HALF, tl.load(v_at + HALF + cols, mask=ok), mask=ok)


@triton.jit
def _rotate(x1, x2, c, s):
    """Rotate-half on the two halves; each product and the sum rounded to the model dtype."""
    dt = x1.dtype
    a = (x1.to(tl.float32) * c.to(tl.float32)).to(dt).to(tl.float32)
    b = (x2.to(tl.float32) * s.to(tl.float32)).to(dt).to(tl.float32)
    out1 = (a - b).to(dt)
    a = (x2.to(tl.float32) * c.to(tl.float32)).to(dt).to(tl.float32)
    b = (x1.to(tl.float32) * s.to(tl.float32)).to(dt).to(tl.float32)
    return out1, (a + b).to(dt)


@triton.jit
def _head_norm(x1, x2, w_ptr, cols, col_ok, eps, HALF: tl.constexpr):
    """RMSNorm over each head's full head_dim (both halves), rounded as layers.RMSNorm does."""
    dt = x1.dtype
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    ms = (tl.sum(h1 * h1, axis=1) + tl.sum(h2 * h2, axis=1)) / (2 * HALF)
    rstd = (1.0 / tl.sqrt(ms + eps))[:, None]
    w1 = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    n1 = (w1 * (h1 * rstd).to(dt).to(tl.float32)).to(dt)
    n2 = (w2 * (h2 * rstd).to(dt).to(tl.float32)).to(dt)
    return n1, n2


def rope_and_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    """Rotate q in place inside qkv and write rotated k and v into the caches.

    qkv: [N, (H + 2 * KVH) * D], q then k then v columns (the fused projection's output).
    cos, sin: [N, 1, D] in qkv's dtype (halves equal, as RotaryEmbedding builds them).
    q_norm, k_norm: [D] weights (Qwen3) or None. caches: [slots, KVH, max_len, D].
    slots, positions: [N] int64. Returns q as a [N, H, D] view of qkv.
    """
    n, width = qkv.shape
    kv_heads, dim = k_cache.shape[1], k_cache.shape[3]
    if width != (num_heads + 2 * kv_heads) * dim or qkv.stride(1) != 1 or dim % 2:
        raise ValueError(
            f"qkv [{n}, {width}] does not hold {num_heads} q and {kv_heads} k/v heads of an "
            f"even head_dim {dim} with unit column stride"
        )
    if cos.shape != (n, 1, dim) or sin.shape != cos.shape or cos.stride() != sin.stride():
        raise ValueError(f"cos and sin must both be [{n}, 1, {dim}], got {tuple(cos.shape)}")
    if cos.stride(2) != 1 or cos.dtype != qkv.dtype or sin.dtype != qkv.dtype:
        raise ValueError("cos and sin must be in qkv's dtype with unit last stride")
    for c in (k_cache, v_cache):
        if c.dtype != qkv.dtype or c.stride(3) != 1 or c.stride() != k_cache.stride():
            raise ValueError("k and v caches must share strides and dtype, unit last stride")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    if slots.shape != (n,) or positions.shape != (n,):
        raise ValueError("slots and positions must be [N]")
    q = qkv[:, : num_heads * dim].view(n, num_heads, dim)
    if n == 0:
        return q
    half = dim // 2
    norm = q_norm is not None
    _rope_store_kernel[(n,)](
        qkv,
        cos,
        sin,
        q_norm if q_norm is not None else cos,
        k_norm if k_norm is not None else cos,
        slots,
        positions,
        k_cache,
        v_cache,
        qkv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        eps,
        H=num_heads,
        KVH=kv_heads,
        HALF=half,
        BLOCK_H=triton.next_power_of_2(max(num_heads, kv_heads)),
        BLOCK_HALF=triton.next_power_of_2(half),
        QK_NORM=norm,
        num_warps=4,
        enable_fp_fusion=FP_FUSION,
    )
    return q
