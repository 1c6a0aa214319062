"""Exact support for the rows the band cannot decide (flat rows, long top-p tails).

Called from the resolve kernel, one program per row. gather_above is the cheap step: it reads
the segments pass 1 left incomplete (twice: count, then write) and lists every token above a
lower floor than pass 1's (resolve_kernel's rescue).
The fallback proper re-reads the row once per step of a bisection over the 64-bit order keys
(64 passes, plus 64 more when top-k renormalises top-p), so it costs far more than the band
path; the caller counts the rows that take it.
S = {key >= t*} where t* is the smallest key t whose token would be kept:
  top-k: #{key > t} < k;  top-p: mass{key > t} / Z_k < top_p;  min-p: exp(z(t) - M) >= min_p.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_common import (
    EMPTY_KEY,
    INT32_MAX,
    gumbel,
    logit_floor,
    pack_key,
    scale,
    unpack_z,
)


@triton.jit
def _row_keys(x_row, temp, vocab, start, BLOCK: tl.constexpr):
    """Keys, z (NaN-free) and ids of one block of a row."""
    ids = start + tl.arange(0, BLOCK)
    inside = ids < vocab
    x = tl.load(x_row + ids, mask=inside, other=float("-inf")).to(tl.float32)
    z = scale(x, temp)
    z = tl.where(z != z, float("-inf"), z)
    ids64 = ids.to(tl.int64)
    return pack_key(z, ids64), z, ids64


@triton.jit
def above(x_row, temp, vocab, t_key, z_max, BLOCK: tl.constexpr):
    """(#tokens, sum exp(z - z_max)) over finite tokens with key > t_key."""
    count = tl.full([], 0, tl.int64)
    mass = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        keys, z, _ = _row_keys(x_row, temp, vocab, start, BLOCK)
        sel = (z > float("-inf")) & (keys > t_key)
        count += tl.sum(sel.to(tl.int64), axis=0)
        mass += tl.sum(tl.where(sel, tl.exp(z - z_max), 0.0), axis=0)
    return count, mass


@triton.jit
def _midpoint(lo, hi):
    # floor((lo + hi) / 2) without int64 overflow
    return (lo >> 1) + (hi >> 1) + (lo & hi & 1)


@triton.jit
def first_kept_key(x_row, temp, vocab, lo, hi, k, z_norm, top_p, min_p, z_max, BLOCK: tl.constexpr):
    """Smallest key t in (lo, hi] with keep(t); hi (the top token) when none is.

    k: int64 (a value >= vocab means off); top_p: float32 (>= 1 off); min_p: float32.
    """
    for _ in range(64):
        mid = _midpoint(lo, hi)
        count, mass = above(x_row, temp, vocab, mid, z_max, BLOCK)
        z_mid = unpack_z(mid)
        keep = (count < k) & (z_mid > float("-inf"))
        keep = keep & ((top_p >= 1.0) | (tl.math.div_rn(mass, z_norm) < top_p))
        rel = tl.exp(z_mid.to(tl.float64) - z_max.to(tl.float64))
        keep = keep & ((min_p <= 0.0) | (rel >= min_p.to(tl.float64)))
        hi = tl.where(keep, mid, hi)
        lo = tl.where(keep, lo, mid)
    return hi


@triton.jit
def fallback_support(
    x_row, temp, vocab, top_key, k, top_p, min_p, z_max, z_sum, BLOCK: tl.constexpr
):
    """Cut key t*, |S| and sum_{S} exp(z - z_max) of one row, by bisection over the keys."""
    lo = pack_key(tl.full([], float("-inf"), tl.float32), tl.full([], 0, tl.int64)) - 1
    never = tl.full([], 2.0, tl.float32)
    z_norm = z_sum
    if k < vocab:  # top-k renormalises top-p: find the k-th key and the mass above it
        t_k = first_kept_key(
            x_row, temp, vocab, lo, top_key, k, z_sum, never, never * 0.0, z_max, BLOCK
        )
        _, z_norm = above(x_row, temp, vocab, t_k - 1, z_max, BLOCK)
    t_cut = first_kept_key(x_row, temp, vocab, lo, top_key, k, z_norm, top_p, min_p, z_max, BLOCK)
    n, mass = above(x_row, temp, vocab, t_cut - 1, z_max, BLOCK)
    return t_cut, n, mass


@triton.jit
def fallback_draw(x_row, temp, vocab, t_cut, k0, k1, BLOCK: tl.constexpr):
    """Gumbel-max over {key >= t_cut}: the winner's key (ties: earlier in design order)."""
    best = tl.full([], float("-inf"), tl.float32)
    best_key = tl.full([], EMPTY_KEY, tl.int64)
    for start in range(0, vocab, BLOCK):
        keys, z, ids = _row_keys(x_row, temp, vocab, start, BLOCK)
        sel = (keys >= t_cut) & (z > float("-inf"))
        score = tl.where(sel, z + gumbel(k0, k1, ids), float("-inf"))
        b_score = tl.max(score, axis=0)
        b_key = tl.max(tl.where(sel & (score == b_score), keys, EMPTY_KEY), axis=0)
        better = (b_score > best) | ((b_score == best) & (b_key > best_key))
        best = tl.where(better, b_score, best)
        best_key = tl.where(better, b_key, best_key)
    return best_key


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
    the second tier (bench_kernels.py --phases).

    The segments are read twice, with no block-wide step inside either read: the first
    counts each lane's tokens above t, one scan turns the counts into each lane's first
    slot, and the second read (from L2: one or two segments of one row) writes each lane's
    tokens from there. One read with a scan and a sum per block to place its tokens cost
    about twice as long (bench_resolve_parts.py --read).
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
    # read still divides to pack the keys). Without an x_t (t at the float range's ends)
    # nothing is read and the count is over LIMIT: the caller takes the bisection.
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
                tl.store(slot, pack_key(scale(x, temp), (b + lane).to(tl.int64)), mask=b_sel)
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
def position_of(x_row, temp, vocab, key, z_max, BLOCK: tl.constexpr):
    """Index of `key` in design order (number of finite keys above it)."""
    count, _ = above(x_row, temp, vocab, key, z_max, BLOCK)
    return count
