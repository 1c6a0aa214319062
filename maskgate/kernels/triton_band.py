"""Pass 1 (the only full read of the logits): per-chunk statistics and band candidates.

Grid (B, n_chunks). Each program owns CHUNK logits of one row and writes
  m_c  = max z of the chunk, s_c = sum exp(z - m_c) (NaN when the chunk holds a NaN or +inf),
  d_c  = the largest z among the tokens it did not write as candidates,
  and up to KC candidates as (z, id) keys (z exact): the tokens with x >= max(x_max - DELTA * T, t_c), where the
  threshold t_c is found by bisection when more than KC tokens lie in that band.
Every token with z > D = max_c d_c is then a candidate (resolve_kernel relies on this).

The per-token work stays in x (logit) space: z = x / T is monotone in x, so thresholds, maxima
and the "largest unwritten" all map through one scalar round-to-nearest division, and only the
few candidates get their exact z (as they are written). That keeps this pass near memory speed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton_common import EMPTY_KEY, GREEDY_T, exact_z, pack_key


@triton.jit
def band_kernel(
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    cand_key_ptr,  # [B, n_chunks * KC] int64 candidate (z, id) keys (EMPTY_KEY: unused)
    m_ptr,  # [B, n_chunks] float32 chunk max of z
    s_ptr,  # [B, n_chunks] float32 sum exp(z - m_c); NaN flags a NaN or +inf in the chunk
    d_ptr,  # [B, n_chunks] float32 max z among tokens not written as candidates
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
    x = tl.load(x_ptr + row * stride_x + ids, mask=inside, other=float("-inf")).to(tl.float32)
    temp = tl.load(temp_ptr + row)
    t = tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)  # greedy rows: z = x
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk sums to 0, not NaN
    # NaN propagates into s, and so does +inf (inf - inf): both mark the row as bad.
    s = tl.sum(tl.exp((x - m_safe) * (1.0 / t)), axis=0)

    # Band below the chunk max; shrink it by bisection when it holds more than KC tokens.
    finite = x > float("-inf")
    lo = m - DELTA * t
    hi = m
    count = tl.sum((finite & (x >= lo)).to(tl.int32), axis=0)
    if count > KC:
        for _ in range(NBISECT):
            mid = lo + (hi - lo) * 0.5
            over = tl.sum((x >= mid).to(tl.int32), axis=0) > KC
            lo = tl.where(over, mid, lo)
            hi = tl.where(over, hi, mid)
        lo = hi
    band = finite & (x >= lo)
    # Ties at the threshold can still exceed KC: keep the lowest ids (design order).
    rank = tl.cumsum(band.to(tl.int32), axis=0) - 1
    write = band & (rank < KC)
    n_written = tl.sum(write.to(tl.int32), axis=0)
    d = tl.max(tl.where(write, float("-inf"), x), axis=0)

    store_chunk(
        cand_key_ptr,
        m_ptr,
        s_ptr,
        d_ptr,
        row * n_chunks + chunk,
        KC,
        x,
        ids,
        rank,
        write,
        n_written,
        m,
        s,
        d,
        t,
    )


@triton.jit
def store_chunk(
    cand_key_ptr,
    m_ptr,
    s_ptr,
    d_ptr,
    stat,
    KC: tl.constexpr,
    x,
    ids,
    rank,
    write,
    n_written,
    m,
    s,
    d,
    t,
):
    """Writes one chunk's part of the pass-1 contract: the candidates where `write` holds
    (slot `rank`) as packed (z, id) keys with their exact z, then store_stats."""
    keys = pack_key(exact_z(x, t), ids.to(tl.int64))
    tl.store(cand_key_ptr + stat * KC + rank, keys, mask=write)
    store_stats(cand_key_ptr, m_ptr, s_ptr, d_ptr, stat, KC, n_written, m, s, d, t)


@triton.jit
def store_stats(cand_key_ptr, m_ptr, s_ptr, d_ptr, stat, KC: tl.constexpr, n_written, m, s, d, t):
    """EMPTY_KEY in the chunk's slots from n_written on, and m_c, s_c, d_c (x-space maxima m
    and d)."""
    slots = tl.arange(0, KC)
    tl.store(
        cand_key_ptr + stat * KC + slots,
        tl.full([KC], EMPTY_KEY, tl.int64),
        mask=slots >= n_written,
    )
    # z = RN(x / T) is monotone in x, so the maxima map through one division each.
    tl.store(m_ptr + stat, tl.math.div_rn(m, t))
    tl.store(s_ptr + stat, s)
    tl.store(d_ptr + stat, tl.math.div_rn(d, t))
