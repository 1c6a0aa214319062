"""Pass 1 with per-lane streaming tops: the contract of triton_band.band_kernel with no
block-wide work inside the read loop.

Why: band_kernel reduces, bisects, scans and cuts once per 2048-token chunk (23 block-wide
barriers per chunk against 3 for a plain read); each phase costs an SM a few hundred cycles
that the loads cannot hide, so it ran at 5.5x a plain read of the logits on the H200 (162 us
against 29 at B=128, V=151936, fp32; this kernel: 37.6 us, 8 launches a graph against the
floor's 21.5). Here a program owns a segment of SEG tokens (many tiles of W) and every lane
(one position of the [W] tile, a few per thread) streams down its column with elementwise
work only:

* the lane's two largest tokens (value, tile index), first occurrences first on ties
  (three with KEEP = 3: a row's support then has to put four tokens in one lane, not
  three, before the band floor lands inside it);
* d, the largest token the lane let go (every other token of the column is <= d);
* s, the lane's sum of exp((x - t1) / T) kept relative to its own running max t1, updated
  with one exp per token: x <= t1 adds exp((x - t1) / T), a new max rescales s by
  exp((t1 - x) / T) and adds 1 (both are exp(-|x - t1| / T)).

The block-wide work happens once per segment: max and sum over the lanes, then the band cut
of the 2W (3W) lane tops (a search over a count, in quarters), one scan to place the
written candidates, and d_c. A token that is not a lane top is <= its lane's d, a lane top
that is not written is <= the cut, so every z > d_c of the segment is written: the band
stays provably complete.

Outputs per segment c (resolve_kernel's contract; a segment is a "chunk" there):
  m_c = max z, s_c = sum exp(z - m_c) (NaN when the segment holds a NaN or +inf),
  up to KC candidates as (z, id) keys with z exact, EMPTY_KEY in unused slots, in lane
  order (resolve_kernel does not depend on the order of a chunk's candidates),
  d_c = the largest z among the tokens not written.
When more than KC lane tops tie at the segment max, KC of them are written, always including
the lowest id (greedy rows take it), and d_c = m_c.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_band import store_chunk
from kernels.triton_common import GREEDY_T, counts_at, keep_quarter, quarters

LOG2E = tl.constexpr(1.4426950408889634)
INT32_MAX = tl.constexpr(2**31 - 1)


@triton.jit
def _lane_step(x, t1, i1, t2, i2, d, s, it, c):
    """One token per lane into the lane's state (all [W]); c = log2(e) / T."""
    gt1 = x > t1
    gt2 = x > t2
    d = tl.maximum(d, tl.where(gt2, t2, x))  # what the lane lets go
    e = tl.exp2(-tl.abs(x - t1) * c)
    e = tl.where(x == float("-inf"), 0.0, e)  # -inf - -inf is NaN; a NaN x stays NaN
    s = tl.where(gt1, s * e + 1.0, s + e)
    t2 = tl.where(gt1, t1, tl.where(gt2, x, t2))
    i2 = tl.where(gt1, i1, tl.where(gt2, it, i2))
    t1 = tl.where(gt1, x, t1)
    i1 = tl.where(gt1, it, i1)
    return t1, i1, t2, i2, d, s


@triton.jit
def _lane_step3(x, t1, i1, t2, i2, t3, i3, d, s, it, c):
    """_lane_step for a lane that keeps its three largest tokens."""
    gt1 = x > t1
    gt2 = x > t2
    gt3 = x > t3
    d = tl.maximum(d, tl.where(gt3, t3, x))
    e = tl.exp2(-tl.abs(x - t1) * c)
    e = tl.where(x == float("-inf"), 0.0, e)
    s = tl.where(gt1, s * e + 1.0, s + e)
    t3 = tl.where(gt2, t2, tl.where(gt3, x, t3))
    i3 = tl.where(gt2, i2, tl.where(gt3, it, i3))
    t2 = tl.where(gt1, t1, tl.where(gt2, x, t2))
    i2 = tl.where(gt1, i1, tl.where(gt2, it, i2))
    t1 = tl.where(gt1, x, t1)
    i1 = tl.where(gt1, it, i1)
    return t1, i1, t2, i2, t3, i3, d, s


@triton.jit
def _lane_tile(x, t1, i1, t2, i2, t3, i3, d, s, it, c, KEEP: tl.constexpr):
    """One tile (raw logits) into the lanes' state; t3, i3 are only kept with KEEP 3."""
    x = x.to(tl.float32)
    if KEEP == 3:
        t1, i1, t2, i2, t3, i3, d, s = _lane_step3(x, t1, i1, t2, i2, t3, i3, d, s, it, c)
    else:
        t1, i1, t2, i2, d, s = _lane_step(x, t1, i1, t2, i2, d, s, it, c)
    return t1, i1, t2, i2, t3, i3, d, s


@triton.jit
def _tops(t1, t2, t3, pad, W: tl.constexpr, KEEP: tl.constexpr):
    """The lanes' kept tokens as rows of a [2, W] (KEEP 2) or [4, W] (KEEP 3, the fourth
    row pad) block."""
    if KEEP == 3:
        return tl.reshape(tl.join(tl.join(t1, t2), tl.join(t3, pad)), [W, 4]).trans(1, 0)
    else:
        return tl.join(t1, t2).trans(1, 0)


@triton.jit
def lanes_pass(
    row,
    seg,
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    cand_key_ptr,  # [B, n_chunks * KC] int64 candidate (z, id) keys (EMPTY_KEY: unused)
    m_ptr,  # [B, n_chunks] float32 segment max of z
    s_ptr,  # [B, n_chunks] float32 sum exp(z - m_c); NaN flags a NaN or +inf
    d_ptr,  # [B, n_chunks] float32 max z among tokens not written as candidates
    stride_x,
    vocab,
    n_chunks,
    SEG: tl.constexpr,  # tokens per program, a multiple of W
    W: tl.constexpr,  # lanes
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NBISECT: tl.constexpr,
    KEEP: tl.constexpr,  # tokens a lane keeps: 2 or 3
):
    """One segment of a row: pass 1's whole work for program (row, seg)."""
    start = seg * SEG
    temp = tl.load(temp_ptr + row)
    t = tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)  # greedy rows: z = x
    c = LOG2E / t
    lanes = tl.arange(0, W)
    ptrs = x_ptr + row * stride_x + start + lanes
    t1 = tl.full([W], float("-inf"), tl.float32)
    t2 = t1
    d = t1
    s = tl.zeros([W], tl.float32)
    i1 = tl.full([W], -1, tl.int32)
    i2 = i1
    t3 = t1  # KEEP == 3 only
    i3 = i1
    end = tl.minimum(vocab - start, SEG)  # tokens of this segment
    n_tiles = (end + W - 1) // W
    x = tl.load(ptrs, mask=lanes < end, other=float("-inf"))
    # Tiles 1 .. n_full - 1 lie wholly inside the segment: their reads need no mask (a
    # masked read costs 64-bit bound compares per tile, about a tenth of the loop's work).
    # Each iteration issues the next tile's read before this tile's work.
    n_full = end // W
    for it in range(0, n_full - 1):
        x_next = tl.load(ptrs + (it + 1) * W)
        t1, i1, t2, i2, t3, i3, d, s = _lane_tile(x, t1, i1, t2, i2, t3, i3, d, s, it, c, KEEP)
        x = x_next
    for it in range(tl.maximum(n_full - 1, 0), n_tiles):  # the last full tile, a partial one
        nxt = (it + 1) * W
        x_next = tl.load(ptrs + nxt, mask=nxt + lanes < end, other=float("-inf"))
        t1, i1, t2, i2, t3, i3, d, s = _lane_tile(x, t1, i1, t2, i2, t3, i3, d, s, it, c, KEEP)
        x = x_next

    m = tl.max(t1, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf segment sums to 0, not NaN
    # NaN propagates into s, and so does +inf (its lane rescale is inf - inf).
    s_sum = tl.sum(s * tl.exp2((t1 - m_safe) * c), axis=0)
    d_lanes = tl.max(d, axis=0)

    # The band cut over the lane tops, [2, W] (row 0 the firsts, row 1 the seconds) or
    # [4, W] with KEEP 3 (the thirds, then an empty row).
    top = _tops(t1, t2, t3, tl.full([W], float("-inf"), tl.float32), W, KEEP)
    tile = _tops(i1, i2, i3, tl.full([W], -1, tl.int32), W, KEEP)
    ids = start + tile * W + lanes[None, :]
    real = tile >= 0
    lo = tl.maximum(m - DELTA * t, d_lanes)
    hi = m
    count = tl.sum(tl.sum((real & (top >= lo)).to(tl.int32), axis=1), axis=0)
    if count > KC:
        # Invariant: more than KC lane tops at >= lo, at most KC at >= hi (or ties at the
        # max). Each step counts at three thresholds in one reduction and keeps the quarter
        # that crosses KC: NBISECT halvings in NBISECT / 2 reductions.
        for _ in range(NBISECT // 2):
            q1, q2, q3 = quarters(lo, hi)
            c1, c2, c3 = counts_at(real, top, q1, q2, q3, 1)
            c1, c2, c3 = tl.sum(c1, axis=0), tl.sum(c2, axis=0), tl.sum(c3, axis=0)
            lo, hi = keep_quarter(lo, hi, q1, q2, q3, c1, c2, c3, KC)
        lo = hi
    band = real & (top >= lo) & (top > float("-inf"))
    if KEEP == 3:
        flat = tl.reshape(band, [4 * W]).to(tl.int32)
        rank = tl.reshape(tl.cumsum(flat, axis=0) - 1, [4, W])
    else:
        flat = tl.reshape(band, [2 * W]).to(tl.int32)
        rank = tl.reshape(tl.cumsum(flat, axis=0) - 1, [2, W])
    write = band & (rank < KC)
    n_band = tl.sum(flat, axis=0)
    if n_band > KC:  # ties at the max beyond KC: KC - 1 of them and the lowest id
        lowest = band & (ids == tl.min(tl.min(tl.where(band, ids, INT32_MAX), axis=1), axis=0))
        late = tl.max(tl.max(tl.where(lowest, rank, 0), axis=1), axis=0) >= KC
        # Past the first KC in lane order: it takes the last slot from the KC-th.
        write = (band & (rank < tl.where(late, KC - 1, KC))) | lowest
        rank = tl.where(lowest, tl.minimum(rank, KC - 1), rank)
    n_written = tl.sum(tl.sum(write.to(tl.int32), axis=1), axis=0)
    left = tl.max(tl.max(tl.where(write, float("-inf"), top), axis=1), axis=0)
    d_seg = tl.maximum(d_lanes, left)

    store_chunk(
        cand_key_ptr,
        m_ptr,
        s_ptr,
        d_ptr,
        row * n_chunks + seg,
        KC,
        top,
        ids,
        rank,
        write,
        n_written,
        m,
        s_sum,
        d_seg,
        t,
    )


@triton.jit
def band_lanes_kernel(
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    cand_key_ptr,  # [B, n_chunks * KC] int64 candidate (z, id) keys (EMPTY_KEY: unused)
    m_ptr,  # [B, n_chunks] float32 segment max of z
    s_ptr,  # [B, n_chunks] float32 sum exp(z - m_c); NaN flags a NaN or +inf
    d_ptr,  # [B, n_chunks] float32 max z among tokens not written as candidates
    stride_x,
    vocab,
    n_chunks,
    SEG: tl.constexpr,  # tokens per program, a multiple of W
    W: tl.constexpr,  # lanes
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NBISECT: tl.constexpr,
    KEEP: tl.constexpr,
):
    lanes_pass(
        tl.program_id(0).to(tl.int64),
        tl.program_id(1),
        x_ptr,
        temp_ptr,
        cand_key_ptr,
        m_ptr,
        s_ptr,
        d_ptr,
        stride_x,
        vocab,
        n_chunks,
        SEG,
        W,
        KC,
        DELTA,
        NBISECT,
        KEEP,
    )
