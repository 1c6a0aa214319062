"""Exact support for the rows the band cannot decide (flat rows, long top-p tails), and for
the rows nothing truncates.

Called from the resolve kernel, one program per row. gather_above is the cheap step: it reads
the segments pass 1 left incomplete (twice: count, then write) and lists every token above a
lower floor than pass 1's (resolve_kernel's rescue).
The fallback proper (fallback_support, cut_key) reads the whole row several times: a search
for the cut's z that counts three thresholds a read (at most Z_READS + 16 reads; 2-3 on a
real model's wide rows, 3-5 on flat ones, before the tokens left in its bracket fit a list
it sorts; one read when only min-p or nothing cuts), then the caller's draw (one read of
the row, or a read that lists S and a draw over the list; when everything above the
bracket's lower end fits the mask block, the bracket's read lists S as well and the caller
reads nothing more); the caller counts the rows that take it.
S = {key >= t*} where t* is the smallest key t whose token would be kept:
  top-k: #{key > t} < k;  top-p: mass{key > t} / Z_k < top_p;  min-p: exp(z(t) - M) >= min_p.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    INT32_MAX,
    MASK32,
    from_ordered32,
    logit_floor,
    ordered32,
    pack_key,
    race_step,
    race_winner,
    scale,
    scale_temp,
    unpack_z,
)
from maskgate.kernels.triton.sort import sort_block

INT64_MAX = tl.constexpr(2**63 - 1)


@triton.jit
def _row_keys(x_row, temp, vocab, start, BLOCK: tl.constexpr):
    """Keys, z (NaN-free) and ids of one block of a row."""
    ids = start + tl.arange(0, BLOCK)
    x = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
    z = _z_of(x, temp)
    ids64 = ids.to(tl.int64)
    return pack_key(z, ids64), z, ids64


@triton.jit
def _z_of(x, temp):
    """z of raw logits, NaN taken as -inf (a NaN row never gets here: it is flagged).

    At temperature 1 (greedy rows too) z = RN(x / 1) is x itself, so the reads of the row
    skip the IEEE division (a few dozen instructions a token) and give the same bits."""
    x = x.to(tl.float32)
    if scale_temp(temp) == 1.0:  # noqa: SIM108 (a branch: the division is not computed)
        z = tl.where(x == 0.0, 0.0, x)  # scale() folds -0.0 to +0.0
    else:
        z = scale(x, temp)
    return tl.where(z != z, float("-inf"), z)


@triton.jit
def _load_block(x_row, vocab, start, BLOCK: tl.constexpr):
    ids = start + tl.arange(0, BLOCK)
    return tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))


# The row reads below keep their sums per lane (no block-wide step inside the loop) and issue
# the next block's load before the current block's work: one program reads the whole row, and a
# loop that waits for each load in turn ran at a few GB/s.


@triton.jit
def _above3(x_row, temp, vocab, q1, q2, q3, z_max, BLOCK: tl.constexpr):
    """For three thresholds q (ordered32 values of z): how many tokens have
    ordered32(z) > q, and their sum exp(z - z_max), in one read of the row (one float32 sum
    a lane over the whole row).

    At temperature 1 (and on greedy rows, which scale by 1) z is x itself, so the read
    compares raw logits with the thresholds' floats and divides nothing: the same counts
    and masses bit for bit. Other temperatures divide every logit. A read in logits there
    would compare exactly against each threshold's logit floor, but its masses,
    exp((x - x_ref) / T), would differ from exp(z - z_max) by the rounding of z: up to
    2.7e-6 of a row's mass on SmolLM2's rows at T = 0.7, past the oracle's 2e-6 band for a
    top-p boundary."""
    c1 = tl.zeros([BLOCK], tl.int32)
    c1, c2, c3, m1, m2, m3 = _count3(x_row, temp, 0, vocab, q1, q2, q3, z_max, c1, c1, c1, BLOCK)
    # Separate sums, not one tuple reduction: once a read, and the interpreter (CI) runs
    # a tuple reduction element by element.
    return (
        tl.sum(c1, axis=0),
        tl.sum(c2, axis=0),
        tl.sum(c3, axis=0),
        tl.sum(m1, axis=0),
        tl.sum(m2, axis=0),
        tl.sum(m3, axis=0),
    )


@triton.jit
def _count3(x_row, temp, start, end, q1, q2, q3, z_max, c1, c2, c3, BLOCK: tl.constexpr):
    """The counts c plus each lane's tokens of [start, end) with ordered32(z) above q1..q3,
    and each lane's float32 masses of them: in raw logits at temperature 1, else in z."""
    if scale_temp(temp) == 1.0:
        v1, v2, v3 = _float_above(q1), _float_above(q2), _float_above(q3)
        c1, c2, c3, m1, m2, m3 = _read3(
            x_row, temp, start, end, v1, v2, v3, z_max, c1, c2, c3, False, BLOCK
        )
    else:
        c1, c2, c3, m1, m2, m3 = _read3(
            x_row, temp, start, end, q1, q2, q3, z_max, c1, c2, c3, True, BLOCK
        )
    return c1, c2, c3, m1, m2, m3


@triton.jit
def _float_above(q):
    """v with ordered32(z) > q exactly when z > v, for every z but -0.0 (scale() folds it
    to +0.0). q = -1 is ordered32(-0.0): IEEE z > -0.0 would leave out z = +0.0, so it
    takes the next float below, the negative denormal of least magnitude."""
    return from_ordered32(tl.where(q == -1, -2, q))


@triton.jit
def _read3(
    x_row,
    temp,
    start,
    end,
    t1,
    t2,
    t3,
    z_max,
    c1,
    c2,
    c3,
    IN_Z: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """_count3's read of tokens [start, end): the counts c plus each lane's tokens above
    t1..t3, and each lane's float32 masses. With IN_Z, every logit divided, t1..t3 ordered32
    thresholds of z; else (temperature 1, z = x) raw logits against float thresholds."""
    m1 = tl.zeros([BLOCK], tl.float32)
    m2 = tl.zeros([BLOCK], tl.float32)
    m3 = tl.zeros([BLOCK], tl.float32)
    x = _load_block(x_row, end, start, BLOCK)
    for b in range(start, end, BLOCK):
        x_next = _load_block(x_row, end, b + BLOCK, BLOCK)
        if IN_Z:
            z = _z_of(x, temp)
            v = ordered32(z)  # -inf (padding included) is below every threshold
        else:
            z = x.to(tl.float32)
            v = z  # NaN and the padding's -inf: above no threshold
        e = tl.exp(z - z_max)
        g1 = v > t1
        g2 = v > t2
        g3 = v > t3
        c1 += g1.to(tl.int32)
        c2 += g2.to(tl.int32)
        c3 += g3.to(tl.int32)
        m1 += tl.where(g1, e, 0.0)
        m2 += tl.where(g2, e, 0.0)
        m3 += tl.where(g3, e, 0.0)
        x = x_next
    return c1, c2, c3, m1, m2, m3


@triton.jit
def _level_ids3(x_row, temp, vocab, level, q1, q2, q3, BLOCK: tl.constexpr):
    """How many tokens with ordered32(z) == level have an id <= each of q1, q2, q3."""
    c1 = tl.zeros([BLOCK], tl.int32)
    c2 = tl.zeros([BLOCK], tl.int32)
    c3 = tl.zeros([BLOCK], tl.int32)
    lane = tl.arange(0, BLOCK)
    x = _load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = _load_block(x_row, vocab, start + BLOCK, BLOCK)
        on = ordered32(_z_of(x, temp)) == level
        ids = start + lane
        c1 += (on & (ids <= q1)).to(tl.int32)
        c2 += (on & (ids <= q2)).to(tl.int32)
        c3 += (on & (ids <= q3)).to(tl.int32)
        x = x_next
    return tl.sum(c1, axis=0), tl.sum(c2, axis=0), tl.sum(c3, axis=0)


@triton.jit
def _kept(q, c, m, k, z_norm, top_p, min_p, z_max):
    """Whether a token of z = from_ordered32(q) with c tokens of mass m (relative to z_max)
    above it is kept. k: int64 (above vocab: off); top_p: float32 (>= 1 off); min_p (<= 0
    off)."""
    v = from_ordered32(q)
    keep = (c < k) & (v > float("-inf"))
    keep = keep & ((top_p >= 1.0) | (tl.math.div_rn(m, z_norm) < top_p))
    rel = tl.exp(v.to(tl.float64) - z_max.to(tl.float64))
    return keep & ((min_p <= 0.0) | (rel >= min_p.to(tl.float64)))


@triton.jit
def _pick3(p1, p2, p3, a, a1, a2, a3, b):
    """Along a threshold search whose predicate is false below the answer and true from it:
    the value at the new upper end (first of q1, q2, q3 that holds, else the old one, a) and at
    the new lower end (the last that does not hold, else the old one, b)."""
    hi = tl.where(p1, a1, tl.where(p2, a2, tl.where(p3, a3, a)))
    lo = tl.where(p1, b, tl.where(p2, a1, tl.where(p3, a2, a3)))
    return hi, lo


@triton.jit
def cut_key(
    x_row,
    temp,
    vocab,
    k,
    z_norm,
    top_p,
    min_p,
    z_max,
    scratch_row,
    s_row,
    list_cap,
    need_key,
    G: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The kept prefix of design order: (t, n, mass, s_out) with the kept tokens exactly those with
    key >= t, n of them, of mass sum exp(z - z_max) (float32). k: int64 (above vocab: off);
    top_p: float32 of z_norm (>= 1: off); min_p (<= 0: off). t is not always
    needed (n and mass are), and with need_key False it is left at the cut's z when the cut
    splits a tie.

    A token is kept when the tokens before it, c of mass m, leave c < k, m / z_norm < top_p,
    and its own exp(z - z_max) >= min_p. First the cut's z: P(v), "a token of z = v with every
    token of larger z before it is kept", is false below it and true from it, and is counted
    at three thresholds a read (_thresholds: in z at first, then in the row's ordered32 space,
    2^32 values: Z_READS + 16 reads at most; none when only min-p is on, since P then depends
    on v alone), until at most G tokens lie
    between the bracket's ends: one more read lists them in scratch_row (G slots), sorted
    they give the cut directly. A bracket closed on one z with more than G tokens (a long
    tie) is cut with no read: its tokens (ids ascending) have the same mass each, so the
    kept count J follows from the counts, and only when J splits them does a search over
    the ids (three counts a read) find the J-th id.

    s_out: the kept tokens are in s_row, unsorted (_cut_listed, when every token above the
    bracket's lower end fits list_cap slots; list_cap 0 never lists)."""
    # The bracket (lo, hi] in ordered32 space, held as int64 (its span exceeds int32): P(lo)
    # false, P(hi) true, each end's count and mass above it once counted (c < 0: not yet).
    lo = ordered32(tl.full([], float("-inf"), tl.float32)).to(tl.int64)  # P(-inf) is false
    hi = ordered32(z_max).to(tl.int64)  # nothing above the max: P holds (k >= 1, top_p > 0)
    top = hi
    reads = tl.full([], 0, tl.int32)
    c_hi = tl.full([], 0, tl.int32)
    m_hi = tl.full([], 0.0, tl.float32)
    c_lo = tl.full([], -1, tl.int32)
    m_lo = tl.full([], 0.0, tl.float32)
    if (k > vocab) & (top_p >= 1.0):
        # Only min-p (or nothing) cuts: P depends on v alone, so the search needs no read.
        none = tl.full([], 0, tl.int32)
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            up = _kept(mid.to(tl.int32), none, m_hi, k, z_norm, top_p, min_p, z_max)
            hi = tl.where(up, mid, hi)
            lo = tl.where(up, lo, mid)
        c_hi = tl.full([], -1, tl.int32)
    while (hi - lo > 1) & ((c_lo < 0) | (c_lo - c_hi > G)):
        q1, q2, q3 = _thresholds(
            lo, hi, top, reads, (c_lo, m_lo, c_hi, m_hi), (k, z_norm, top_p, min_p, z_max), G
        )
        reads += 1
        n1, n2, n3, s1, s2, s3 = _above3(
            x_row,
            temp,
            vocab,
            q1.to(tl.int32),
            q2.to(tl.int32),
            q3.to(tl.int32),
            z_max,
            BLOCK,
        )
        p1 = _kept(q1.to(tl.int32), n1, s1, k, z_norm, top_p, min_p, z_max)
        p2 = _kept(q2.to(tl.int32), n2, s2, k, z_norm, top_p, min_p, z_max)
        p3 = _kept(q3.to(tl.int32), n3, s3, k, z_norm, top_p, min_p, z_max)
        c_hi, c_lo = _pick3(p1, p2, p3, c_hi, n1, n2, n3, c_lo)
        m_hi, m_lo = _pick3(p1, p2, p3, m_hi, s1, s2, s3, m_lo)
        hi, lo = _pick3(p1, p2, p3, hi, q1, q2, q3, lo)
    hi32 = hi.to(tl.int32)
    if (c_lo < 0) | (c_hi < 0):  # an end of the bracket was never counted
        c_lo, c_hi, _, m_lo, m_hi, _ = _above3(
            x_row, temp, vocab, lo.to(tl.int32), hi32, hi32, z_max, BLOCK
        )
    # At most G tokens between the ends: list them, sort them and cut there (one read);
    # else the bracket is one z, and its tokens share their mass.
    s_out = tl.full([], 0, tl.int1)
    if hi - lo > 1:
        t, n, mass, s_out = _cut_listed(
            x_row,
            temp,
            vocab,
            lo.to(tl.int32),
            hi32,
            c_lo - c_hi,
            c_hi,
            m_hi,
            k,
            z_norm,
            top_p,
            min_p,
            z_max,
            scratch_row,
            s_row,
            list_cap,
            G,
            BLOCK,
        )
    else:
        t, n, mass = _cut_in_level(
            x_row,
            temp,
            vocab,
            hi,
            c_hi,
            m_hi,
            c_lo - c_hi,
            k,
            z_norm,
            top_p,
            z_max,
            need_key,
            BLOCK,
        )
    return t, n, mass, s_out


Z_READS = tl.constexpr(5)  # cut_key's reads at most that take thresholds in z
AIM = tl.constexpr(0.25)  # an aimed read's outer thresholds: this many G tokens either side
AIM_SPAN = tl.constexpr(64)  # reads are aimed only at brackets of at most this many G tokens


@triton.jit
def _thresholds(lo, hi, top, reads, ends, cut, G: tl.constexpr):
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


@triton.jit
def _cut_in_level(
    x_row,
    temp,
    vocab,
    hi,
    c_hi,
    m_hi,
    n_v,
    k,
    z_norm,
    top_p,
    z_max,
    need_key,
    BLOCK: tl.constexpr,
):
    """cut_key's end when its bracket is one z, v = from_ordered32(hi), with c_hi tokens of
    mass m_hi above it and n_v at it."""
    hi32 = hi.to(tl.int32)
    e_v = tl.exp(from_ordered32(hi32) - z_max)
    # The j-th token at v (from 0, ids ascending) is kept when c_hi + j < k and
    # (m_hi + j e_v) / z_norm < top_p (min-p holds at v by P). The first j that fails the
    # top-p test, by a search over j (no read): kept counts are monotone in j.
    j_lo = tl.full([], 0, tl.int32)  # kept (P at v)
    j_hi = n_v  # the first failing j lies in (j_lo, j_hi]; n_v when none fails
    if top_p < 1.0:
        while j_hi - j_lo > 1:
            j = j_lo + (j_hi - j_lo) // 2
            ok = tl.math.div_rn(m_hi + j.to(tl.float32) * e_v, z_norm) < top_p
            j_lo = tl.where(ok, j, j_lo)
            j_hi = tl.where(ok, j_hi, j)
    n_keep = tl.minimum(tl.minimum(j_hi, n_v).to(tl.int64), k - c_hi.to(tl.int64)).to(tl.int32)
    n_keep = tl.where(n_v > 0, tl.maximum(n_keep, 1), 0)
    level = hi << 32
    t = level  # every token at v kept: the lowest key at v (ids < 2^32)
    if need_key & (n_keep < n_v):
        # The n_keep-th id at v: the smallest id q with n_keep tokens at v of id <= q.
        i_lo = tl.full([], -1, tl.int32)  # count 0 < n_keep
        i_hi = tl.full([], 0, tl.int32) + vocab - 1  # count n_v >= n_keep
        while i_hi - i_lo > 1:
            span = i_hi - i_lo
            q1 = i_lo + tl.maximum(span // 4, 1)
            q2 = tl.minimum(i_lo + tl.maximum(span // 2, 1), i_hi)
            q3 = tl.minimum(i_lo + tl.maximum(span * 3 // 4, 1), i_hi)
            a1, a2, a3 = _level_ids3(x_row, temp, vocab, hi32, q1, q2, q3, BLOCK)
            i_hi, i_lo = _pick3(a1 >= n_keep, a2 >= n_keep, a3 >= n_keep, i_hi, q1, q2, q3, i_lo)
        t = level | (MASK32 - i_hi.to(tl.int64))
    n = (c_hi + n_keep).to(tl.int64)
    mass = m_hi + n_keep.to(tl.float32) * e_v
    return t, n, mass


@triton.jit
def fallback_support(
    x_row,
    temp,
    vocab,
    k,
    top_p,
    min_p,
    z_max,
    z_sum,
    max_mask,
    emit_cap,
    scratch_row,
    s_row,
    list_cap,
    G: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """(t*, |S|, sum_{S} exp(z - z_max), t_emit, s_out) of one row: S = {key >= t*}, and
    the mask it emits is {key >= t_emit}: t* itself, or with emit_cap > 0 (bounded mode) and
    |S| over max_mask, the best emit_cap keys. scratch_row: G slots for the search's list;
    s_out: S is in s_row, unsorted (the cut's search lists it when every token above its
    bracket fits list_cap slots).

    k: int64 (above vocab: off). With top-k and top-p both on, top-p renormalises over the
    top-k mass, found first. The up to three searches run in one loop, so cut_key's code is
    laid out once (inlined three times, it made resolve_kernel's sm_90 code a third
    larger and its compile about three times as long)."""
    never = tl.full([], 2.0, tl.float32)
    z_norm = z_sum
    t_cut = tl.full([], 0, tl.int64)
    n = tl.full([], 0, tl.int64)
    mass = tl.full([], 0.0, tl.float32)
    t_emit = tl.full([], 0, tl.int64)
    s_out = tl.full([], 0, tl.int1)
    # 0: the top-k mass (top-k with top-p), 1: the cut, 2: the best emit_cap keys; 3: done
    phase = tl.where((k < vocab) & (top_p < 1.0), 0, 1)
    while phase < 3:
        cut = phase == 1
        t, c, m, l_s = cut_key(
            x_row,
            temp,
            vocab,
            tl.where(phase == 2, emit_cap.to(tl.int64), k),
            z_norm,
            tl.where(cut, top_p, never),
            tl.where(cut, min_p, 0.0),
            z_max,
            scratch_row,
            s_row,
            tl.where(cut, list_cap, 0),
            phase > 0,
            G,
            BLOCK,
        )
        z_norm = tl.where(phase == 0, m, z_norm)
        t_cut = tl.where(cut, t, t_cut)
        n = tl.where(cut, c, n)
        mass = tl.where(cut, m, mass)
        t_emit = tl.where(cut, t, tl.where(phase == 2, t, t_emit))
        s_out = tl.where(cut, l_s, s_out)
        phase = tl.where(cut & (emit_cap > 0) & (c > max_mask), 2, tl.where(phase == 0, 1, 3))
    return t_cut, n, mass, t_emit, s_out


@triton.jit
def fallback_draw(x_row, temp, vocab, t_cut, k0, k1, BLOCK: tl.constexpr):
    """Gumbel-max over {key >= t_cut}: the winner's key (ties: earlier in design order)."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_key = tl.full([BLOCK], EMPTY_KEY, tl.int64)
    lane = tl.arange(0, BLOCK)
    x = _load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = _load_block(x_row, vocab, start + BLOCK, BLOCK)
        z = _z_of(x, temp)
        ids = (start + lane).to(tl.int64)
        best, best_key = race_step(z, ids, pack_key(z, ids) >= t_cut, k0, k1, best, best_key)
        x = x_next
    return race_winner(best, best_key)


@triton.jit
def gather_above(
    x_row,
    temp,
    vocab,
    t,
    d_c,
    ch,
    seg_len,
    keys,
    z,
    known,
    scratch_row,
    LIMIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Writes every key of the row with z > t to scratch_row, unsorted, and returns their
    count (when it is over LIMIT, what was written must not be used).

    d_c: the row's pass-1 segment floors over ch (a block of segment numbers, padded with
    -inf; segment c holds tokens [c * seg_len, (c + 1) * seg_len)). A segment whose floor
    is at most t is complete above t, and the caller already holds its keys above t: the
    block `keys` (with their z) where `known` is set. Those are written first, then the
    other segments add their tokens above t. The keys are all tokens with z > t, an exact
    prefix of design order above the floor t, whatever pass 1 kept. The caller loads as many
    as it needs: a block of LIMIT costs every block-wide step after it four times a block of
    the second tier.

    The segments are read twice, with no block-wide step inside either read: the first
    counts each lane's tokens above t, one scan turns the counts into each lane's first
    slot, and the second read (from L2: one or two segments of one row) writes each lane's
    tokens from there. One read with a scan and a sum per block to place its tokens cost
    about twice as long.
    """
    tl.debug_barrier()  # earlier reads of this scratch row before the stores below
    # (The candidates' block and the read's block differ in size below 2048 candidates, so
    # the read's values take names of their own: Triton types a name assigned before a
    # loop and inside it as one loop-carried variable.)
    sel = known & (z > t)
    rank = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(scratch_row + rank, keys, mask=sel & (rank < LIMIT))
    written = tl.sum(sel.to(tl.int32), axis=0)
    todo = d_c > t  # the segments to read (the padding's -inf never is)
    n_todo = tl.sum(todo.to(tl.int32), axis=0)
    # Both reads select by x >= x_t: the tokens with z > t, with no division (the second
    # read divides to pack the keys, except at temperature 1). Without an x_t (t at the
    # float range's ends) nothing is read and the count is over LIMIT: the caller takes
    # the bisection.
    x_t, exact = logit_floor(t, temp)
    n_todo = tl.where(exact, n_todo, 0)
    lane = tl.arange(0, BLOCK)
    per_lane = tl.zeros([BLOCK], tl.int32)
    c = tl.full([], -1, tl.int32)
    for _ in range(0, n_todo):
        c, start, end = _next_segment(todo, ch, c, seg_len, vocab)
        for b in range(start, end, BLOCK):
            x = tl.load(x_row + b + lane, mask=b + lane < end, other=float("-inf"))
            per_lane += (x.to(tl.float32) >= x_t).to(tl.int32)  # NaN: not above
    first = tl.cumsum(per_lane, axis=0) - per_lane
    read = tl.where(exact, tl.sum(per_lane, axis=0), LIMIT + 1)
    if written + read <= LIMIT:
        slot = scratch_row + written + first
        c = tl.full([], -1, tl.int32)
        for _ in range(0, n_todo):
            c, start, end = _next_segment(todo, ch, c, seg_len, vocab)
            for b in range(start, end, BLOCK):
                x = tl.load(x_row + b + lane, mask=b + lane < end, other=float("-inf"))
                x = x.to(tl.float32)
                b_sel = x >= x_t
                tl.store(slot, pack_key(_z_of(x, temp), (b + lane).to(tl.int64)), mask=b_sel)
                slot += b_sel.to(tl.int32)
    tl.debug_barrier()  # the scattered stores before the caller's block load
    return written + read


@triton.jit
def _next_segment(todo, ch, c, seg_len, vocab):
    """The first segment after c that is to be read, and its token range."""
    c = tl.min(tl.where(todo & (ch > c), ch, INT32_MAX), axis=0)
    start = c * seg_len
    return c, start, tl.minimum(start + seg_len, vocab)


@triton.jit
def fallback_gather(x_row, temp, vocab, t_cut, scratch_row, BLOCK: tl.constexpr):
    """Writes the keys >= t_cut (at most the scratch capacity) to scratch_row, unsorted."""
    written = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        keys, z, _ = _row_keys(x_row, temp, vocab, start, BLOCK)
        sel = (keys >= t_cut) & (z > float("-inf"))
        rank = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(scratch_row + written + rank, keys, mask=sel)
        written += tl.sum(sel.to(tl.int32), axis=0)
    return written


@triton.jit
def position_of(x_row, temp, vocab, key, BLOCK: tl.constexpr):
    """Index of `key` in design order (number of finite keys above it)."""
    count = tl.zeros([BLOCK], tl.int32)
    lane = tl.arange(0, BLOCK)
    x = _load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = _load_block(x_row, vocab, start + BLOCK, BLOCK)
        z = _z_of(x, temp)
        keys = pack_key(z, (start + lane).to(tl.int64))
        count += ((keys > key) & (z > float("-inf"))).to(tl.int32)
        x = x_next
    return tl.sum(count, axis=0).to(tl.int64)


@triton.jit
def _list_whole(
    x_row,
    temp,
    vocab,
    lo,
    hi,
    top,
    scratch_row,
    s_row,
    list_cap,
    G: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """_cut_listed's read in one program: lists its tokens with lo < ordered32(z) <= hi in
    scratch_row and those above top in s_row, in row order."""
    lane = tl.arange(0, BLOCK)
    written = tl.full([], 0, tl.int32)
    above = tl.full([], 0, tl.int32)
    x = _load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = _load_block(x_row, vocab, start + BLOCK, BLOCK)
        z = _z_of(x, temp)
        o = ordered32(z)
        sel = (o > lo) & (o <= hi)
        sel_s = o > top
        # One scan ranks both lists: the bracket's count in the low 16 bits (a block holds
        # fewer than 2^16 tokens), the count above hi in the high ones. (Two reads with no
        # block-wide step inside either, gather_above's form, timed no faster on the H200.)
        both = tl.cumsum(sel.to(tl.int32) | (sel_s.to(tl.int32) << 16), axis=0)
        rank = (both & 0xFFFF) - 1
        rank_s = (both >> 16) - 1
        keys = pack_key(z, (start + lane).to(tl.int64))
        tl.store(scratch_row + written + rank, keys, mask=sel & (written + rank < G))
        tl.store(s_row + above + rank_s, keys, mask=sel_s & (above + rank_s < list_cap))
        total = tl.max(both, axis=0)  # the scan's last value
        written += total & 0xFFFF
        above += total >> 16
        x = x_next


@triton.jit
def _cut_listed(
    x_row,
    temp,
    vocab,
    lo,
    hi,
    n_between,
    c_hi,
    m_hi,
    k,
    z_norm,
    top_p,
    min_p,
    z_max,
    scratch_row,
    s_row,
    list_cap,
    G: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """cut_key's end when at most G tokens have lo < ordered32(z) <= hi: one read lists them
    in scratch_row, a sort puts them in design order, and the kept prefix is counted there
    (the tokens above hi, c_hi of mass m_hi, are all kept; none at or below lo is).

    When every token above lo fits list_cap slots (c_hi plus the bracket's), the same read
    lists the tokens above hi in s_row, and the bracket's kept prefix is written after them:
    s_row then holds S, unsorted, and the caller needs no read of its own to list it (the
    fourth value returned says so)."""
    tl.debug_barrier()  # earlier reads of the scratch rows before the stores below
    s_out = c_hi + n_between <= list_cap
    top = tl.where(s_out, hi, INT32_MAX)  # nothing is above it: nothing listed in s_row
    _list_whole(x_row, temp, vocab, lo, hi, top, scratch_row, s_row, list_cap, G, BLOCK)
    tl.debug_barrier()  # the scattered stores before the block load
    pos = tl.arange(0, G)
    keys = sort_block(scratch_row, n_between, G)
    tl.debug_barrier()  # every thread's load before the scratch row is written again
    listed = keys != EMPTY_KEY
    z = tl.where(listed, unpack_z(keys), float("-inf"))
    e = tl.exp(z - z_max)
    before = m_hi + (tl.cumsum(e, axis=0) - e)
    # (tl.where, not a scalar test | a block: the interpreter's mask would not be boolean)
    keep = listed & ((c_hi + pos).to(tl.int64) < k)
    keep = keep & tl.where(top_p >= 1.0, listed, tl.math.div_rn(before, z_norm) < top_p)
    rel = tl.exp(z.to(tl.float64) - z_max.to(tl.float64))
    keep = keep & tl.where(min_p <= 0.0, listed, rel >= min_p.to(tl.float64))
    # The kept tokens are a prefix: the first one that fails ends it.
    n_keep = tl.min(tl.where(keep, G, pos), axis=0)
    first = pos < n_keep
    t = tl.min(tl.where(first, keys, INT64_MAX), axis=0)
    t = tl.where(n_keep > 0, t, (hi.to(tl.int64) + 1) << 32)  # none: every key above hi
    mass = m_hi + tl.sum(tl.where(first, e, 0.0), axis=0)
    if s_out:  # S: the c_hi tokens above hi, then the bracket's kept prefix
        tl.store(s_row + c_hi + pos, keys, mask=first)
    return t, (c_hi + n_keep).to(tl.int64), mass, s_out
