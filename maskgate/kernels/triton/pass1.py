"""Pass 1, the one full read of the logits: per-segment statistics and band candidates.

Grid (B, n_chunks). A program owns a segment of SEG tokens (many tiles of W) of one row, and
every lane (one position of the [W] tile, two per thread) streams down its column with
elementwise work only, no block-wide step inside the read loop:

* the lane's two largest tokens (value, tile index), first occurrences first on ties;
* d, the largest token the lane let go (every other token of the column is <= d);
* s, the lane's sum of exp((x - t1) / T) kept relative to its own running max t1, updated
  with one exp per token: x <= t1 adds exp((x - t1) / T), a new max rescales s by
  exp((t1 - x) / T) and adds 1 (both are exp(-|x - t1| / T)).

The block-wide work happens once per segment: max and sum over the lanes, then the band cut
of the 2W lane tops (a search over a count, in quarters), one scan to place the written
candidates, and d_c, in six block-wide steps that leave the tops where the loop holds them.
Every warp runs this once per segment, so its instructions cost issue slots as well as
latency: narrowing it took pass 1 from 37.6 to 32.9 us on the H200 (B = 128, V = 151936,
fp32; a plain read of the logits: 21.4). A token that is not a lane top is <= its lane's d,
a lane top that is not written is <= the cut, so every z > d_c of the segment is written:
the band stays provably complete.

Outputs per segment c (resolve_kernel's contract; a segment is a "chunk" there):
  m_c = max z, s_c = sum exp(z - m_c) (NaN when the segment holds a NaN or +inf),
  up to KC candidates as (z, id) keys with z exact, EMPTY_KEY in unused slots, in lane
  order (resolve_kernel does not depend on the order of a chunk's candidates),
  d_c = the largest z among the tokens not written.
Every token with z > D = max_c d_c is then a candidate. When more than KC lane tops tie at
the segment max, KC of them are written, always including the lowest id (greedy rows take
it), and d_c = m_c.

The per-token work stays in x (logit) space: z = x / T is monotone in x, so thresholds and
maxima map through one round-to-nearest division each, and only the written candidates get
their exact z.

The end of segment (the cut and the writes, and the reread of collided lanes) is band.py's;
with RACE, the race of the rows nothing truncates is race.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from maskgate.kernels.triton.band import cut_and_write, ge5, reread_and_write
from maskgate.kernels.triton.common import FLT_MAX, GREEDY_T, add6, quarters
from maskgate.kernels.triton.race import race_row

LOG2E = tl.constexpr(1.4426950408889634)
SHORT_TILES = tl.constexpr(8)  # segments of at most this many tiles are read unrolled


@triton.jit
def _lane_step(x, t1, i1, t2, i2, d, s, it, nc):
    """One token per lane into the lane's state (all [W]); nc = -log2(e) / T (negative, so
    |x - t1| * nc is one multiply with an operand modifier)."""
    gt1 = x > t1
    gt2 = x > t2
    d = tl.maximum(d, tl.where(gt2, t2, x))  # what the lane lets go
    # t1 taken no lower than -FLT_MAX: a -inf x then gives exp(-inf) = 0, not the NaN of
    # -inf - -inf (one max instead of a compare and a select); a NaN x stays NaN.
    e = tl.exp2(tl.abs(x - tl.maximum(t1, -FLT_MAX)) * nc)
    s = tl.where(gt1, s * e + 1.0, s + e)
    t2 = tl.where(gt1, t1, tl.where(gt2, x, t2))
    i2 = tl.where(gt1, i1, tl.where(gt2, it, i2))
    t1 = tl.where(gt1, x, t1)
    i1 = tl.where(gt1, it, i1)
    return t1, i1, t2, i2, d, s


@triton.jit
def _rotate(x1, x2, x_next, LOOK: tl.constexpr):
    """The LOOK tiles in flight move up one: (the tile to work on next, the one after it, the
    one after that); slots past LOOK repeat the last."""
    if LOOK == 3:
        return x1, x2, x_next
    if LOOK == 2:
        return x1, x_next, x_next
    return x_next, x_next, x_next


@triton.jit
def _lane_tile(x, t1, i1, t2, i2, d, s, it, nc):
    """One tile (raw logits) into the lanes' state."""
    return _lane_step(x.to(tl.float32), t1, i1, t2, i2, d, s, it, nc)


@triton.jit
def _stream(ptrs, end, nc, SEG: tl.constexpr, W: tl.constexpr, LOOK: tl.constexpr):
    """The segment's read: every lane's (t1, i1, t2, i2, d, s) over its column of the end
    tokens at ptrs; nc = -log2(e) / T."""
    lanes = tl.arange(0, W)
    t1 = tl.full([W], float("-inf"), tl.float32)
    t2 = t1
    d = t1
    s = tl.zeros([W], tl.float32)
    i1 = tl.full([W], -1, tl.int32)
    i2 = i1
    if SEG // W <= SHORT_TILES:
        # A short segment (small batches: 4 tiles at B = 1) is unrolled whole, so all its
        # reads are in flight at once instead of one tile ahead (a loop of a few iterations
        # would wait for each read in turn).
        for it in tl.static_range(SEG // W):
            x = tl.load(ptrs + it * W, mask=it * W + lanes < end, other=float("-inf"))
            t1, i1, t2, i2, d, s = _lane_tile(x, t1, i1, t2, i2, d, s, it, nc)
    else:
        n_tiles = (end + W - 1) // W
        n_full = end // W
        # Tiles LOOK .. n_full - 1 lie wholly inside the segment: their reads need no mask (a
        # masked read costs 64-bit bound compares per tile, about a tenth of the loop's
        # work). Each iteration issues the read LOOK tiles (1-3) ahead of the tile it works
        # on; the steps are the same, in the same order, whatever LOOK.
        x = tl.load(ptrs, mask=lanes < end, other=float("-inf"))
        x1 = x
        if LOOK >= 2:
            x1 = tl.load(ptrs + W, mask=W + lanes < end, other=float("-inf"))
        x2 = x1
        if LOOK == 3:
            x2 = tl.load(ptrs + 2 * W, mask=2 * W + lanes < end, other=float("-inf"))
        for it in range(0, n_full - LOOK):
            x_next = tl.load(ptrs + (it + LOOK) * W)
            t1, i1, t2, i2, d, s = _lane_tile(x, t1, i1, t2, i2, d, s, it, nc)
            x, x1, x2 = _rotate(x1, x2, x_next, LOOK)
        for it in range(tl.maximum(n_full - LOOK, 0), n_tiles):  # the last full tiles, a partial
            nxt = (it + LOOK) * W
            x_next = tl.load(ptrs + nxt, mask=nxt + lanes < end, other=float("-inf"))
            t1, i1, t2, i2, d, s = _lane_tile(x, t1, i1, t2, i2, d, s, it, nc)
            x, x1, x2 = _rotate(x1, x2, x_next, LOOK)
    return t1, i1, t2, i2, d, s


@triton.jit
def lanes_pass(
    row,
    seg,
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    outs,  # (cand_key [B, n_chunks * KC] int64, m_c, s_c, d_c [B, n_chunks] float32)
    stride_x,
    vocab,
    n_chunks,
    SEG: tl.constexpr,  # tokens per program, a multiple of W
    W: tl.constexpr,  # lanes
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NBISECT: tl.constexpr,
    # > 0: a lane with three tokens in the band reads its column again when its segment's
    # floor has fewer tops than this above it; 0: never
    REREAD_BELOW: tl.constexpr,
    REREAD_LANES: tl.constexpr,  # collided lanes read again at most (a power of two)
    REREAD_TILES: tl.constexpr,  # tiles a segment, rounded up to a power of two
    race,  # (topk, topp, minp, seed, step, g, w) pointers when RACE (see band_lanes_kernel)
    RACE: tl.constexpr,
    HAS_STEP: tl.constexpr,
    LOOK: tl.constexpr,  # tiles read ahead of the loop's work (1, 2 or 3)
):
    """One segment of a row: pass 1's whole work for program (row, seg): the read, the
    segment's counts, its cut and writes (after reading collided lanes again, where they
    matter), and the race."""
    start = seg * SEG
    temp = tl.load(temp_ptr + row)
    t = tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)  # greedy rows: z = x
    c = LOG2E / t
    lanes = tl.arange(0, W)
    x_seg = x_ptr + row * stride_x + start
    end = tl.minimum(vocab - start, SEG)  # tokens of this segment
    t1, i1, t2, i2, d, s = _stream(x_seg + lanes, end, -c, SEG, W, LOOK)
    t3 = tl.full([W], float("-inf"), tl.float32)  # a third top only after a reread
    i3 = tl.full([W], -1, tl.int32)

    # The segment's statistics, cut and slots. Every block-wide step (a reduction or a scan)
    # pays barriers and shared-memory round trips, and every warp runs all of this once per
    # segment, so the steps are few and narrow: the max and d; the sum with the counts at lo,
    # the quarter points and the max; two more quartering steps only when more than KC lie
    # in the band (6 halvings in all); the largest top left out; one scan to place the
    # written tops. The tops stay in the loop's layout: no step moves them between threads.
    m, d_lanes = tl.reduce((t1, d), 0, _max2)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf segment sums to 0, not NaN
    # NaN propagates into s, and so does +inf (its lane rescale is inf - inf).
    s_lanes = s * tl.exp2((t1 - m_safe) * c)
    # lo >= -FLT_MAX, so a count at or above it skips the -inf that pads unused lane tops.
    lo = tl.maximum(tl.maximum(m - DELTA * t, d_lanes), -FLT_MAX)
    hi = m
    q1, q2, q3 = quarters(lo, hi)
    g_lo, g1, g2, g3, g_hi = ge5(t1, t2, t3, (lo, q1, q2, q3, hi), 2)
    s_sum, n_lo, c1, c2, c3, n_hi = tl.reduce((s_lanes, g_lo, g1, g2, g3, g_hi), 0, add6)
    stat = row * n_chunks + seg
    tops = (t1, i1, t2, i2, t3, i3)
    counts = (lo, hi, q1, q2, q3, n_lo, c1, c2, c3, n_hi)
    seg_stats = (m, s_sum, d_lanes, t, start, stat)
    if REREAD_BELOW > 0:
        # A lane that let go a token within DELTA of the segment max held three or more of
        # the band, and that token is the floor d_lanes. When fewer than REREAD_BELOW tops
        # lie above it (the segment's best tokens, where a row's support lies), such lanes
        # read their columns again: the floor drops and the row needs no rescue in resolve.
        # A CPU count on 1024 Zipf rows (top-p 0.95) at the shape of B >= 128 (10 segments a
        # row): with REREAD_BELOW 16, 0.19% of segments read again and no row is left to the
        # rescue, against 8 rows without (32: 1.7% of segments, also none left; the H200
        # runs 16 faster, see config.REREAD_BELOW).
        lo0 = tl.maximum(m - DELTA * t, -FLT_MAX)
        if (d_lanes >= lo0) & (n_lo < REREAD_BELOW):
            reread_and_write(
                x_seg,
                end,
                tops,
                d,
                lo0,
                seg_stats,
                outs,
                KC,
                NBISECT,
                W,
                REREAD_LANES,
                REREAD_TILES,
            )
        else:
            cut_and_write(tops, counts, seg_stats, outs, KC, NBISECT, 2, W)
    else:
        cut_and_write(tops, counts, seg_stats, outs, KC, NBISECT, 2, W)
    if RACE:
        race_row(
            row,
            x_ptr + row * stride_x,
            temp_ptr,
            race,
            vocab,
            n_chunks,
            end,
            t,
            start,
            stat,
            HAS_STEP,
            W,
        )


@triton.jit
def _max2(a0, a1, b0, b1):
    return tl.maximum(a0, b0), tl.maximum(a1, b1)


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
    mask_sizes_ptr=None,  # [B] int64, set to -1 for resolve_kernel's pack_row when CLEAR
    CLEAR: tl.constexpr = False,
    PDL: tl.constexpr = False,  # programmatic dependent launch on both sides (sm_90+)
    topk_ptr=None,  # RACE: the rows' parameters ([B] int32, float32, float32, int64 x2)
    topp_ptr=None,
    minp_ptr=None,
    seed_ptr=None,
    step_ptr=None,
    g_ptr=None,  # RACE: [B, n_chunks] float32 the winner's z + g (rows nothing truncates)
    w_ptr=None,  # RACE: [2, B, n_chunks] int64 the winner's (z, id) key, finite tokens
    RACE: tl.constexpr = False,
    HAS_STEP: tl.constexpr = False,
    REREAD_BELOW: tl.constexpr = 0,
    REREAD_LANES: tl.constexpr = 8,
    REREAD_TILES: tl.constexpr = 32,
    LOOK: tl.constexpr = 1,  # tiles read ahead of the loop's work (1, 2 or 3)
):
    if PDL:
        # Launched as a dependent of the kernel before (launch_pdl): wait for it to finish
        # and its writes to be visible before any read or write. Then resolve_kernel may
        # start launching; it waits for this grid in turn.
        gdc_wait()
        gdc_launch_dependents()
    if CLEAR:  # the row's first segment
        tl.store(mask_sizes_ptr + tl.program_id(0), -1, mask=tl.program_id(1) == 0)
    lanes_pass(
        tl.program_id(0).to(tl.int64),
        tl.program_id(1),
        x_ptr,
        temp_ptr,
        (cand_key_ptr, m_ptr, s_ptr, d_ptr),
        stride_x,
        vocab,
        n_chunks,
        SEG,
        W,
        KC,
        DELTA,
        NBISECT,
        REREAD_BELOW,
        REREAD_LANES,
        REREAD_TILES,
        (topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr, g_ptr, w_ptr),
        RACE,
        HAS_STEP,
        LOOK,
    )
