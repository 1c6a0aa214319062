"""Pass 2: per row, decide the support from the band candidates, draw, emit the mask slots.

Grid (B,). resolve_row runs one row's phases in order, each a @triton.jit function of its
own (Triton inlines them: the split costs nothing at run time):

  _load_row        pass 1's segment statistics and candidates, the row's parameters
  _row_sums        the row max, the band floor, the NaN flag and the sum of exp(z - z_max)
  _band_keys       which candidates lie above the band floor
  (first tier)     best_sorted, decide and draw over the best T1 candidates
  _second_tier     the best T2, unless pass 1's sums prove the support past them
  _rescue          one or more segments read again above a lower floor
  _race_token      a row nothing truncates takes pass 1's race winner
  _whole_row       the bisection fallback over the whole row
  _finish_row      the row's outputs, and its CSR packing

Sorting all candidates of a row is the expensive step, so it goes in tiers: the
best T1 candidates (a z threshold found by bisection, then compacted through scratch memory)
are sorted in-kernel as packed (z, id) keys and decide most rows; rows they cannot decide try
the best T2; rows those cannot decide read the row once for every token above a lower floor (the
rescue), and rows that still cannot decide run the bisection fallback (triton_fallback.py) in
the same program. The emitted mask is the sorted prefix, already in design order. The decision
rules are those of maskgate/kernels/resolve.py.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    GREEDY_T,
    add2_max2,
    max1_add1,
    max3,
    race_winner,
    row_keys,
    unpack_id,
    unpack_z,
    untruncated,
)
from maskgate.kernels.triton.decide import (
    band_past_tier,
    best_sorted,
    decide,
    draw,
    past_tier,
    store_mask,
    support_goal,
)
from maskgate.kernels.triton.emit import pack_row
from maskgate.kernels.triton.fallback import (
    fallback_draw,
    fallback_gather,
    fallback_support,
    gather_above,
    position_of,
)
from maskgate.kernels.triton.sort import sort_block

# Mask blocks (the cap rounded up to a power of two) from which a whole-row fallback row's S
# that fits half the block is sorted in half a block.
HALF_SORT_MIN = tl.constexpr(2048)


@triton.jit
def sort_and_store(gather, got, n, s_listed, drawn, noise, dest, BLOCK: tl.constexpr):
    """A fallback row's gathered keys (got of them, at most BLOCK, unsorted in `gather`):
    sorts them and writes the row's mask slot. When they are the row's S (s_listed), draws
    over them first (the tiers' draw: the same Gumbel race as a draw over the row);
    otherwise they are the best cap keys and drawn = (token, logprob, j: the token's slot)
    is the draw's over the row. noise: (greedy, k0, k1, z_max); dest: the mask slot's
    (slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded). Returns the draw and
    the ids written."""
    token, logprob, j = drawn
    greedy, k0, k1, z_max = noise
    slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded = dest
    pos = tl.arange(0, BLOCK)
    keys = sort_block(gather, got, BLOCK)
    ids = unpack_id(keys)
    if s_listed:
        z = tl.where(pos < n, unpack_z(keys), float("-inf"))
        token, logprob, j = draw(keys, z, ids, tl.exp(z - z_max), n, greedy, k0, k1, z_max, BLOCK)
    emitted = store_mask(
        slot_row, cnt_ptr, status_ptr, midx, ids, pos, n, j, token, max_mask, cap, bounded
    )
    return token, logprob, j, emitted


@triton.jit
def _load_row(
    row,
    stats,  # (cand_key_ptr, m_ptr, s_ptr, d_ptr): pass 1's outputs
    params,  # (temp, topk, topp, minp, seed, step, midx, bounded) pointers, [B] each
    n_chunks,
    ncand,
    CAND_BLOCK: tl.constexpr,
    NCH_BLOCK: tl.constexpr,
    HAS_STEP: tl.constexpr,
):
    """Every global load of the row first: their latencies overlap instead of queueing behind
    each block-wide reduction (a reduction's barrier keeps later loads after it). Pass 1's
    outputs are read through L2 (".cg")."""
    cand_key_ptr, m_ptr, s_ptr, d_ptr = stats
    temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr, midx_ptr, bounded_ptr = params
    ch = tl.arange(0, NCH_BLOCK)
    in_ch = ch < n_chunks
    stat = row * n_chunks + ch
    m_c = tl.load(m_ptr + stat, mask=in_ch, other=float("-inf"), cache_modifier=".cg")
    s_c = tl.load(s_ptr + stat, mask=in_ch, other=0.0, cache_modifier=".cg")
    d_c = tl.load(d_ptr + stat, mask=in_ch, other=float("-inf"), cache_modifier=".cg")
    pos = tl.arange(0, CAND_BLOCK)
    cand = row * ncand + pos
    keys = tl.load(cand_key_ptr + cand, mask=pos < ncand, other=EMPTY_KEY, cache_modifier=".cg")
    temp = tl.load(temp_ptr + row)
    k = tl.load(topk_ptr + row).to(tl.int64)
    top_p = tl.load(topp_ptr + row)
    min_p = tl.load(minp_ptr + row)
    seed = tl.load(seed_ptr + row)
    step = tl.full([], 0, tl.int64)
    if HAS_STEP:
        step = tl.load(step_ptr + row)
    midx = tl.load(midx_ptr + row)
    bounded = tl.load(bounded_ptr + row) != 0
    segs = (ch, in_ch, m_c, s_c, d_c)
    return segs, pos, keys, (temp, k, top_p, min_p, seed, step, midx, bounded)


@triton.jit
def _row_sums(m_c, s_c, d_c, temp):
    """(z_max, d_max, greedy, bad, z_sum) from the segment statistics: the row max of z, the
    band floor (every token above it is a candidate), whether the row is greedy, whether it
    is never sampled (a NaN or +inf, or no finite logit) and sum exp(z - z_max)."""
    # Two reductions, the max first: one that merges (max, sum-exp) pairs, rescaling as it
    # goes, put two dependent exps in each of its 8 combine steps and took 600 more cycles
    # on the H200.
    z_max, d_max, nan_seen = tl.reduce((m_c, d_c, (s_c != s_c).to(tl.int32)), 0, max3)
    greedy = temp.to(tl.float64) < GREEDY_T
    # A NaN or +inf anywhere (s_c is NaN then), or no finite logit: never sampled.
    bad = (nan_seen > 0) | (z_max == float("-inf")) | (z_max == float("inf"))
    z_sum = tl.sum(tl.where(m_c > float("-inf"), s_c * tl.exp(m_c - z_max), 0.0), axis=0)
    return z_max, d_max, greedy, bad, z_sum


@triton.jit
def _band_keys(keys, z_max, d_max):
    """The candidates' exact z, which lie above the band floor d_max, the lowest z a tier
    sorts (lo), and in one reduction: how many are listed, how many at or above lo, the
    largest key and the largest listed z below lo."""
    z_all = tl.where(keys == EMPTY_KEY, float("-inf"), unpack_z(keys))  # pass 1's exact z
    listed = z_all > d_max  # every token with z > d_max is a candidate
    lo = tl.maximum(d_max, z_max - 30.0)  # below this, no tier sorts a candidate
    n_band, n_lo, top_key, below_lo = tl.reduce(
        (
            listed.to(tl.int64),
            (listed & (z_all >= lo)).to(tl.int32),
            keys,
            tl.where(listed & (z_all < lo), z_all, float("-inf")),
        ),
        0,
        add2_max2,
    )
    return z_all, listed, lo, n_band, n_lo, top_key, below_lo


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
def _whole_row(
    drawn,  # (token, logprob, j): the first tier's draw, kept where the fallback draws none
    rules,  # (z_sum, k, k_on, top_p, p_on, min_p, m_on, whole)
    row_read,  # (x_row, temp, vocab, seg_len)
    noise,  # (greedy, k0, k1, z_max)
    dest,  # (slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded)
    scratch,
    T1: tl.constexpr,
    T2: tl.constexpr,
    CAP_BLOCK: tl.constexpr,
    FB_BLOCK: tl.constexpr,
):
    """The bisection fallback (triton_fallback.fallback_support) over the whole row, its
    draw and its mask. Returns (token, logprob, j, n, emitted)."""
    token, logprob, j = drawn
    z_sum, k, k_on, top_p, _p_on, min_p, _m_on, _whole = rules
    x_row, temp, vocab, _seg_len = row_read
    _greedy, k0, k1, z_max = noise
    _slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded = dest
    emitted = tl.full([], 0, tl.int64)
    k_eff = tl.where(k_on, k, vocab + 1)
    # Bounded mode over the cap emits the best cap keys: the search finds their cut too,
    # when S is too long for the gather below to list it.
    emit_cap = tl.where((midx >= 0) & bounded, cap, 0)
    t_cut, n, mass_s, t_emit, s_read = fallback_support(
        x_row,
        temp,
        vocab,
        k_eff,
        top_p,
        min_p,
        z_max,
        z_sum,
        tl.maximum(max_mask, CAP_BLOCK),
        emit_cap,
        scratch + T1,  # T2 slots for the search's list
        scratch + T1 + T2,  # S, when the search lists it
        tl.where(midx >= 0, CAP_BLOCK, 0),
        T2,
        FB_BLOCK,
    )
    # A mask row whose S fits the mask block lists S in one read (none when the search's
    # last read, which lists its bracket, could list S too), and the draw, the token's
    # position and the mask all come from the sorted list (a draw over the row, a count of
    # the token's position and a gather took three reads). A row with no mask, or with S
    # longer than the block, draws over the row (one read, no sort), and a bounded mask over
    # the cap then counts the token's position and lists the best cap keys. One gather, sort
    # and store serve both, so the block's sort is compiled once.
    s_listed = (midx >= 0) & (n <= CAP_BLOCK)
    best_cap = (midx >= 0) & bounded & ~s_listed
    if ~s_listed:
        y_key = fallback_draw(x_row, temp, vocab, t_cut, k0, k1, FB_BLOCK)
        token = unpack_id(y_key)
        logprob = unpack_z(y_key) - (z_max + tl.log(mass_s))
        if best_cap:
            j = position_of(x_row, temp, vocab, y_key, FB_BLOCK)
    if s_listed | best_cap:
        gather = scratch + T1 + T2
        if s_read:  # the search's last read listed S here
            got = n.to(tl.int32)
        else:
            got = fallback_gather(
                x_row, temp, vocab, tl.where(s_listed, t_cut, t_emit), gather, FB_BLOCK
            )
        tl.debug_barrier()  # the gather's scattered stores before the load
        # A sort's cost grows faster than its size: from mask blocks of HALF_SORT_MIN keys
        # on, a listed S that fits half the block is sorted in half a block.
        half = s_listed & (n <= CAP_BLOCK // 2) if CAP_BLOCK >= HALF_SORT_MIN else False
        drawn = (token, logprob, j)
        if half:
            token, logprob, j, emitted = sort_and_store(
                gather, got, n, s_listed, drawn, noise, dest, CAP_BLOCK // 2
            )
        else:
            token, logprob, j, emitted = sort_and_store(
                gather, got, n, s_listed, drawn, noise, dest, CAP_BLOCK
            )
    elif midx >= 0:  # exact mode, S over the cap: no ids, status overflow
        emitted = tl.full([], 0, tl.int64)
        tl.store(cnt_ptr + midx, emitted)
        tl.store(status_ptr + midx, tl.full([], 1, tl.int8))
    return token, logprob, j, n, emitted


@triton.jit
def _past_first_tier(
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
        token, logprob, j, n, emitted = _whole_row(
            (token, logprob, j), rules, row_read, noise, dest, scratch, T1, T2, CAP_BLOCK, FB_BLOCK
        )
    return token, logprob, n, emitted, fallback


@triton.jit
def _finish_row(row, drawn, n, bad, fallback, emitted, midx, slot_row, outs, pack):
    """The row's outputs (a bad row: token 0, NaN log-prob, support 0), and its CSR: with
    pack 1 the single mask row writes offsets[1], with pack 2 the row packs its own slot.
    outs: (tok, lp, size, nan, fb, band, offsets, ids, mask_sizes) pointers."""
    token, logprob = drawn
    tok_ptr, lp_ptr, size_ptr, nan_ptr, fb_ptr, _band_ptr, offsets_ptr, ids_ptr, sizes_ptr = outs
    token = tl.where(bad, 0, token)
    logprob = tl.where(bad, float("nan"), logprob)
    tl.store(tok_ptr + row, token)
    tl.store(lp_ptr + row, logprob)
    tl.store(size_ptr + row, tl.where(bad, 0, n))
    tl.store(nan_ptr + row, bad.to(tl.int8))
    tl.store(fb_ptr + row, fallback)
    if (pack == 1) & (midx >= 0):
        tl.store(offsets_ptr + 1, emitted)
    if pack == 2:
        pack_row(row, midx, emitted, slot_row, ids_ptr, sizes_ptr, offsets_ptr, 1024)


@triton.jit
def resolve_row(
    row,
    stats,  # (cand_key_ptr [B, ncand] int64 (z, id) keys, m_ptr, s_ptr, d_ptr): pass 1's
    x_ptr,
    stride_x,
    params,  # (temp, topk, topp, minp, seed, step, midx, bounded) pointers, [B] each; midx:
    # the row's mask index, -1 when it asked for no mask
    outs,  # (tok, lp, size, nan, fb, band [B]; offsets [R + 1], ids [>= N], mask_sizes [B])
    mask,  # (cnt [R] int64, status [R] int8, slot [R, cap] int32) pointers
    pack,  # 0: emit_kernel packs the slots; 1: R == 1, the slot is the CSR ids and the row
    # also writes offsets[1]; 2: the row packs its own slot (emit.pack_row)
    scratch_ptr,  # [B, T1 + T2 + max(CAP_BLOCK, RESCUE)] int64 compaction space
    vocab,
    n_chunks,
    max_mask,
    cap,
    ncand,  # candidate slots per row (a runtime value: one compile serves every batch size)
    seg_len,  # tokens per pass-1 segment (segment c: tokens [c * seg_len, (c + 1) * seg_len))
    race,  # (g, w, raced): pass 1's race outputs (band_lanes_kernel), read when raced != 0
    CAND_BLOCK: tl.constexpr,
    NCH_BLOCK: tl.constexpr,
    T1: tl.constexpr,
    T2: tl.constexpr,
    CAP_BLOCK: tl.constexpr,
    RESCUE: tl.constexpr,  # keys the rescue gathers at most (a multiple of T2)
    RESCUE_ROUNDS: tl.constexpr,  # rounds of the rescue at most (each reads a segment more)
    FB_BLOCK: tl.constexpr,
    NBISECT: tl.constexpr,
    HAS_STEP: tl.constexpr,
):
    """One row's whole pass 2 (the phases in the module docstring). When pass 1 raced, a row
    nothing truncates that asks for no mask takes its token from pass 1's race, with no
    read of the row."""
    segs, pos, keys, row_params = _load_row(
        row, stats, params, n_chunks, ncand, CAND_BLOCK, NCH_BLOCK, HAS_STEP
    )
    _ch, _in_ch, m_c, s_c, d_c = segs
    temp, k, top_p, min_p, seed, step, midx, bounded = row_params
    z_max, d_max, greedy, bad, z_sum = _row_sums(m_c, s_c, d_c, temp)
    _cand_key_ptr, _m_ptr, _s_ptr, d_ptr = stats
    _tok_ptr, _lp_ptr, _size_ptr, _nan_ptr, _fb_ptr, band_ptr, offsets_ptr, _ids_ptr, _sizes_ptr = (
        outs
    )
    if row == 0:
        tl.store(offsets_ptr, tl.zeros([], tl.int64))

    k_on = (k > 0) & (k < vocab)
    p_on = top_p < 1.0
    m_on = min_p > 0.0
    # Nothing truncates: S is every finite token, which pass 1's race draws from (no mask
    # asked) or the fallback finds in one read, so such a row skips the second tier and the
    # rescue (neither can list the whole row).
    whole = untruncated(k, top_p, min_p, temp, vocab)
    k0, k1 = row_keys(seed, step)
    cnt_ptr, status_ptr, slot_ptr = mask
    slot_row = slot_ptr + midx * cap
    scratch = scratch_ptr + row * (T1 + T2 + tl.maximum(CAP_BLOCK, RESCUE))
    z_all, listed, lo, n_band, n_lo, top_key, below_lo = _band_keys(keys, z_max, d_max)
    tl.store(band_ptr + row, n_band)

    # The first tier's search stops once it holds 3/4 of T1 (most rows need far fewer), or
    # once its pick holds the support (support_goal); the second's runs in full, since a row
    # there may need all of it.
    cands = (keys, z_all, listed, d_max, z_max, lo, n_lo, below_lo)
    goal = support_goal(z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, greedy)
    best, floor = best_sorted(cands, scratch, T1, NBISECT, T1 * 3 // 4, goal, True)
    n, undecided, z, ids, mass = decide(
        best, floor, z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, T1
    )
    n = tl.where(greedy, 1, n)
    token, logprob, j = draw(best, z, ids, mass, n, greedy, k0, k1, z_max, T1)
    # Greedy: the largest key of all candidates (its chunk always writes it), even when ties
    # leave nothing listed above d_max.
    token = tl.where(greedy, unpack_id(top_key), token)
    fallback = tl.full([], 0, tl.int8)
    emitted = tl.full([], 0, tl.int64)  # ids this row writes to its mask slot
    dest = (slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded)
    if greedy | bad | ~undecided:
        if midx >= 0:
            emitted = store_mask(
                slot_row,
                cnt_ptr,
                status_ptr,
                midx,
                tl.where(greedy, token, ids),
                tl.arange(0, T1),
                tl.where(bad, 0, n),
                j,
                token,
                max_mask,
                cap,
                bounded,
            )
    else:
        token, logprob, n, emitted, fallback = _past_first_tier(
            row,
            cands,
            segs,
            (n, undecided, floor),
            (token, logprob, j),
            (z_sum, k, k_on, top_p, p_on, min_p, m_on, whole),
            (x_ptr + row * stride_x, temp, vocab, seg_len),
            (greedy, k0, k1, z_max),
            dest,
            d_ptr + row * n_chunks,
            pos,
            race,
            scratch,
            n_chunks,
            ncand,
            T1,
            T2,
            CAP_BLOCK,
            RESCUE,
            RESCUE_ROUNDS,
            FB_BLOCK,
            NBISECT,
        )
    _finish_row(row, (token, logprob), n, bad, fallback, emitted, midx, slot_row, outs, pack)


@triton.jit(do_not_specialize=["pack", "raced"])  # one compile serves every value
def resolve_kernel(
    cand_key_ptr,  # [B, ncand] int64 pass-1 candidates as (z, id) keys
    m_ptr,
    s_ptr,
    d_ptr,  # pass-1 outputs
    x_ptr,
    stride_x,
    temp_ptr,
    topk_ptr,
    topp_ptr,
    minp_ptr,
    bounded_ptr,
    seed_ptr,
    step_ptr,
    midx_ptr,  # [B] int64 mask index of the row, -1 when it asked for no mask
    tok_ptr,
    lp_ptr,
    size_ptr,
    nan_ptr,
    fb_ptr,
    band_ptr,  # [B] outputs
    cnt_ptr,
    status_ptr,
    slot_ptr,  # [R] int64, [R] int8, [R, cap] int32
    offsets_ptr,  # [R + 1] int64 CSR offsets: row 0 writes the leading 0
    pack,  # 0: emit_kernel packs the slots; 1: R == 1, the slot is the CSR ids and the row
    # also writes offsets[1]; 2: the row packs its own slot (emit.pack_row)
    ids_ptr,  # [>= N] int32 CSR ids (pack 2)
    mask_sizes_ptr,  # [B] int64, -1 before the launch (pack 2)
    scratch_ptr,  # [B, T1 + T2 + max(CAP_BLOCK, RESCUE)] int64 compaction space
    vocab,
    n_chunks,
    max_mask,
    cap,
    ncand,  # candidate slots per row (a runtime value: one compile serves every batch size)
    seg_len,  # tokens per pass-1 segment (segment c: tokens [c * seg_len, (c + 1) * seg_len))
    CAND_BLOCK: tl.constexpr,
    NCH_BLOCK: tl.constexpr,
    T1: tl.constexpr,
    T2: tl.constexpr,
    CAP_BLOCK: tl.constexpr,
    RESCUE: tl.constexpr,  # keys the rescue gathers at most (a multiple of T2)
    RESCUE_ROUNDS: tl.constexpr,  # rounds of the rescue at most (each reads a segment more)
    FB_BLOCK: tl.constexpr,
    NBISECT: tl.constexpr,
    HAS_STEP: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch after pass 1
    g_ptr=None,  # pass 1's race (band_lanes_kernel's g_ptr, w_ptr), read when raced != 0
    w_ptr=None,
    raced=0,  # a run-time value: one compile serves launches with and without the race
):
    if PDL:
        # Launched early (while pass 1's last programs run): wait until pass 1 has finished
        # and its writes are visible, and let emit_kernel launch early in turn.
        gdc_wait()
        gdc_launch_dependents()
    resolve_row(
        tl.program_id(0).to(tl.int64),
        (cand_key_ptr, m_ptr, s_ptr, d_ptr),
        x_ptr,
        stride_x,
        (temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr, midx_ptr, bounded_ptr),
        (
            tok_ptr,
            lp_ptr,
            size_ptr,
            nan_ptr,
            fb_ptr,
            band_ptr,
            offsets_ptr,
            ids_ptr,
            mask_sizes_ptr,
        ),
        (cnt_ptr, status_ptr, slot_ptr),
        pack,
        scratch_ptr,
        vocab,
        n_chunks,
        max_mask,
        cap,
        ncand,
        seg_len,
        (g_ptr, w_ptr, raced),
        CAND_BLOCK,
        NCH_BLOCK,
        T1,
        T2,
        CAP_BLOCK,
        RESCUE,
        RESCUE_ROUNDS,
        FB_BLOCK,
        NBISECT,
        HAS_STEP,
    )
