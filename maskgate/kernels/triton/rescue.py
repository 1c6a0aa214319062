"""Pass 2 for a row the first tier leaves undecided: the second tier, the rescue, then pass
1's race winner (a row nothing truncates that asks for no mask) or the whole-row fallback
(whole_row.py).

  _second_tier   the best T2 candidates, unless pass 1's sums prove the support past them
  _rescue        one or more segments read again above a lower floor, the best T2 decide
  _race_token    a row nothing truncates takes pass 1's race winner

resolve.resolve_row calls past_first_tier once per undecided row; the decision rules are
decide.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import EMPTY_KEY, max1_add1, race_winner, unpack_id, unpack_z
from maskgate.kernels.triton.decide import (
    band_past_tier,
    best_sorted,
    decide,
    draw,
    past_tier,
    store_mask,
)
from maskgate.kernels.triton.reads import gather_above
from maskgate.kernels.triton.sort import sort_block
from maskgate.kernels.triton.whole_row import whole_row


@triton.jit
def _second_tier(
    cands,  # best_sorted's (keys, z, listed, d_max, z_max, lo, n_lo, below_lo)
    segs,  # (ch, in_ch, m_c, s_c, d_c)
    d_slot,  # [CAND_BLOCK] each candidate slot's segment floor
    first,  # (n, undecided, floor): the first tier's decision (undecided)
    rules,  # (z_sum, k, k_on, top_p, p_on, min_p, m_on, whole)
    scratch,
    T2: tl.constexpr,
    NBISECT: tl.constexpr,
):
    """The best T2 candidates sorted and decided, when the first tier left listed candidates
    out. Returns (n, undecided, beyond, best2, z2, ids2, mass2); beyond: the support proved
    longer than T2, so no rescue can decide it."""
    _keys, z_all, _listed, d_max, z_max, _lo, _n_lo, _below_lo = cands
    _ch, in_ch, m_c, s_c, d_c = segs
    n, undecided, floor = first
    z_sum, k, k_on, top_p, p_on, min_p, m_on, whole = rules
    beyond = n < 0  # the support proved longer than T2: no rescue can decide it
    if p_on & ~k_on & ~m_on & ~whole:
        # A top-p support that pass 1's lists and sums already prove longer than T2 (a
        # wide real row: every segment floor in S) goes to the whole-row fallback with no
        # second tier and no rescue: neither can decide it (band_past_tier). The levels
        # tried are the floors of the rescue's rounds.
        t1 = tl.max(tl.where(in_ch & (d_c < d_max), d_c, float("-inf")), axis=0)
        t2 = tl.max(tl.where(in_ch & (d_c < t1), d_c, float("-inf")), axis=0)
        t3 = tl.max(tl.where(in_ch & (d_c < t2), d_c, float("-inf")), axis=0)
        beyond = band_past_tier(
            z_all, d_slot, m_c, s_c, d_c, in_ch, t1, t2, t3, z_max, z_sum, top_p, T2
        )
    if (floor > d_max) & ~whole & ~beyond:  # the first tier left listed candidates out
        best2, floor2 = best_sorted(cands, scratch, T2, NBISECT, T2)
        n, undecided, z2, ids2, mass2 = decide(
            best2, floor2, z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, T2
        )
        beyond = undecided & past_tier(
            n, z2, mass2, floor2, z_max, z_sum, top_p, k_on, p_on, m_on, T2
        )
    else:
        # The first tier sorted every candidate above the band floor, so the second would
        # sort the same ones and decide the same way: straight to the rescue. (A row the
        # rescue takes has its floor inside S, usually with fewer than T1 tokens above
        # it: the second tier's 1024-key sort was pure cost there.) Or the support is
        # past the tiers: straight to the whole-row fallback.
        best2 = tl.full([T2], EMPTY_KEY, tl.int64)
        z2 = tl.full([T2], float("-inf"), tl.float32)
        ids2 = tl.zeros([T2], tl.int64)
        mass2 = tl.zeros([T2], tl.float32)
    return n, undecided, beyond, best2, z2, ids2, mass2


@triton.jit
def _rescue(
    cands,  # best_sorted's (keys, z, listed, d_max, z_max, lo, n_lo, below_lo)
    segs,  # (ch, in_ch, m_c, s_c, d_c)
    d_slot,  # [CAND_BLOCK] each candidate slot's segment floor
    tier,  # (n, undecided, beyond, best2, z2, ids2, mass2): the second tier's
    rules,  # (z_sum, k, k_on, top_p, p_on, min_p, m_on, whole)
    row_read,  # (x_row, temp, vocab, seg_len)
    scratch,
    T1: tl.constexpr,
    T2: tl.constexpr,
    RESCUE: tl.constexpr,
    RESCUE_ROUNDS: tl.constexpr,
    FB_BLOCK: tl.constexpr,
    NBISECT: tl.constexpr,
):
    """List every token above t, a segment floor d_c below d_max, then the same decision with
    t as the floor. Returns the tier's tuple after it, and 1 where the row read again.

    Why it works: the row floor d_max is the largest d_c, and a single segment can push it
    deep into S (a pass-1 lane keeps its two largest tokens, so a lane holding three of the
    row's top few hundred sets d_c at the third: with n tokens in S over L lanes in all,
    about n^3 / (6 L^2) of rows, 5% at n = 170 over 8 x 512 lanes). A segment whose floor is
    at most t is complete above t: its candidates above t are all its tokens above t, so
    only the segments with floors above t are read again. Round one takes t the
    second-largest floor (one segment read); when that floor lies in S too (two bad
    segments, about one rescued row in five at B = 256), the next round takes the next floor
    down and reads one segment more, up to RESCUE_ROUNDS. Up to RESCUE tokens above t are
    gathered, and the second tier's pick takes the best T2 of them (t the floor, or the
    largest gathered z left out): a row whose support fits in T2 decides even with a few
    thousand tokens above t. When more than RESCUE lie above t the bisection decides."""
    keys, z_all, _listed, d_max, z_max, _lo, _n_lo, _below_lo = cands
    ch, in_ch, _m_c, _s_c, d_c = segs
    n, undecided, beyond, best2, z2, ids2, mass2 = tier
    z_sum, k, k_on, top_p, p_on, min_p, m_on, _whole = rules
    x_row, temp, vocab, seg_len = row_read
    fallback = tl.full([], 0, tl.int8)
    t = d_max
    fits = d_max > float("-inf")  # a floor at -inf lists the whole row already
    rounds = 0
    while undecided & fits & ~beyond & (rounds < RESCUE_ROUNDS):
        t = tl.max(tl.where(in_ch & (d_c < t), d_c, float("-inf")), axis=0)
        others = d_slot <= t  # slots of the segments complete above t
        known = tl.sum((others & (z_all > t)).to(tl.int32), axis=0)
        fits = known <= RESCUE
        if fits:
            fallback = tl.full([], 1, tl.int8)  # the band was not enough: counted
            gathered = scratch + T1 + T2
            got = gather_above(
                x_row,
                temp,
                vocab,
                t,
                d_c,
                ch,
                seg_len,
                keys,
                z_all,
                others,
                gathered,
                RESCUE,
                FB_BLOCK,
            )
            fits = got <= RESCUE
            if fits:
                if got <= T2:
                    # Every key above t fits the second tier: sort them as they are (t is
                    # the floor), with no search over a block of RESCUE keys (a rescued
                    # row's pick took 44600 cycles with it, 23900 without, on the H200).
                    best2 = sort_block(gathered, got, T2)
                    r_floor = t
                else:
                    r_pos = tl.arange(0, RESCUE)
                    r_keys = tl.load(gathered + r_pos, mask=r_pos < got, other=EMPTY_KEY)
                    r_z = tl.where(r_keys == EMPTY_KEY, float("-inf"), unpack_z(r_keys))
                    r_listed = r_z > t
                    r_lo = tl.maximum(t, z_max - 30.0)
                    r_below, r_n_lo = tl.reduce(
                        (
                            tl.where(r_listed & (r_z < r_lo), r_z, float("-inf")),
                            (r_listed & (r_z >= r_lo)).to(tl.int32),
                        ),
                        0,
                        max1_add1,
                    )
                    r_cands = (r_keys, r_z, r_listed, t, z_max, r_lo, r_n_lo, r_below)
                    best2, r_floor = best_sorted(r_cands, scratch + T1, T2, NBISECT, T2)
                n, undecided, z2, ids2, mass2 = decide(
                    best2, r_floor, z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, T2
                )
                beyond = undecided & past_tier(
                    n, z2, mass2, r_floor, z_max, z_sum, top_p, k_on, p_on, m_on, T2
                )
        fits = fits & (t > float("-inf"))  # t at -inf: every segment was read
        rounds += 1
    return (n, undecided, beyond, best2, z2, ids2, mass2), fallback


@triton.jit
def _race_token(row, race, in_ch, ch, n_chunks, z_max, z_sum, n):
    """A row nothing truncates that asks for no mask, when pass 1 raced every segment: the
    row's winner is the best segment winner (the same rule as one race over the row), and
    pass 1's sums give the log-prob. race: pass 1's (g, w) outputs. Returns (token, logprob,
    n)."""
    # (Row pointers plus ch, not the statistics' offsets: holding that block this long
    # spilled.)
    g_ptr, w_ptr = race
    g_row = g_ptr + row * n_chunks
    w_row = w_ptr + row * n_chunks
    y_key = race_winner(
        tl.load(g_row + ch, mask=in_ch, other=float("-inf")),
        tl.load(w_row + ch, mask=in_ch, other=EMPTY_KEY),
    )
    token = unpack_id(y_key)
    logprob = unpack_z(y_key) - (z_max + tl.log(z_sum))
    n_c = tl.load(w_row + n_chunks * tl.num_programs(0) + ch, mask=in_ch, other=0)
    n = tl.sum(n_c, axis=0).to(n.dtype)
    return token, logprob, n


@triton.jit
def past_first_tier(
    row,
    cands,  # best_sorted's (keys, z, listed, d_max, z_max, lo, n_lo, below_lo)
    segs,  # (ch, in_ch, m_c, s_c, d_c)
    first,  # (n, undecided, floor)
    drawn,  # the first tier's (token, logprob, j)
    rules,  # (z_sum, k, k_on, top_p, p_on, min_p, m_on, whole)
    row_read,  # (x_row, temp, vocab, seg_len)
    noise,  # (greedy, k0, k1, z_max)
    dest,  # (slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded)
    d_row,  # d_ptr + row * n_chunks: the row's segment floors
    pos,  # tl.arange(0, CAND_BLOCK): the candidate slots
    race,  # (g, w, raced): pass 1's race outputs, read when raced != 0
    scratch,
    n_chunks,
    ncand,
    T1: tl.constexpr,
    T2: tl.constexpr,
    CAP_BLOCK: tl.constexpr,
    RESCUE: tl.constexpr,
    RESCUE_ROUNDS: tl.constexpr,
    FB_BLOCK: tl.constexpr,
    NBISECT: tl.constexpr,
):
    """A row the first tier leaves undecided: the second tier, the rescue, then pass 1's race
    (a row nothing truncates with no mask) or the whole-row fallback. Returns (token,
    logprob, n, emitted, fallback)."""
    token, logprob, j = drawn
    z_sum, _k, _k_on, _top_p, _p_on, _min_p, _m_on, whole = rules
    greedy, k0, k1, z_max = noise
    slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded = dest
    ch, in_ch, _m_c, _s_c, _d_c = segs
    g_ptr, w_ptr, raced = race
    emitted = tl.full([], 0, tl.int64)
    # Each candidate slot's segment floor (segment c's slots: [c * KC, (c + 1) * KC)).
    seg_slot = pos // (ncand // n_chunks)
    d_slot = tl.load(
        d_row + seg_slot,
        mask=pos < ncand,
        other=float("inf"),
        cache_modifier=".cg",
    )
    tier = _second_tier(cands, segs, d_slot, first, rules, scratch + T1, T2, NBISECT)
    n, undecided, beyond, best2, z2, ids2, mass2 = tier
    fallback = tl.full([], 0, tl.int8)
    if undecided & ~whole & ~beyond:
        tier, fallback = _rescue(
            cands,
            segs,
            d_slot,
            tier,
            rules,
            row_read,
            scratch,
            T1,
            T2,
            RESCUE,
            RESCUE_ROUNDS,
            FB_BLOCK,
            NBISECT,
        )
        n, undecided, beyond, best2, z2, ids2, mass2 = tier
    if ~undecided:
        token, logprob, j = draw(best2, z2, ids2, mass2, n, greedy, k0, k1, z_max, T2)
        if midx >= 0:
            emitted = store_mask(
                slot_row,
                cnt_ptr,
                status_ptr,
                midx,
                ids2,
                tl.arange(0, T2),
                n,
                j,
                token,
                max_mask,
                cap,
                bounded,
            )
    elif (raced != 0) & whole & (midx < 0):
        token, logprob, n = _race_token(row, (g_ptr, w_ptr), in_ch, ch, n_chunks, z_max, z_sum, n)
    else:
        fallback = tl.full([], 1, tl.int8)
        token, logprob, j, n, emitted = whole_row(
            (token, logprob, j), rules, row_read, noise, dest, scratch, T1, T2, CAP_BLOCK, FB_BLOCK
        )
    return token, logprob, n, emitted, fallback
