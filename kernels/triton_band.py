"""Pass 1 (the only full read of the logits): per-chunk statistics and band candidates.

Grid (B, n_chunks). Each program owns CHUNK logits of one row and writes
  chunk max m_c, sum exp(z - m_c) s_c, the largest unwritten z d_c, NaN / +inf flags,
  and up to KC candidates: the chunk's tokens with z >= max(m_c - DELTA, t_c), packed as
  order keys, where t_c is found by bisection when more than KC tokens lie in the band.
Every token with z > D = max_c d_c is then among the candidates (the resolve kernel relies on
this), so the exact support can be decided from the candidates whenever it lies above D.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_common import EMPTY_KEY, pack_key, scale


@triton.jit
def band_kernel(
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    cand_ptr,  # [B, n_chunks * KC] int64 order keys (EMPTY_KEY in unused slots)
    m_ptr,  # [B, n_chunks] float32 chunk max of z (NaN-free)
    s_ptr,  # [B, n_chunks] float32 sum over finite z of exp(z - m_c)
    d_ptr,  # [B, n_chunks] float32 max z among tokens not written as candidates
    flag_ptr,  # [B, n_chunks] int32 bit 0: NaN seen, bit 1: +inf seen
    stride_x,
    vocab,
    n_chunks,
    CHUNK: tl.constexpr,
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NBISECT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = ids < vocab
    x = tl.load(x_ptr + row * stride_x + ids, mask=inside, other=float("-inf"))
    z = scale(x.to(tl.float32), tl.load(temp_ptr + row))
    is_nan = z != z
    flags = tl.max(is_nan.to(tl.int32), axis=0) | (
        tl.max((z == float("inf")).to(tl.int32), axis=0) * 2
    )
    z = tl.where(is_nan, float("-inf"), z)
    m = tl.max(z, axis=0)
    finite = z > float("-inf")
    s = tl.sum(tl.where(finite, tl.exp(z - m), 0.0), axis=0)

    # Band below the chunk max; shrink it by bisection when it holds more than KC tokens.
    lo = m - DELTA
    hi = m
    count = tl.sum((finite & (z >= lo)).to(tl.int32), axis=0)
    if count > KC:
        for _ in range(NBISECT):
            mid = lo + (hi - lo) * 0.5
            over = tl.sum((z >= mid).to(tl.int32), axis=0) > KC
            lo = tl.where(over, mid, lo)
            hi = tl.where(over, hi, mid)
        lo = hi
    band = finite & (z >= lo)
    # Ties at the threshold can still exceed KC: keep the lowest ids (design order).
    rank = tl.cumsum(band.to(tl.int32), axis=0) - 1
    write = band & (rank < KC)
    n_written = tl.sum(write.to(tl.int32), axis=0)
    d = tl.max(tl.where(write, float("-inf"), z), axis=0)

    base = row * n_chunks * KC + chunk * KC
    tl.store(cand_ptr + base + rank, pack_key(z, ids.to(tl.int64)), mask=write)
    slots = tl.arange(0, KC)
    tl.store(cand_ptr + base + slots, tl.full([KC], EMPTY_KEY, tl.int64), mask=slots >= n_written)
    stat = row * n_chunks + chunk
    tl.store(m_ptr + stat, m)
    tl.store(s_ptr + stat, s)
    tl.store(d_ptr + stat, d)
    tl.store(flag_ptr + stat, flags)
