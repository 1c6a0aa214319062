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

With RACE (sample_triton sets it when a row of the launch asks for no mask), a row that
nothing truncates also gets, per segment, the Gumbel race's winner (docs/design.md, mask
semantics) over the segment's finite tokens: g_c its z + g, its (z, id) key, and the count
of finite tokens.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    FLT_MAX,
    GREEDY_T,
    INT32_MAX,
    add3,
    add5,
    add6,
    exact_z,
    gumbel,
    keep_quarter,
    pack_key,
    quarters,
    race_step,
    race_winner,
    row_keys,
    unpack_id,
    unpack_z,
    untruncated,
)

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
    g_lo, g1, g2, g3, g_hi = _ge5(t1, t2, t3, (lo, q1, q2, q3, hi), 2)
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
        # runs 16 faster, see band_config.REREAD_BELOW).
        lo0 = tl.maximum(m - DELTA * t, -FLT_MAX)
        if (d_lanes >= lo0) & (n_lo < REREAD_BELOW):
            _reread_and_write(
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
            _cut_and_write(tops, counts, seg_stats, outs, KC, NBISECT, 2, W)
    else:
        _cut_and_write(tops, counts, seg_stats, outs, KC, NBISECT, 2, W)
    if RACE:
        _race_row(
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
def _reread_and_write(
    x_seg,
    end,
    tops,  # (t1, i1, t2, i2, t3, i3) of the read
    d,  # [W] the largest token each lane let go
    lo0,  # the band's lower end, m - DELTA * t
    seg_stats,  # (m, s_sum, d_lanes, t, start, stat)
    outs,
    KC: tl.constexpr,
    NBISECT: tl.constexpr,
    W: tl.constexpr,
    REREAD_LANES: tl.constexpr,
    REREAD_TILES: tl.constexpr,
):
    """The collided lanes (d in the band) read their columns again (from L2: this program
    read them moments ago), all in one read, for the tile of their third token (d itself)
    and the largest token after it; then the segment is counted, cut and written with three
    tops a lane. Only here does the end of segment handle three tops; the common path keeps
    two."""
    t1, i1, t2, i2, t3, i3 = tops
    m, s_sum, d_lanes, t, start, stat = seg_stats
    # Most such segments hold more than REREAD_LANES collided lanes; the ones that matter
    # are those that let the largest tokens go, so a quartering search over d keeps at most
    # REREAD_LANES of them (a CPU count: the same rows leave the rescue as when every
    # collided lane reads again, at 4 lanes as at 16).
    col = d >= lo0
    if tl.sum(col.to(tl.int32), axis=0) > REREAD_LANES:
        d_lo = lo0
        d_hi = d_lanes
        for _ in tl.static_range(3):
            p1, p2, p3 = quarters(d_lo, d_hi)
            n1, n2, n3 = tl.reduce(
                ((d >= p1).to(tl.int32), (d >= p2).to(tl.int32), (d >= p3).to(tl.int32)),
                0,
                add3,
            )
            d_lo, d_hi = keep_quarter(d_lo, d_hi, p1, p2, p3, n1, n2, n3, REREAD_LANES)
        col = d >= d_hi
    i3, d4 = _reread(x_seg, end, (i1, i2, d, col), REREAD_TILES, W, REREAD_LANES)
    again = i3 >= 0
    t3 = tl.where(again, d, float("-inf"))  # the third token is what the lane let go
    d = tl.where(again, d4, d)
    d_lanes = tl.max(d, axis=0)
    lo = tl.maximum(lo0, d_lanes)
    hi = m
    q1, q2, q3 = quarters(lo, hi)
    n_lo, c1, c2, c3, n_hi = tl.reduce(_ge5(t1, t2, t3, (lo, q1, q2, q3, hi), 3), 0, add5)
    counts = (lo, hi, q1, q2, q3, n_lo, c1, c2, c3, n_hi)
    seg_stats = (m, s_sum, d_lanes, t, start, stat)
    _cut_and_write((t1, i1, t2, i2, t3, i3), counts, seg_stats, outs, KC, NBISECT, 3, W)


@triton.jit
def _race_row(
    row,
    x_row,
    temp_ptr,
    race,
    vocab,
    n_chunks,
    end,
    t,
    start,
    stat,
    HAS_STEP: tl.constexpr,
    W: tl.constexpr,
):
    """The race's part of a segment for a row nothing truncates: its winner's score, key and
    the segment's count of finite tokens. The row's parameters are loaded here (temperature
    again), not before the loop: values held across the loop and the cut made the compiler
    spill there, which cost every row (B = 128: 45.9 us against 43.9 on the H200)."""
    topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr, g_ptr, w_ptr = race
    whole = untruncated(
        tl.load(topk_ptr + row).to(tl.int64),
        tl.load(topp_ptr + row),
        tl.load(minp_ptr + row),
        tl.load(temp_ptr + row),
        vocab,
    )
    if whole:  # a row nothing truncates: its token is raced here
        seed = tl.load(seed_ptr + row)
        step = tl.full([], 0, tl.int64)
        if HAS_STEP:
            step = tl.load(step_ptr + row)
        k0, k1 = row_keys(seed, step)
        key, n = _race_segment(x_row, end, t, start, k0, k1, W)
        tl.store(g_ptr + stat, _race_score(key, k0, k1))
        tl.store(w_ptr + stat, key)
        tl.store(w_ptr + n_chunks * tl.num_programs(0) + stat, n)


@triton.jit
def _race_segment(x_row, end, t, start, k0, k1, W: tl.constexpr):
    """The Gumbel race over the segment's finite tokens, read again (from L2:
    this program read them moments ago): the winner's (z, id) key and the count of finite
    tokens. An untruncated row's support is every finite token, so the row's winner is the
    best of its segments' winners, and resolve_kernel needs no read of the row."""
    # (Addresses from the row's start, not the loop's pointers: those held past the loop
    # spilled in the cut that every row runs.)
    lanes = tl.arange(0, W)
    best = tl.full([W], float("-inf"), tl.float32)
    best_key = tl.full([W], EMPTY_KEY, tl.int64)
    count = tl.zeros([W], tl.int32)
    x = tl.load(x_row + start + lanes, mask=lanes < end, other=float("-inf"))
    for it in range(0, (end + W - 1) // W):
        nxt = (it + 1) * W
        x_next = tl.load(x_row + (start + nxt) + lanes, mask=nxt + lanes < end, other=float("-inf"))
        z = exact_z(x.to(tl.float32), t)
        ids = (start + it * W + lanes).to(tl.int64)
        live = z > float("-inf")
        best, best_key = race_step(z, ids, live, k0, k1, best, best_key)
        count += live.to(tl.int32)
        x = x_next
    return race_winner(best, best_key), tl.sum(count, axis=0).to(tl.int64)


@triton.jit
def _cut_and_write(
    tops,  # (t1, i1, t2, i2, t3, i3): the lanes' tops, t3 -inf unless TOPS == 3
    counts,  # (lo, hi, q1, q2, q3, n_lo, c1, c2, c3, n_hi) of the first count reduction
    seg_stats,  # (m, s_sum, d_lanes, t, start, stat)
    outs,  # (cand_key_ptr, m_ptr, s_ptr, d_ptr)
    KC: tl.constexpr,
    NBISECT: tl.constexpr,
    TOPS: tl.constexpr,
    W: tl.constexpr,
):
    """The segment's cut (the count search past KC), its written tops and statistics."""
    t1, i1, t2, i2, t3, i3 = tops
    lo, hi, q1, q2, q3, n_lo, c1, c2, c3, n_hi = counts
    m, s_sum, d_lanes, t, start, stat = seg_stats
    cand_key_ptr, m_ptr, s_ptr, d_ptr = outs
    lanes = tl.arange(0, W)
    if n_lo > KC:
        # Invariant: more than KC at or above lo, n_hi at or above hi (at most KC, or ties
        # at the max). Each step keeps the quarter that crosses KC.
        for step in tl.static_range(NBISECT // 2):
            if step > 0:
                q1, q2, q3 = quarters(lo, hi)
                c1, c2, c3 = tl.reduce(
                    (
                        _ge(t1, t2, t3, q1, TOPS),
                        _ge(t1, t2, t3, q2, TOPS),
                        _ge(t1, t2, t3, q3, TOPS),
                    ),
                    0,
                    add3,
                )
            n_hi = tl.where(c3 > KC, n_hi, tl.where(c2 > KC, c3, tl.where(c1 > KC, c2, c1)))
            lo, hi = keep_quarter(lo, hi, q1, q2, q3, c1, c2, c3, KC)
        cut = hi
        n_band = n_hi
    else:
        cut = lo
        n_band = n_lo
    left = tl.max(_lt(t1, t2, t3, cut, TOPS), axis=0)
    band1 = (t1 >= cut) & (t1 > float("-inf"))
    band2 = (t2 >= cut) & (t2 > float("-inf"))
    band3 = (t3 >= cut) & (t3 > float("-inf")) & (TOPS == 3)
    per_lane = band1.to(tl.int32) + band2.to(tl.int32) + band3.to(tl.int32)
    r1 = tl.cumsum(per_lane, axis=0) - per_lane  # slots in lane order, a lane's tops in turn
    r2 = r1 + band1.to(tl.int32)
    r3 = r2 + band2.to(tl.int32)
    id1 = start + i1 * W + lanes
    id2 = start + i2 * W + lanes
    id3 = start + i3 * W + lanes
    w1 = band1 & (r1 < KC)
    w2 = band2 & (r2 < KC)
    w3 = band3 & (r3 < KC)
    if n_band > KC:
        # Only ties at the max get here: KC of them are written, always the lowest id, and
        # every tie left out is the max itself.
        big = INT32_MAX
        low_id = _min3(
            tl.where(band1, id1, big), tl.where(band2, id2, big), tl.where(band3, id3, big)
        )
        low = tl.min(low_id, axis=0)
        l1 = band1 & (id1 == low)
        l2 = band2 & (id2 == low)
        l3 = band3 & (id3 == low)
        low_rank = _max3(tl.where(l1, r1, 0), tl.where(l2, r2, 0), tl.where(l3, r3, 0))
        late = tl.max(low_rank, axis=0) >= KC
        n_slots = tl.where(late, KC - 1, KC)  # past the first KC: it takes the last slot
        w1 = (band1 & (r1 < n_slots)) | l1
        w2 = (band2 & (r2 < n_slots)) | l2
        w3 = (band3 & (r3 < n_slots)) | l3
        r1 = tl.where(l1, tl.minimum(r1, KC - 1), r1)
        r2 = tl.where(l2, tl.minimum(r2, KC - 1), r2)
        r3 = tl.where(l3, tl.minimum(r3, KC - 1), r3)
        left = m
    d_seg = tl.maximum(d_lanes, left)

    base = cand_key_ptr + stat * KC
    _store_tops(base, t1, id1, r1, w1, t, W)
    _store_tops(base, t2, id2, r2, w2, t, W)
    if TOPS == 3:
        _store_tops(base, t3, id3, r3, w3, t, W)
    store_stats(
        cand_key_ptr, m_ptr, s_ptr, d_ptr, stat, KC, tl.minimum(n_band, KC), m, s_sum, d_seg, t
    )


@triton.jit
def store_stats(cand_key_ptr, m_ptr, s_ptr, d_ptr, stat, KC: tl.constexpr, n_written, m, s, d, t):
    """EMPTY_KEY in the segment's slots from n_written on, and m_c, s_c, d_c (x-space maxima
    m and d)."""
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


@triton.jit
def _reread(
    x_seg,
    end,
    lanes_state,
    TILES: tl.constexpr,
    W: tl.constexpr,
    NC: tl.constexpr,
):
    """The collided lanes (lanes_state = (i1, i2, d, col): col where d, the largest token a
    lane let go, lies in the band) read again, all at once: the first NC of them in lane
    order, each column one row of an [NC, TILES] block. For each, the tile of its third
    token (d itself: the first tile past its two tops that holds d) and the largest token
    after it. Returns, per lane, (i3, d4); (-1, d) for the lanes not read.

    The lanes' words (lane, two top tiles) go to the block's rows and its results back by
    tl.gather (shared memory, no global round trip): row j's lane is the first whose
    running count of collided lanes passes j, found by a binary search over the counts,
    and each lane takes its row's results by its rank. Through the segment's candidate slots
    in global memory as int32 words they were 0.2-0.6 us slower in steady streams on the
    H200 (B = 32-512, V = 151936); through [NC, W] block reductions a segment that reads
    again took 13-15 us longer."""
    i1, i2, d, col = lanes_state
    count = tl.cumsum(col.to(tl.int32), axis=0)  # collided lanes up to and with each lane
    rank = count - 1
    n_col = tl.max(count, axis=0)
    got = col & (rank < NC)
    j = tl.arange(0, NC)
    # the first lane whose count reaches j + 1: W lanes, log2(W) halvings
    lane_j = tl.zeros([NC], tl.int32)
    for k in tl.static_range(16):
        if (W >> (k + 1)) > 0:
            probe = lane_j + (W >> (k + 1))
            below = tl.gather(count, probe - 1, 0) < j + 1
            lane_j = tl.where(below, probe, lane_j)
    info = tl.where(
        j < n_col,
        lane_j | (tl.gather(i1, lane_j, 0) << 12) | (tl.gather(i2, lane_j, 0) << 22),
        0,
    )
    tiles = tl.arange(0, TILES)
    pos = tiles[None, :] * W + (info & 0xFFF)[:, None]
    live = (j < n_col)[:, None] & (pos < end)
    x = tl.load(x_seg + pos, mask=live, other=float("-inf")).to(tl.float32)
    top1 = tiles[None, :] == ((info >> 12) & 0x3FF)[:, None]
    top2 = tiles[None, :] == ((info >> 22) & 0x3FF)[:, None]
    x = tl.where(top1 | top2, float("-inf"), x)
    t3_j = tl.max(x, axis=1)
    i3_j = tl.min(tl.where(x == t3_j[:, None], tiles[None, :], TILES), axis=1)
    d4_j = tl.max(tl.where(tiles[None, :] == i3_j[:, None], float("-inf"), x), axis=1)
    row = tl.minimum(tl.maximum(rank, 0), NC - 1)
    d4 = tl.gather(d4_j, row, 0)
    i3 = tl.where(got, tl.gather(i3_j, row, 0), -1)
    return i3, tl.where(got, d4, d)


@triton.jit
def _race_score(key, k0, k1):
    """The winner's score z + g (-inf for a segment with no finite token)."""
    z = tl.where(key == EMPTY_KEY, float("-inf"), unpack_z(key))
    return z + gumbel(k0, k1, unpack_id(key))


@triton.jit
def _max2(a0, a1, b0, b1):
    return tl.maximum(a0, b0), tl.maximum(a1, b1)


@triton.jit
def _min3(a, b, c):
    return tl.minimum(tl.minimum(a, b), c)


@triton.jit
def _max3(a, b, c):
    return tl.maximum(tl.maximum(a, b), c)


@triton.jit
def _ge(t1, t2, t3, p, KEEP: tl.constexpr):
    """Per lane: how many of its tops are >= p (p > -inf: unused tops are -inf)."""
    n = (t1 >= p).to(tl.int32) + (t2 >= p).to(tl.int32)
    if KEEP == 3:
        n += (t3 >= p).to(tl.int32)
    return n


@triton.jit
def _ge5(t1, t2, t3, at, KEEP: tl.constexpr):
    """_ge at each of the five thresholds at = (lo, q1, q2, q3, hi)."""
    lo, q1, q2, q3, hi = at
    return (
        _ge(t1, t2, t3, lo, KEEP),
        _ge(t1, t2, t3, q1, KEEP),
        _ge(t1, t2, t3, q2, KEEP),
        _ge(t1, t2, t3, q3, KEEP),
        _ge(t1, t2, t3, hi, KEEP),
    )


@triton.jit
def _lt(t1, t2, t3, p, KEEP: tl.constexpr):
    """Per lane: its largest top < p (-inf if none)."""
    b = tl.maximum(tl.where(t1 < p, t1, float("-inf")), tl.where(t2 < p, t2, float("-inf")))
    if KEEP == 3:
        b = tl.maximum(b, tl.where(t3 < p, t3, float("-inf")))
    return b


@triton.jit
def _store_tops(base, top, ids, rank, write, t, W: tl.constexpr):
    """The written lane tops as (z, id) keys at base + rank. Split into the two halves a
    thread holds, each store keeps the loop's layout (no exchange through shared memory)."""
    if W >= 64:
        ta, tb = tl.split(tl.reshape(top, [W // 2, 2]))
        ia, ib = tl.split(tl.reshape(ids, [W // 2, 2]))
        ra, rb = tl.split(tl.reshape(rank, [W // 2, 2]))
        wa, wb = tl.split(tl.reshape(write, [W // 2, 2]))
        tl.store(base + ra, pack_key(exact_z(ta, t), ia.to(tl.int64)), mask=wa)
        tl.store(base + rb, pack_key(exact_z(tb, t), ib.to(tl.int64)), mask=wb)
    else:
        tl.store(base + rank, pack_key(exact_z(top, t), ids.to(tl.int64)), mask=write)


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
