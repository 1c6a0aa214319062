"""Pass 2: per row, decide the support from the band candidates, draw, emit the mask slots.

Grid (B,). resolve_row runs one row's phases in order, each a @triton.jit function of its
own (Triton inlines them: the split costs nothing at run time):

  _load_row        pass 1's segment statistics and candidates, the row's parameters
  _row_sums        the row max, the band floor, the NaN flag and the sum of exp(z - z_max)
  _band_keys       which candidates lie above the band floor
  (first tier)     best_sorted, decide and draw over the best T1 candidates (decide.py)
  past_first_tier  a row the first tier leaves undecided (rescue.py): the best T2, unless
                   pass 1's sums prove the support past them; one or more segments read again
                   above a lower floor; pass 1's race winner for a row nothing truncates; or
                   the whole-row fallback (whole_row.py)
  _finish_row      the row's outputs, and its CSR packing

Sorting all candidates of a row is the expensive step, so it goes in tiers: the
best T1 candidates (a z threshold found by bisection, then compacted through scratch memory)
are sorted in-kernel as packed (z, id) keys and decide most rows; rows they cannot decide try
the best T2; rows those cannot decide read the row once for every token above a lower floor (the
rescue), and rows that still cannot decide run the whole-row fallback (fallback.py) in
the same program. The emitted mask is the sorted prefix, already in design order. The decision
rules are those of cpu/decide.py.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    GREEDY_T,
    add2_max2,
    max3,
    row_keys,
    unpack_id,
    unpack_z,
    untruncated,
)
from maskgate.kernels.triton.decide import best_sorted, decide, draw, store_mask, support_goal
from maskgate.kernels.triton.emit import pack_row
from maskgate.kernels.triton.rescue import past_first_tier


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
        token, logprob, n, emitted, fallback = past_first_tier(
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
