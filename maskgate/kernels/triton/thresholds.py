"""The thresholds of the whole-row fallback's search for the cut (fallback.cut_key): three
a read of the row, first in z, then aimed by models of the row's tail fitted to the counts
and masses at the bracket's ends, else the bracket's quarters.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import from_ordered32, ordered32

Z_READS = tl.constexpr(5)  # cut_key's reads at most that take thresholds in z


AIM = tl.constexpr(0.25)  # an aimed read's outer thresholds: this many G tokens either side


AIM_SPAN = tl.constexpr(64)  # reads are aimed only at brackets of at most this many G tokens


@triton.jit
def thresholds(lo, hi, top, reads, ends, cut, G: tl.constexpr):
    """cut_key's three thresholds inside the bracket (lo, hi), ascending (ordered32 values as
    int64; top: the row max's, where hi starts; reads: the search's reads so far; ends:
    (c_lo, m_lo, c_hi, m_hi), the counts and masses above the ends, c_lo < 0 before the
    first read; cut: cut_key's (k, z_norm, top_p, min_p, z_max)).

    For its first Z_READS reads the thresholds are in z, where a row's tokens lie. With no
    lower end yet, they are 16, 8 and 4 nats below the max on the first read, then 48, 32
    and 16 below hi: ordered32 quarters alone spend their first reads on floats no logit
    takes (every magnitude below 1 lies between -1 and 1). Once both ends are counted and at
    most AIM_SPAN * G tokens lie between them, the read is aimed (_aimed): at the cut's z
    estimated from the ends' counts and masses, with the two other thresholds about AIM * G
    tokens above and below it, so that a good estimate leaves a bracket the listing read
    takes. Else, or when those do not split the bracket, its quarter points in z (a bracket
    of at most 64 nats) or in ordered32 space, which reach any single float in 16 reads: a
    search takes Z_READS + 16 at most.

    On SmolLM2's rows at top-p 0.95 whose support is past the tiers the search takes 2 reads
    (3 on one row of 16) with these, against 3-4 with quarters in z after a first read at 48,
    32 and 16 nats. The models fit a tail,
    not a row's bulk: on flat rows (N(0, 1) logits at T = 2, V = 151936) reads aimed at a
    bracket of 150000 tokens missed on the same side of the cut one after another, 7 reads
    a row at top-p 0.95 and 9.5 at 0.5, where quarters in z there take 4.75 at each (means
    of 4 rows).
    A cut inside a long tie at exactly 0.0 pays the Z_READS reads in z for nothing (quarters
    in z halve their way toward 0 through every magnitude below their width), hence the
    cap. Any three thresholds keep the search exact: each is counted, not assumed."""
    span = hi - lo
    o1 = lo + span // 4
    o2 = lo + span // 2
    o3 = lo + span * 3 // 4
    v_hi = from_ordered32(hi.to(tl.int32))
    v_lo = from_ordered32(lo.to(tl.int32))
    open_below = v_lo == float("-inf")
    first = open_below & (hi == top)
    width = v_hi - v_lo
    a1, a2, a3 = _aimed(v_lo, v_hi, ends, cut, G)
    c_lo, _, c_hi, _ = ends
    z1 = tl.where(open_below, v_hi - tl.where(first, 16.0, 48.0), v_lo + 0.25 * width)
    z2 = tl.where(open_below, v_hi - tl.where(first, 8.0, 32.0), v_lo + 0.5 * width)
    z3 = tl.where(open_below, v_hi - tl.where(first, 4.0, 16.0), v_lo + 0.75 * width)
    aim = ~open_below & (c_lo - c_hi <= AIM_SPAN * G)
    aim = aim & (a1 > v_lo) & (a1 < a2) & (a2 < a3) & (a3 < v_hi)
    z1 = ordered32(tl.where(aim, a1, z1)).to(tl.int64)
    z2 = ordered32(tl.where(aim, a2, z2)).to(tl.int64)
    z3 = ordered32(tl.where(aim, a3, z3)).to(tl.int64)
    split = (reads < Z_READS) & (open_below | (width <= 64.0))
    split = split & (lo < z1) & (z1 < z2) & (z2 < z3) & (z3 < hi)
    return tl.where(split, z1, o1), tl.where(split, z2, o2), tl.where(split, z3, o3)


@triton.jit
def _aimed(v_lo, v_hi, ends, cut, G: tl.constexpr):
    """An aimed read's thresholds in the bracket (v_lo, v_hi], ascending when the estimate
    holds (else out of order or NaN, and the caller takes quarters).

    Models, fitted to the ends alone: the count of tokens above v grows exponentially as v
    falls (log-linear between c_hi, at least 1, and c_lo), and so does the mass below v
    (z_norm less the mass above; log-linear between the ends, the lower end's taken as at
    least a thousandth of the target's: its float32 difference can round to 0 or below).
    The cut's estimate is the highest of the top-p one (the mass below v reaching
    (1 - top_p) z_norm), the top-k one (the count reaching k) and the min-p one (exact:
    z_max + ln min_p) among those that bind inside the bracket. The outer thresholds sit
    AIM * G modelled tokens from it, at most halfway to the bracket's ends."""
    c_lo, m_lo, c_hi, m_hi = ends
    k, z_norm, top_p, min_p, z_max = cut
    ok = ~(v_lo == float("-inf")) & (c_lo > tl.maximum(c_hi, 1))
    width = tl.where(ok, v_hi - v_lo, 1.0)
    ch = tl.maximum(c_hi, 1).to(tl.float32)
    cl = tl.where(ok, c_lo.to(tl.float32), 2.0 * ch)
    rate = tl.log(cl / ch) / width  # d ln(count above v) / d(-v), > 0
    tail = z_norm * (1.0 - top_p)
    tail_hi = z_norm - m_hi
    tail_lo = tl.maximum(z_norm - m_lo, tail * 0.001)
    p_on = (top_p < 1.0) & (tail_hi > tail) & (tail > tail_lo)
    log_hi = tl.log(tail_hi)
    span = tl.where(p_on, log_hi - tl.log(tail_lo), 1.0)
    est = tl.where(p_on, v_hi - (log_hi - tl.log(tail)) / span * width, float("-inf"))
    k_on = (k > c_hi) & (k <= c_lo) & (k > 1)
    kf = tl.where(k_on, k, 2).to(tl.float32)
    est = tl.maximum(est, tl.where(k_on, v_hi - tl.log(kf / ch) / rate, float("-inf")))
    m_cut = z_max + tl.log(tl.maximum(min_p, 1e-30))
    m_on = (min_p > 0.0) & (m_cut > v_lo) & (m_cut < v_hi)
    est = tl.maximum(est, tl.where(m_on, m_cut, float("-inf")))
    ok = ok & (est > v_lo) & (est < v_hi)
    est = tl.where(ok, est, 0.5 * (v_lo + v_hi))
    c_est = ch * tl.exp(rate * (v_hi - est))
    up = tl.maximum(c_est - AIM * G, ch)
    down = tl.minimum(c_est + AIM * G, cl)
    a1 = tl.maximum(v_hi - tl.log(down / ch) / rate, est - 0.5 * (est - v_lo))
    a3 = tl.minimum(v_hi - tl.log(up / ch) / rate, est + 0.5 * (v_hi - est))
    nan = float("nan")
    return tl.where(ok, a1, nan), tl.where(ok, est, nan), tl.where(ok, a3, nan)
