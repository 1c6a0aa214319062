"""Pass 1's end of segment: the band cut of the lanes' tops, the written candidates and the
segment's statistics, and the reread of collided lanes (lanes that let a band token go).

Called once per segment by pass1.lanes_pass, after the read loop. The steps are block-wide
(reductions and one scan), few and narrow, and leave the tops in the loop's layout: no step
moves them between threads. A token that is not a lane top is <= its lane's d, a lane top
that is not written is <= the cut, so every z > d_c of the segment is written: the band
stays provably complete (pass1.py has the outputs' contract).
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    INT32_MAX,
    add3,
    add5,
    exact_z,
    keep_quarter,
    pack_key,
    quarters,
)


@triton.jit
def reread_and_write(
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
    n_lo, c1, c2, c3, n_hi = tl.reduce(ge5(t1, t2, t3, (lo, q1, q2, q3, hi), 3), 0, add5)
    counts = (lo, hi, q1, q2, q3, n_lo, c1, c2, c3, n_hi)
    seg_stats = (m, s_sum, d_lanes, t, start, stat)
    cut_and_write((t1, i1, t2, i2, t3, i3), counts, seg_stats, outs, KC, NBISECT, 3, W)


@triton.jit
def cut_and_write(
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
def ge5(t1, t2, t3, at, KEEP: tl.constexpr):
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
