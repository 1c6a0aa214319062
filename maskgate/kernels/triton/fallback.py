"""Exact support for the rows the band cannot decide (flat rows, long top-p tails), and for
the rows nothing truncates that ask for a mask: the whole-row fallback's search for the cut.

Called from the resolve kernel (whole_row.py), one program per row. fallback_support and
cut_key read the whole row several times (reads.py): a search for the cut's z that counts
three thresholds a read (thresholds.py; at most Z_READS + 16 reads; 2-3 on a real model's
wide rows, 3-5 on flat ones, before the tokens left in its bracket fit a list it sorts; one
read when only min-p or nothing cuts), then the caller's draw (one read of the row, or a read
that lists S and a draw over the list; when everything above the bracket's lower end fits
the mask block, the bracket's read lists S as well and the caller reads nothing more); the
caller counts the rows that take it.
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
    ordered32,
    unpack_z,
)
from maskgate.kernels.triton.reads import above3, level_ids3, list_bracket
from maskgate.kernels.triton.sort import sort_block
from maskgate.kernels.triton.thresholds import thresholds

INT64_MAX = tl.constexpr(2**63 - 1)


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
    at three thresholds a read (thresholds: in z at first, then in the row's ordered32 space,
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
        q1, q2, q3 = thresholds(
            lo, hi, top, reads, (c_lo, m_lo, c_hi, m_hi), (k, z_norm, top_p, min_p, z_max), G
        )
        reads += 1
        n1, n2, n3, s1, s2, s3 = above3(
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
        c_lo, c_hi, _, m_lo, m_hi, _ = above3(
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
            a1, a2, a3 = level_ids3(x_row, temp, vocab, hi32, q1, q2, q3, BLOCK)
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
    list_bracket(x_row, temp, vocab, lo, hi, top, scratch_row, s_row, list_cap, G, BLOCK)
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
