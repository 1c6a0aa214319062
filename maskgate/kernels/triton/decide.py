"""Device helpers of resolve_kernel: pick and sort the best candidates, decide |S|, draw, and
write a row's mask slot. The decision rules mirror cpu/decide.py (the torch path).
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    add2,
    add3,
    add3_max3,
    add3_max3_add3,
    add4,
    argmax_key_add,
    gumbel,
    keep_quarter,
    max1_add1,
    quarters,
    unpack_id,
    unpack_z,
)
from maskgate.kernels.triton.sort import sort_block


@triton.jit
def store_mask(slot_row, cnt_ptr, status_ptr, midx, ids, pos, n, j, token, max_mask, cap, bounded):
    """Writes the first ids of a sorted block as the row's mask slot;
    returns how many."""
    over = n > max_mask
    count = tl.where(over, tl.where(bounded, cap, 0), n)
    status = tl.where(over, tl.where(bounded, 2, 1), 0)
    swap = over & bounded & (j >= cap) & (pos == cap - 1)
    out = tl.where(swap, token, ids)
    tl.store(slot_row + pos, out.to(tl.int32), mask=pos < count)
    tl.store(cnt_ptr + midx, count.to(tl.int64))
    tl.store(status_ptr + midx, status.to(tl.int8))
    return count.to(tl.int64)


@triton.jit
def _count_terms(listed, z, q1, q2, q3):
    """Per candidate: whether it is listed and >= each threshold, and its z where it is listed
    and below each (-inf elsewhere)."""
    return (
        (listed & (z >= q1)).to(tl.int32),
        (listed & (z >= q2)).to(tl.int32),
        (listed & (z >= q3)).to(tl.int32),
        tl.where(listed & (z < q1), z, float("-inf")),
        tl.where(listed & (z < q2), z, float("-inf")),
        tl.where(listed & (z < q3), z, float("-inf")),
    )


@triton.jit
def counts_below(listed, z, q1, q2, q3):
    """How many listed z are >= each threshold, and the largest listed z below each: one
    reduction."""
    return tl.reduce(_count_terms(listed, z, q1, q2, q3), 0, add3_max3)


@triton.jit
def counts_mass_below(listed, z, mass, q1, q2, q3):
    """counts_below, and the mass of the listed z >= each threshold, in one reduction."""
    a1, a2, a3, b1, b2, b3 = _count_terms(listed, z, q1, q2, q3)
    return tl.reduce(
        (
            a1,
            a2,
            a3,
            b1,
            b2,
            b3,
            tl.where(a1 != 0, mass, 0.0),
            tl.where(a2 != 0, mass, 0.0),
            tl.where(a3 != 0, mass, 0.0),
        ),
        0,
        add3_max3_add3,
    )


@triton.jit
def support_goal(z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, greedy):
    """When a pick of the best candidates holds the whole support, whatever it decides: the
    pick (every listed z >= hi, n of them, mass m relative to z_max) covers S when
    n >= k_goal, m >= p_goal or hi < m_bound (skip: a greedy row needs only the max). Each
    is a sufficient condition with a margin for float rounding; a pick they let through
    that still falls short only leaves the row to the next tier."""
    k_goal = tl.where(k_on, k, 1 << 40)
    # top-p alone: the first token below a pick of mass >= top_p * z_sum is outside S. (With
    # top-k too, its normaliser is the top-k mass, unknown until k tokens are picked.)
    p_goal = tl.where(p_on & ~k_on, top_p * z_sum * 1.0001, float("inf"))
    m_bound = tl.where(m_on, z_max + tl.log(min_p) - 1e-3, float("-inf"))
    return k_goal, p_goal, m_bound, greedy


@triton.jit
def best_sorted(
    cands,
    scratch,
    LIMIT: tl.constexpr,
    NBISECT: tl.constexpr,
    STOP: tl.constexpr,
    goal=None,
    EARLY: tl.constexpr = False,
):
    """The best (at most LIMIT) listed candidates, sorted, and the new floor below them.

    cands = (keys, z, listed, d_max, z_max, lo, n_lo, below_lo): [CAND_BLOCK] unsorted
    candidates with their z and whether they lie above the floor d_max; lo the lowest z worth
    sorting (max(d_max, z_max - 30)), n_lo the listed candidates with z >= lo and below_lo the
    largest listed z below lo, which the caller reduces along with values it needs anyway. Returns
    ([LIMIT] sorted keys, floor): every token with z > floor is among the returned keys. The
    threshold search stops once at least STOP candidates are picked (STOP = LIMIT: the full
    search). With EARLY, it also stops once the pick holds the row's whole support by goal
    (support_goal's tuple) and the candidates' mass exp(z - z_max): a row whose support is a
    few dozen tokens stops after a step or two instead of picking STOP.
    """
    keys, z, listed, d_max, z_max, lo, n_lo, below_lo = cands
    n_pick = n_lo
    below = below_lo
    if n_lo > LIMIT:
        # Invariant: more than LIMIT listed at z >= lo, n_pick (at most LIMIT) at z >= hi and
        # `below` the largest listed z under hi. Each step counts at three thresholds (and
        # takes the largest z under each) in one reduction and keeps the quarter that
        # crosses; the search stops early once hi keeps STOP (each step is a block-wide
        # reduction on the row's critical path). n_pick = -1 while hi is the row max: the
        # count there is not known, and more than LIMIT ties there never move hi.
        hi = z_max
        n_pick = tl.full([], -1, tl.int32)
        below = tl.full([], float("-inf"), tl.float32)
        steps = tl.zeros([], tl.int32)
        enough = steps != 0  # False
        if EARLY:
            k_goal, p_goal, m_bound, enough = goal
            mass = tl.where(listed, tl.exp(z - z_max), 0.0)
            m_pick = tl.zeros([], tl.float32)
        while (steps < NBISECT // 2) & (n_pick < STOP) & ~enough:
            t1, t2, t3 = quarters(lo, hi)
            if EARLY:
                c1, c2, c3, b1, b2, b3, m1, m2, m3 = counts_mass_below(listed, z, mass, t1, t2, t3)
                m_pick = tl.where(
                    c3 > LIMIT, m_pick, tl.where(c2 > LIMIT, m3, tl.where(c1 > LIMIT, m2, m1))
                )
            else:
                c1, c2, c3, b1, b2, b3 = counts_below(listed, z, t1, t2, t3)
            n_pick = tl.where(
                c3 > LIMIT, n_pick, tl.where(c2 > LIMIT, c3, tl.where(c1 > LIMIT, c2, c1))
            )
            below = tl.where(
                c3 > LIMIT, below, tl.where(c2 > LIMIT, b3, tl.where(c1 > LIMIT, b2, b1))
            )
            lo, hi = keep_quarter(lo, hi, t1, t2, t3, c1, c2, c3, LIMIT)
            if EARLY:
                enough = (n_pick >= k_goal) | (m_pick >= p_goal) | (hi < m_bound)
            steps += 1
        lo = hi
    pick = listed & (z >= lo)
    rank = tl.cumsum(pick.to(tl.int32), axis=0) - 1
    if n_pick < 0:  # hi stayed at the row max: count there, LIMIT at most (lowest ids first)
        pick = pick & (rank < LIMIT)
        below, n_pick = tl.reduce(
            (tl.where(listed & ~pick, z, float("-inf")), pick.to(tl.int32)), 0, max1_add1
        )
    floor = tl.maximum(d_max, below)
    tl.store(scratch + rank, keys, mask=pick)
    tl.debug_barrier()  # the scattered stores before the block load
    best = sort_block(scratch, n_pick, LIMIT)
    return best, floor


@triton.jit
def decide(keys, d_max, z_max, z_sum, k, k_on, top_p, p_on, min_p, m_on, BLOCK: tl.constexpr):
    """|S| from sorted keys whose tokens above d_max form an exact prefix of design order.

    Returns (n, undecided, z, ids, mass), the last three per sorted slot. Two block-wide
    reductions (each carrying several sums) and one scan.
    """
    pos = tl.arange(0, BLOCK)
    ids = unpack_id(keys)
    z = tl.where(keys == EMPTY_KEY, float("-inf"), unpack_z(keys))
    complete = d_max == float("-inf")
    listed = z > d_max  # a prefix of the slots: they are sorted
    mass = tl.where(listed, tl.exp(z - z_max), 0.0)
    min_p64 = min_p.to(tl.float64)
    rel = tl.exp(z.to(tl.float64) - z_max.to(tl.float64))
    # z_k: the mass of the first min(k, n_listed) slots (all listed ones when k reaches past
    # them), the top-k normaliser when k is on.
    n_listed, cut_m, z_k, mass_all = tl.reduce(
        (
            listed.to(tl.int64),
            (listed & (rel >= min_p64)).to(tl.int64),
            tl.where(pos < k, mass, 0.0),
            mass,
        ),
        0,
        add4,
    )
    big = BLOCK + 1
    k_known = ~k_on | complete | (k <= n_listed)
    cut_k = tl.where(k_on, tl.minimum(k, n_listed), n_listed)
    cut_k = tl.where(k_known, cut_k, big)
    cut_k = tl.where(~k_on & ~complete, big, cut_k)
    z_norm = tl.where(k_on, z_k, z_sum)
    before = tl.cumsum(mass, axis=0) - mass
    # IEEE division: dyadic boundaries (e.g. 55 / 110 == 0.5) must compare exactly.
    frac = tl.math.div_rn(before, tl.zeros_like(before) + z_norm)
    # top-k reaching past the listed tokens (a peaked row: fewer than k tokens in the band):
    # the top-k mass is unknown but bounded, z_norm <= z_k <= z_hi, since each unlisted
    # token has z <= d_max. The cut is decided when both bounds give it.
    p_blind = p_on & k_on & ~k_known
    z_hi = z_norm + tl.where(p_blind, (k - n_listed).to(tl.float32), 0.0) * tl.exp(d_max - z_max)
    frac_hi = tl.math.div_rn(before, tl.zeros_like(before) + z_hi)
    cut_p, cut_hi = tl.reduce(
        ((listed & (frac < top_p)).to(tl.int64), (listed & (frac_hi < top_p)).to(tl.int64)),
        0,
        add2,
    )
    p_blind = p_blind & (cut_hi != cut_p)
    next_kept = tl.math.div_rn(mass_all, z_hi) < top_p
    cut_p = tl.where(complete | (cut_p < n_listed) | ~next_kept, cut_p, big)
    beyond = tl.exp(d_max.to(tl.float64) - z_max.to(tl.float64)) >= min_p64
    cut_m = tl.where(complete | (cut_m < n_listed) | ~beyond, cut_m, big)
    n = tl.minimum(cut_k, tl.where(p_on, cut_p, big))
    n = tl.minimum(n, tl.where(m_on, cut_m, big))
    n = tl.where(complete, tl.minimum(n, n_listed), n)
    undecided = (n > n_listed) | p_blind
    return tl.maximum(n, 1), undecided, z, ids, mass


# A bound on the mass of a tier's best keys must clear top_p * z_sum by this factor before a
# row is sent past the tiers: the bound and the tiers' own cumulative sums round differently
# (float32 sums, pass 1's sums in logit space), so a row within 1e-4 of the boundary keeps
# its rescue. (support_goal's margin.)
TIER_MARGIN = tl.constexpr(1.0001)


@triton.jit
def past_tier(n, z, mass, floor, z_max, z_sum, top_p, k_on, p_on, m_on, BLOCK: tl.constexpr):
    """Whether decide() proved a top-p row's support longer than its BLOCK slots, so that no
    tier of BLOCK keys, the rescue's included, can hold it and the row goes to the whole-row
    fallback at once. decide() kept every listed slot and the token after them (n past
    BLOCK); then either every slot is listed above the floor, or the listed mass plus one
    token of z = floor for each slot left (every token not listed has z <= floor) is still
    short of top_p: either way the first BLOCK tokens of design order leave the next one
    kept. With top-p alone that is exact (the row's own normaliser); with top-k or min-p on,
    the token after the slots may still be cut, and the rescue runs as before."""
    listed = z > floor  # a prefix of the sorted slots
    n_listed, m_listed = tl.reduce((listed.to(tl.int32), mass), 0, add2)
    head = m_listed + (BLOCK - n_listed).to(tl.float32) * tl.exp(floor - z_max)
    short = (n_listed == BLOCK) | (head * TIER_MARGIN < top_p * z_sum)
    return p_on & ~k_on & ~m_on & (n > BLOCK) & short


@triton.jit
def _share_above(e, u):
    """w = max(1 - u / e, 0): at most this share of an unlisted token's mass (at most e) lies
    above the level u (band_past_tier's bound)."""
    return tl.where(e > u, 1.0 - u / e, 0.0)


@triton.jit
def band_past_tier(
    z, d_slot, m_c, s_c, d_c, in_ch, t1, t2, t3, z_max, z_sum, top_p, BLOCK: tl.constexpr
):
    """Whether pass 1's candidates and segment sums alone prove a top-p-only support longer
    than BLOCK tokens (the rescue's tier): before the rescue reads anything.

    Segment c lists every token it holds above its floor d_c (z > d_slot, the floor of the
    candidate's segment): a known mass a each. Its other tokens have z <= d_c, mass at most
    e_c = exp(d_c - z_max) each and U_c = S_c - (its known mass) in all, S_c its pass-1 sum.
    For any level tau, the best BLOCK tokens of the row have mass at most
    BLOCK * tau + sum over all tokens of max(a - tau, 0), and an unknown token of segment c
    adds at most a * w_c, w_c = max(1 - tau / e_c, 0), so U_c * w_c for the segment: the
    head bound BLOCK * tau + sum_known (max(a - tau, 0) - a * w_c) + sum_c S_c * w_c. When
    it is short of top_p * z_sum at any tau, token BLOCK + 1 is kept and |S| > BLOCK. tau
    is taken at the three segment floors t1 > t2 > t3 below the highest (the floors of the
    rescue's rounds): on SmolLM2 rows the best level lies there."""
    known = z > d_slot  # not the empty slots (z = -inf) nor the padding (d_slot = inf)
    a = tl.where(known, tl.exp(z - z_max), 0.0)
    e_slot = tl.exp(d_slot - z_max)
    u1 = tl.exp(t1 - z_max)
    u2 = tl.exp(t2 - z_max)
    u3 = tl.exp(t3 - z_max)
    k1, k2, k3 = tl.reduce(
        (
            tl.maximum(a - u1, 0.0) - a * _share_above(e_slot, u1),
            tl.maximum(a - u2, 0.0) - a * _share_above(e_slot, u2),
            tl.maximum(a - u3, 0.0) - a * _share_above(e_slot, u3),
        ),
        0,
        add3,
    )
    seg = tl.where(in_ch & (m_c > float("-inf")), s_c * tl.exp(m_c - z_max), 0.0)
    e_c = tl.exp(d_c - z_max)
    c1, c2, c3 = tl.reduce(
        (
            seg * _share_above(e_c, u1),
            seg * _share_above(e_c, u2),
            seg * _share_above(e_c, u3),
        ),
        0,
        add3,
    )
    head = tl.minimum(BLOCK * u1 + k1 + c1, tl.minimum(BLOCK * u2 + k2 + c2, BLOCK * u3 + k3 + c3))
    return head * TIER_MARGIN < top_p * z_sum


@triton.jit
def draw(keys, z, ids, mass, n, greedy, k0, k1, z_max, BLOCK: tl.constexpr):
    """Gumbel-max over the first n sorted slots: (token, logprob, slot of the token). One
    reduction finds the winning slot with its key and sums the support's mass."""
    pos = tl.arange(0, BLOCK)
    in_s = pos < n
    score = tl.where(in_s, z + gumbel(k0, k1, ids), float("-inf"))
    _, j, key, s_mass = tl.reduce((score, pos, keys, tl.where(in_s, mass, 0.0)), 0, argmax_key_add)
    lse = z_max + tl.log(s_mass)
    token = unpack_id(key)
    return token, tl.where(greedy, 0.0, unpack_z(key) - lse), tl.where(greedy, 0, j.to(tl.int64))
