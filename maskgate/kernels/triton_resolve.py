"""Pass 2: per row, decide the support from the band candidates, draw, emit the mask slots.

Grid (B,). Sorting all candidates of a row is the expensive step, so it goes in tiers: the
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

from maskgate.kernels.triton_common import (
    EMPTY_KEY,
    GREEDY_T,
    add2_max2,
    cycles,
    max1_add1,
    max3,
    race_winner,
    row_keys,
    unpack_id,
    unpack_z,
    untruncated,
)
from maskgate.kernels.triton_decide import (
    band_past_tier,
    best_sorted,
    decide,
    draw,
    past_tier,
    store_mask,
    support_goal,
)
from maskgate.kernels.triton_emit import help_rows, pack_row
from maskgate.kernels.triton_fallback import (
    HELP_WORDS,
    fallback_draw,
    fallback_gather,
    fallback_support,
    gather_above,
    position_of,
)
from maskgate.kernels.triton_sort import sort_block

# Cycle stamps per row with TIMING: entry, then the ends of stats, keys, the tier sort's four
# steps (search, rank, gather, sort), decide, draw, slot, and the exit (11, every row); then,
# on rows the first tier leaves undecided, the ends of the second tier (or its skip) and of
# the rescue's read, pick and decision (its last round), RESCUE_STAMPS of them; then, on
# rows the whole-row fallback takes, the ends of its search, its draw, a read (the token's
# position, or the gather of S) and the gather with its sort, FALLBACK_STAMPS of them.
MAIN_STAMPS = tl.constexpr(11)
RESCUE_STAMPS = tl.constexpr(4)
FALLBACK_STAMPS = tl.constexpr(4)
PHASES = tl.constexpr(19)
# Mask blocks (the cap rounded up to a power of two) from which a whole-row fallback row's S
# that fits half the block is sorted in half a block.
HALF_SORT_MIN = tl.constexpr(2048)


@triton.jit
def sort_and_store(
    gather, got, n, s_listed, drawn, noise, dest, stamp, TIMING: tl.constexpr, BLOCK: tl.constexpr
):
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
    if TIMING:
        tl.store(stamp + 18, cycles(tl.max(keys, axis=0)))  # after the sort
    ids = unpack_id(keys)
    if s_listed:
        z = tl.where(pos < n, unpack_z(keys), float("-inf"))
        token, logprob, j = draw(keys, z, ids, tl.exp(z - z_max), n, greedy, k0, k1, z_max, BLOCK)
        if TIMING:
            tl.store(stamp + 16, cycles(j))  # after the draw
    emitted = store_mask(
        slot_row, cnt_ptr, status_ptr, midx, ids, pos, n, j, token, max_mask, cap, bounded
    )
    return token, logprob, j, emitted


@triton.jit
def resolve_row(
    row,
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
    # also writes offsets[1]; 2: the row packs its own slot (triton_emit.pack_row)
    ids_ptr,  # [>= N] int32 CSR ids (pack 2)
    mask_sizes_ptr,  # [B] int64, -1 before the launch (pack 2)
    scratch_ptr,  # [B, T1 + T2 + max(CAP_BLOCK, RESCUE)] int64 compaction space
    help_ptr,  # [B, HELP_WORDS] int64, claim words closed (pack 2: the fallback's shared reads)
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
    times_ptr,  # [B, PHASES] int64 cycle stamps of the row's phases, written when TIMING
    TIMING: tl.constexpr,
    EARLY: tl.constexpr,  # the first tier's pick stops once it holds the support
    SHARED: tl.constexpr,  # the whole-row fallback's reads in parts: 0 off, 1 the counting
    # reads, 2 the listing read too (band_config's shared_reads, shared_lists)
    HELP: tl.constexpr,  # with SHARED, a launch that may pack (pack 2): reads are published
    # and waiting rows help (a separate compile, so launches that never pack carry no such code)
    race,  # (g, w, raced): pass 1's race outputs (band_lanes_kernel), read when raced != 0
):
    """One row's whole pass 2. Pass 1's outputs are read through L2 (".cg"): in the fused
    launch (triton_fused.py) other programs wrote them moments ago. With TIMING, the row
    stamps the SM's cycle counter at PHASES points (bench_kernels.py --phases). When pass 1
    raced, a row nothing truncates that asks for no mask takes its token from pass 1's
    race, with no read of the row."""
    stamp = times_ptr + row * PHASES
    g_ptr, w_ptr, raced = race
    if TIMING:
        tl.store(stamp, cycles(row))
    # Every global load first: their latencies overlap instead of queueing behind each
    # block-wide reduction (a reduction's barrier keeps later loads after it).
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

    # Two reductions, the max first: one that merges (max, sum-exp) pairs, rescaling as it
    # goes, put two dependent exps in each of its 8 combine steps and took 600 more cycles
    # on the H200 (bench_kernels.py --phases).
    z_max, d_max, nan_seen = tl.reduce((m_c, d_c, (s_c != s_c).to(tl.int32)), 0, max3)
    greedy = temp.to(tl.float64) < GREEDY_T
    # A NaN or +inf anywhere (s_c is NaN then), or no finite logit: never sampled.
    bad = (nan_seen > 0) | (z_max == float("-inf")) | (z_max == float("inf"))
    z_sum = tl.sum(tl.where(m_c > float("-inf"), s_c * tl.exp(m_c - z_max), 0.0), axis=0)
    if row == 0:
        tl.store(offsets_ptr, tl.zeros([], tl.int64))
    if TIMING:
        tl.store(stamp + 1, cycles((z_sum != z_sum).to(tl.int64)))  # after the stats

    k_on = (k > 0) & (k < vocab)
    p_on = top_p < 1.0
    m_on = min_p > 0.0
    # Nothing truncates: S is every finite token, which pass 1's race draws from (no mask
    # asked) or the fallback finds in one read, so such a row skips the second tier and the
    # rescue (neither can list the whole row).
    whole = untruncated(k, top_p, min_p, temp, vocab)
    k0, k1 = row_keys(seed, step)
    slot_row = slot_ptr + midx * cap
    scratch = scratch_ptr + row * (T1 + T2 + tl.maximum(CAP_BLOCK, RESCUE))

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
    tl.store(band_ptr + row, n_band)
    if TIMING:
        tl.store(stamp + 2, cycles(top_key))  # after the keys

    # The first tier's search stops once it holds 3/4 of T1 (most rows need far fewer); the
    # second's runs in full, since a row there may need all of it.
    cands = (keys, z_all, listed, d_max, z_max, lo, n_lo, below_lo)
    goal = support_goal(z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, greedy)
    best, floor = best_sorted(
        cands, scratch, T1, NBISECT, T1 * 3 // 4, stamp + 3, TIMING, goal, EARLY
    )
    n, undecided, z, ids, mass = decide(
        best, floor, z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, T1
    )
    if TIMING:
        tl.store(stamp + 7, cycles(n))  # after the decision
    n = tl.where(greedy, 1, n)
    token, logprob, j = draw(best, z, ids, mass, n, greedy, k0, k1, z_max, T1)
    if TIMING:
        tl.store(stamp + 8, cycles(token))  # after the draw
    # Greedy: the largest key of all candidates (its chunk always writes it), even when ties
    # leave nothing listed above d_max.
    token = tl.where(greedy, unpack_id(top_key), token)
    fallback = tl.full([], 0, tl.int8)
    emitted = tl.full([], 0, tl.int64)  # ids this row writes to its mask slot
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
        beyond = n < 0  # the support proved longer than T2: no rescue can decide it
        # Each candidate slot's segment floor (segment c's slots: [c * KC, (c + 1) * KC)).
        seg_slot = pos // (ncand // n_chunks)
        d_slot = tl.load(
            d_ptr + row * n_chunks + seg_slot,
            mask=pos < ncand,
            other=float("inf"),
            cache_modifier=".cg",
        )
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
            best2, floor2 = best_sorted(cands, scratch + T1, T2, NBISECT, T2, stamp, False)
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
        if TIMING:
            tl.store(stamp + 11, cycles(n))  # after the second tier (or its skip)
        x_row = x_ptr + row * stride_x
        if undecided & ~whole & ~beyond:
            # The rescue: list every token above t, a segment floor d_c below d_max, then the
            # same decision with t as the floor. Why it works: the row floor d_max is the
            # largest d_c, and a single segment can push it deep into S (a pass-1 lane keeps
            # its two largest tokens, so a lane holding three of the row's top few hundred
            # sets d_c at the third: with n tokens in S over L lanes in all, about
            # n^3 / (6 L^2) of rows, 5% at n = 170 over 8 x 512 lanes). A segment whose floor
            # is at most t is complete above t: its candidates above t are all its tokens
            # above t, so only the segments with floors above t are read again. Round one
            # takes t the second-largest floor (one segment read); when that floor lies in
            # S too (two bad segments, about one rescued row in five at B = 256), the next
            # round takes the next floor down and reads one segment more, up to
            # RESCUE_ROUNDS. Up to RESCUE tokens above t are gathered, and the second tier's
            # pick takes the best T2 of them (t the floor, or the largest gathered z left
            # out): a row whose support fits in T2 decides even with a few thousand tokens
            # above t. When more than RESCUE lie above t the bisection below decides.
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
                    if TIMING:
                        tl.store(stamp + 12, cycles(got.to(tl.int64)))  # after the read
                    fits = got <= RESCUE
                    if fits:
                        if got <= T2:
                            # Every key above t fits the second tier: sort them as they are
                            # (t is the floor), with no search over a block of RESCUE keys
                            # (a rescued row's pick took 44600 cycles with it, 23900
                            # without, on the H200).
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
                            best2, r_floor = best_sorted(
                                r_cands, scratch + T1, T2, NBISECT, T2, stamp, False
                            )
                        if TIMING:
                            tl.store(stamp + 13, cycles(tl.max(best2, axis=0)))  # after the pick
                        n, undecided, z2, ids2, mass2 = decide(
                            best2, r_floor, z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, T2
                        )
                        beyond = undecided & past_tier(
                            n, z2, mass2, r_floor, z_max, z_sum, top_p, k_on, p_on, m_on, T2
                        )
                        if TIMING:
                            tl.store(stamp + 14, cycles(n))  # after the decision
                fits = fits & (t > float("-inf"))  # t at -inf: every segment was read
                rounds += 1
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
            # Pass 1 raced every segment: the row's winner is the best segment winner (the
            # same rule as one race over the row), and pass 1's sums give the log-prob.
            # (Row pointers plus ch, not `stat`: holding that block this long spilled.)
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
        else:
            fallback = tl.full([], 1, tl.int8)
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
                (help_ptr + row * HELP_WORDS, (pack == 2) & HELP),
                SHARED,
                T2,
                FB_BLOCK,
            )
            if TIMING:
                tl.store(stamp + 15, cycles(n))  # after the search
            # A mask row whose S fits the mask block lists S in one read (none when the
            # search's last read, which lists its bracket, could list S too), and the draw, the
            # token's position and the mask all come from the sorted list (a draw over the
            # row, a count of the token's position and a gather took three reads). A row
            # with no mask, or with S longer than the block, draws over the row (one read,
            # no sort), and a bounded mask over the cap then counts the token's position and
            # lists the best cap keys. One gather, sort and store serve both, so the block's
            # sort is compiled once.
            s_listed = (midx >= 0) & (n <= CAP_BLOCK)
            best_cap = (midx >= 0) & bounded & ~s_listed
            if ~s_listed:
                y_key = fallback_draw(x_row, temp, vocab, t_cut, k0, k1, FB_BLOCK)
                if TIMING:
                    tl.store(stamp + 16, cycles(y_key))  # after the draw
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
                if TIMING:
                    tl.store(stamp + 17, cycles(got.to(tl.int64)))  # after the gather's read
                tl.debug_barrier()  # the gather's scattered stores before the load
                # A sort's cost grows faster than its size: from mask blocks of HALF_SORT_MIN
                # keys on, a listed S that fits half the block is sorted in half a block.
                half = s_listed & (n <= CAP_BLOCK // 2) if CAP_BLOCK >= HALF_SORT_MIN else False
                drawn = (token, logprob, j)
                noise = (greedy, k0, k1, z_max)
                dest = (slot_row, cnt_ptr, status_ptr, midx, max_mask, cap, bounded)
                if half:
                    token, logprob, j, emitted = sort_and_store(
                        gather, got, n, s_listed, drawn, noise, dest, stamp, TIMING, CAP_BLOCK // 2
                    )
                else:
                    token, logprob, j, emitted = sort_and_store(
                        gather, got, n, s_listed, drawn, noise, dest, stamp, TIMING, CAP_BLOCK
                    )
            elif midx >= 0:  # exact mode, S over the cap: no ids, status overflow
                emitted = tl.full([], 0, tl.int64)
                tl.store(cnt_ptr + midx, emitted)
                tl.store(status_ptr + midx, tl.full([], 1, tl.int8))
    if TIMING:
        tl.store(
            stamp + 9, cycles(emitted + token + n)
        )  # after the mask slot (or the slower paths)
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
        pack_row(
            row,
            midx,
            emitted,
            slot_row,
            ids_ptr,
            mask_sizes_ptr,
            offsets_ptr,
            (help_ptr, x_ptr, stride_x, vocab),
            1024,
            FB_BLOCK if HELP else 0,  # 0: no help_one
        )
    if TIMING:
        tl.store(stamp + 10, cycles(emitted))


@triton.jit(do_not_specialize=["pack", "n_rows", "raced"])  # one compile serves every value
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
    # also writes offsets[1]; 2: the row packs its own slot (triton_emit.pack_row)
    ids_ptr,  # [>= N] int32 CSR ids (pack 2)
    mask_sizes_ptr,  # [B] int64, -1 before the launch (pack 2)
    scratch_ptr,  # [B, T1 + T2 + max(CAP_BLOCK, RESCUE)] int64 compaction space
    help_ptr,  # [B, HELP_WORDS] int64, claim words closed (pack 2: the fallback's shared reads)
    vocab,
    n_chunks,
    max_mask,
    cap,
    ncand,  # candidate slots per row (a runtime value: one compile serves every batch size)
    seg_len,  # tokens per pass-1 segment (segment c: tokens [c * seg_len, (c + 1) * seg_len))
    n_rows,  # B: programs past it only help the rows' reads (pack 2, band_config's help_waves)
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
    times_ptr,  # [B, PHASES] int64 cycle stamps of the row's phases, written when TIMING
    TIMING: tl.constexpr,
    EARLY: tl.constexpr,  # the first tier's pick stops once it holds the support
    SHARED: tl.constexpr,  # 0, 1 or 2: resolve_row's
    HELP: tl.constexpr,  # resolve_row's: with SHARED, on a launch that may pack
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
    row = tl.program_id(0).to(tl.int64)
    # Without HELP the grid is the rows, and the condition folds away.
    if (row < n_rows) | (not HELP):
        resolve_row(
            row,
            cand_key_ptr,
            m_ptr,
            s_ptr,
            d_ptr,
            x_ptr,
            stride_x,
            temp_ptr,
            topk_ptr,
            topp_ptr,
            minp_ptr,
            bounded_ptr,
            seed_ptr,
            step_ptr,
            midx_ptr,
            tok_ptr,
            lp_ptr,
            size_ptr,
            nan_ptr,
            fb_ptr,
            band_ptr,
            cnt_ptr,
            status_ptr,
            slot_ptr,
            offsets_ptr,
            pack,
            ids_ptr,
            mask_sizes_ptr,
            scratch_ptr,
            help_ptr,
            vocab,
            n_chunks,
            max_mask,
            cap,
            ncand,
            seg_len,
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
            times_ptr,
            TIMING,
            EARLY,
            SHARED,
            HELP,
            (g_ptr, w_ptr, raced),
        )
    elif HELP:
        help_rows(n_rows, mask_sizes_ptr, (help_ptr, x_ptr, stride_x, vocab), 1024, FB_BLOCK)
