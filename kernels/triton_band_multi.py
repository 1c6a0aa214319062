"""Pass 1 with a multi-threshold band cut: the same contract as triton_band.band_kernel, with
6 block-wide reductions per chunk instead of about 13.

Why: band_kernel finds each chunk's band threshold by a 6-step bisection (one block-wide
reduction per step, plus the count before it). On the H200 every reduction phase is serial
latency that the other programs on an SM do not hide, so pass 1 took 162 us at B=128,
V=151936 against 29 us for a read of the logits. Here one reduction over an [NT, CHUNK] tile
counts the tokens at or above NT thresholds at once, and a second one refines between the
two thresholds that bracket KC. Per chunk: max, sum-exp, two counts, the scan that compacts
the candidates, and the max of what was left out.

Each program handles G consecutive chunks and issues chunk g + 1's read before working on
chunk g, so the next read is in flight during the reductions.

Outputs, per chunk c (the contract of band_kernel, which resolve_kernel relies on):
  m_c = max z, s_c = sum exp(z - m_c) (NaN when the chunk holds a NaN or +inf),
  up to KC candidates (x, id) in ascending id order, -inf in unused slots,
  d_c = the largest z among the tokens not written (so every z > max_c d_c is a candidate).
The written set is {x >= thr} for a threshold thr between m - DELTA * T and m, except when
more than KC tokens tie at the chunk max: then the KC lowest ids of the tie (and d_c = m_c).
The threshold differs from band_kernel's (a grid of DELTA / ((NT - 1) * NT2) instead of a
bisection), so the candidate lists differ; both satisfy the contract.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_common import GREEDY_T


@triton.jit
def _counts(x, finite, thr):
    """x, finite [1, CHUNK]; thr [NT, 1] -> [NT, 1] #(x >= thr_j), in one reduction."""
    return tl.sum((finite & (x >= thr)).to(tl.int32), axis=1, keep_dims=True)


@triton.jit
def _pick(sel, vals, fill):
    """The entry of vals [NT, 1] where sel [NT, 1] holds (at most one), else fill; [1, 1]."""
    return tl.max(tl.where(sel, vals, fill), axis=0, keep_dims=True)


# Every tensor below is 2-D ([1, CHUNK], [NT, CHUNK], [NT, 1] or [1, 1]) on purpose: the
# [NT, CHUNK] counting tile puts NT inside each thread, and keeping the small [NT, 1] results
# in that layout makes the threshold choice a per-thread computation. 1-D [NT] vectors get a
# layout spread over the warps, and every pick among them costs two block-wide barriers.
@triton.jit
def _chunk(
    x,  # [1, CHUNK] float32
    ids,  # [1, CHUNK] int32
    t,
    row,
    chunk,
    n_chunks,
    cand_x_ptr,
    cand_id_ptr,
    m_ptr,
    s_ptr,
    d_ptr,
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NT: tl.constexpr,
    NT2: tl.constexpr,
):
    m = tl.max(x)  # scalars: they are stored, and a [1, 1] store needs a layout conversion
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk sums to 0, not NaN
    # NaN propagates into s, and so does +inf (inf - inf): both mark the row as bad.
    s = tl.sum(tl.exp((x - m_safe) * (1.0 / t)))
    finite = x > float("-inf")

    # Level 1: thresholds m - j * step, j = 0 .. NT - 1 (j = 0 counts the ties at the max).
    j = tl.arange(0, NT)[:, None]  # [NT, 1]
    step = DELTA * t / (NT - 1)
    # j = 0 is m itself (0 * step would be NaN when DELTA * T overflows to inf).
    thr1 = tl.where(j == 0, m, m - j.to(tl.float32) * step)
    cnt1 = _counts(x, finite, thr1)
    j1 = tl.max(tl.where(cnt1 <= KC, j, -1), axis=0, keep_dims=True)  # deepest fitting one
    at = j == tl.maximum(j1, 0)
    base_thr = _pick(at, thr1, float("-inf"))
    base_cnt = _pick(at, cnt1, 0)
    # Level 2: NT2 - 1 thresholds strictly between base_thr and the next (too deep) one; the
    # last slot repeats base_thr and is never picked.
    i = tl.arange(0, NT2)[:, None]  # [NT2, 1]
    thr2 = tl.where(i < NT2 - 1, base_thr - (i + 1).to(tl.float32) * (step / NT2), base_thr)
    cnt2 = _counts(x, finite, thr2)
    refine = (j1 >= 0) & (j1 < NT - 1)
    i2 = tl.max(tl.where(refine & (cnt2 <= KC) & (i < NT2 - 1), i, -1), axis=0, keep_dims=True)
    fine = i2 >= 0
    at2 = i == i2
    thr = tl.where(fine, _pick(at2, thr2, float("-inf")), base_thr)
    n_band = tl.where(fine, _pick(at2, cnt2, 0), base_cnt)

    band = finite & (x >= thr)
    # Ties at the max beyond KC (j1 < 0): keep the lowest ids; the unwritten ties give d = m.
    rank = tl.cumsum(band.to(tl.int32), axis=1) - 1
    write = band & (rank < KC)
    n_written = tl.minimum(n_band, KC)
    d = tl.max(tl.where(write, float("-inf"), x))

    base = (row * n_chunks + chunk) * KC
    tl.store(cand_x_ptr + base + rank, x, mask=write)
    tl.store(cand_id_ptr + base + rank, ids, mask=write)
    slots = tl.arange(0, KC)[None, :]
    tl.store(
        cand_x_ptr + base + slots,
        tl.full([1, KC], float("-inf"), tl.float32),
        mask=slots >= n_written,
    )
    stat = row * n_chunks + chunk
    # z = RN(x / T) is monotone in x, so the maxima map through one division each.
    tl.store(m_ptr + stat, tl.math.div_rn(m, t))
    tl.store(s_ptr + stat, s)
    tl.store(d_ptr + stat, tl.math.div_rn(d, t))


@triton.jit
def band_multi_kernel(
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    cand_x_ptr,  # [B, n_chunks * KC] float32 candidate logits (-inf in unused slots)
    cand_id_ptr,  # [B, n_chunks * KC] int32 candidate token ids
    m_ptr,  # [B, n_chunks] float32 chunk max of z
    s_ptr,  # [B, n_chunks] float32 sum exp(z - m_c); NaN flags a NaN or +inf in the chunk
    d_ptr,  # [B, n_chunks] float32 max z among tokens not written as candidates
    stride_x,
    vocab,
    n_chunks,
    G: tl.constexpr,  # chunks per program
    CHUNK: tl.constexpr,
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NT: tl.constexpr,  # thresholds of the first counting reduction (a power of two)
    NT2: tl.constexpr,  # thresholds of the second, between two of the first (a power of two)
):
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * G
    temp = tl.load(temp_ptr + row)
    t = tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)  # greedy rows: z = x
    x_row = x_ptr + row * stride_x
    ids = first * CHUNK + tl.arange(0, CHUNK)[None, :]  # [1, CHUNK]: see _chunk
    x_next = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
    for g in tl.static_range(G):
        x = x_next.to(tl.float32)
        ids_g = ids + g * CHUNK
        if g + 1 < G:  # issue the next chunk's read before this chunk's reductions
            nxt = ids_g + CHUNK
            x_next = tl.load(x_row + nxt, mask=nxt < vocab, other=float("-inf"))
        chunk = first + g
        if chunk < n_chunks:  # the last program's group may run past the row
            _chunk(
                x,
                ids_g,
                t,
                row,
                chunk,
                n_chunks,
                cand_x_ptr,
                cand_id_ptr,
                m_ptr,
                s_ptr,
                d_ptr,
                KC,
                DELTA,
                NT,
                NT2,
            )
