"""Triton decode attention: one query token per row, grouped-query, over the slot KV cache
read in place (no gather of each row's keys, no mask tensor).

Row b attends to keys [lo, pos_b] of slot slots[b], lo = pos_b - window + 1 with a sliding
window, else 0; stale entries past pos_b are never loaded. One program handles the G query
heads of one KV head (so each key is read once per row, not G times) over one split of the
keys; with several splits (flash-decoding, for long contexts at small batch, where rows x
KV heads alone cannot fill the GPU), each split writes a partial (max, sum, acc) and a second
kernel combines them. The split count is fixed by the caller's key bound, not by the data,
so a launch is capturable in a CUDA graph. CUDA only; attention.attend is the CPU path and
the test oracle.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from maskgate.kernels import FP_FUSION

BLOCK_N = 64  # keys per inner iteration
MIN_SPLIT_KEYS = 256  # never split below this many keys per program
MAX_SPLITS = 32
TARGET_PROGRAMS = 264  # ~2 waves of an H100/H200's 132 SMs


@triton.jit(do_not_specialize=["part", "window"])
def _decode_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    slot_ptr,
    pos_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    q_row,
    c_slot,
    c_head,
    c_pos,
    scale_log2,
    window,
    part,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * G
    pos = tl.load(pos_ptr + b)
    slot = tl.load(slot_ptr + b)
    start = (split * part).to(tl.int64)
    if HAS_WINDOW:
        start = tl.maximum(start, pos - window + 1)
    end = tl.minimum(pos + 1, (split + 1) * part)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_ok = g < G
    d_ok = d < D
    heads = kvh * G + g  # query heads of this KV head
    q = tl.load(
        q_ptr + b * q_row + heads[:, None] * D + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    base = slot * c_slot + kvh * c_head
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    lsum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for n0 in range(start, end, BLOCK):
        keys = n0 + tl.arange(0, BLOCK)
        k_ok = keys < end
        at = base + keys[:, None] * c_pos + d[None, :]
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + at, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        qk = tl.where(k_ok[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + at, mask=kv_mask, other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m = m_new
    if SPLIT:
        # Partials [B, heads, splits(, D)] float32; an empty split leaves m=-inf, l=0.
        at = (b * num_heads + heads) * tl.num_programs(2) + split
        tl.store(m_ptr + at, m, mask=g_ok)
        tl.store(l_ptr + at, lsum, mask=g_ok)
        tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
    else:
        out = acc / lsum[:, None]
        tl.store(
            out_ptr + (b * num_heads + heads)[:, None] * D + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=g_ok[:, None] & d_ok[None, :],
        )


@triton.jit(do_not_specialize=["num_splits"])
def _combine_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    num_splits,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * heads + head
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < num_splits
    m = tl.load(m_ptr + row * num_splits + s, mask=s_ok, other=float("-inf"))
    lsum = tl.load(l_ptr + row * num_splits + s, mask=s_ok, other=0.0)
    mask = s_ok[:, None] & (d < D)[None, :]
    acc = tl.load(acc_ptr + (row * num_splits + s)[:, None] * D + d[None, :], mask=mask, other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(s_ok & (m > float("-inf")), tl.exp2(m - top), 0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(lsum * w, axis=0)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def num_splits_for(rows: int, kv_heads: int, max_keys: int) -> int:
    """Splits per (row, KV head): enough programs for ~2 waves, >= MIN_SPLIT_KEYS keys each."""
    by_keys = triton.cdiv(max_keys, MIN_SPLIT_KEYS)
    by_grid = triton.cdiv(TARGET_PROGRAMS, max(1, rows * kv_heads))
    return max(1, min(by_keys, by_grid, MAX_SPLITS))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    sliding_window: int | None,
    max_keys: int,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q: [B, H, D] (rows may be strided, heads and dims contiguous); caches: [slots, KVH,
    max_len, D]; slots, positions: [B] int64 (the query's position; keys 0..pos are valid).
    max_keys: an upper bound on pos + 1 over the rows (sets the split count, so it must not
    depend on device data inside a CUDA graph). Returns [B, H, D] in q's dtype."""
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    if heads % kv_heads or k_cache.shape[3] != dim or q.stride(2) != 1 or q.stride(1) != dim:
        raise ValueError(
            f"q [{rows}, {heads}, {dim}] (strides {q.stride()}) does not fit caches of shape "
            f"{tuple(k_cache.shape)}: heads must be a multiple of KV heads, heads and dims "
            "contiguous"
        )
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("k and v caches must share strides with a unit last stride")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError("q and the caches must share a dtype")
    if slots.shape != (rows,) or positions.shape != (rows,):
        raise ValueError("slots and positions must be [B]")
    if not 1 <= max_keys <= k_cache.shape[2]:
        raise ValueError(f"max_keys={max_keys} outside [1, {k_cache.shape[2]}]")
    out = torch.empty((rows, heads, dim), dtype=q.dtype, device=q.device)
    if rows == 0:
        return out
    group = heads // kv_heads
    splits = num_splits or num_splits_for(rows, kv_heads, max_keys)
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"num_splits={splits} outside [1, {MAX_SPLITS}]")
    part = triton.cdiv(triton.cdiv(max_keys, splits), BLOCK_N) * BLOCK_N
    if splits > 1:
        m = torch.empty((rows, heads, splits), dtype=torch.float32, device=q.device)
        lsum = torch.empty_like(m)
        acc = torch.empty((rows, heads, splits, dim), dtype=torch.float32, device=q.device)
    else:
        m = lsum = acc = out  # unused by the single-split variant
    block_d = max(16, triton.next_power_of_2(dim))
    _decode_attn_kernel[(rows, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        slots,
        positions,
        out,
        m,
        lsum,
        acc,
        q.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        math.log2(math.e) / math.sqrt(dim),
        sliding_window or 0,
        part,
        G=group,
        D=dim,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK=BLOCK_N,
        SPLIT=splits > 1,
        HAS_WINDOW=sliding_window is not None,
        # float32 models: exact products (the default would round them to TF32).
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
        enable_fp_fusion=FP_FUSION,
    )
    if splits > 1:
        _combine_kernel[(rows * heads,)](
            m,
            lsum,
            acc,
            out,
            splits,
            D=dim,
            BLOCK_S=MAX_SPLITS,
            BLOCK_D=block_d,
            num_warps=4,
            enable_fp_fusion=FP_FUSION,
        )
    return out
