"""One program's reads of a row outside pass 1: the whole-row fallback's counts and lists,
its draw, gather and the token's position, and the rescue's gather of the segments pass 1
left incomplete.

Each read keeps its sums per lane (no block-wide step inside the loop) and issues the next
block's load before the current block's work: one program reads the whole row, and a loop
that waits for each load in turn ran at a few GB/s.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    INT32_MAX,
    from_ordered32,
    logit_floor,
    ordered32,
    pack_key,
    race_step,
    race_winner,
    scale,
    scale_temp,
)


@triton.jit
def block_keys(x_row, temp, vocab, start, BLOCK: tl.constexpr):
    """Keys, z (NaN-free) and ids of one block of a row."""
    ids = start + tl.arange(0, BLOCK)
    x = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
    z = z_of(x, temp)
    ids64 = ids.to(tl.int64)
    return pack_key(z, ids64), z, ids64


@triton.jit
def z_of(x, temp):
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
def load_block(x_row, vocab, start, BLOCK: tl.constexpr):
    ids = start + tl.arange(0, BLOCK)
    return tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))


@triton.jit
def above3(x_row, temp, vocab, q1, q2, q3, z_max, BLOCK: tl.constexpr):
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
    x = load_block(x_row, end, start, BLOCK)
    for b in range(start, end, BLOCK):
        x_next = load_block(x_row, end, b + BLOCK, BLOCK)
        if IN_Z:
            z = z_of(x, temp)
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
def level_ids3(x_row, temp, vocab, level, q1, q2, q3, BLOCK: tl.constexpr):
    """How many tokens with ordered32(z) == level have an id <= each of q1, q2, q3."""
    c1 = tl.zeros([BLOCK], tl.int32)
    c2 = tl.zeros([BLOCK], tl.int32)
    c3 = tl.zeros([BLOCK], tl.int32)
    lane = tl.arange(0, BLOCK)
    x = load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = load_block(x_row, vocab, start + BLOCK, BLOCK)
        on = ordered32(z_of(x, temp)) == level
        ids = start + lane
        c1 += (on & (ids <= q1)).to(tl.int32)
        c2 += (on & (ids <= q2)).to(tl.int32)
        c3 += (on & (ids <= q3)).to(tl.int32)
        x = x_next
    return tl.sum(c1, axis=0), tl.sum(c2, axis=0), tl.sum(c3, axis=0)


@triton.jit
def fallback_draw(x_row, temp, vocab, t_cut, k0, k1, BLOCK: tl.constexpr):
    """Gumbel-max over {key >= t_cut}: the winner's key (ties: earlier in design order)."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_key = tl.full([BLOCK], EMPTY_KEY, tl.int64)
    lane = tl.arange(0, BLOCK)
    x = load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = load_block(x_row, vocab, start + BLOCK, BLOCK)
        z = z_of(x, temp)
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
                tl.store(slot, pack_key(z_of(x, temp), (b + lane).to(tl.int64)), mask=b_sel)
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
        keys, z, _ = block_keys(x_row, temp, vocab, start, BLOCK)
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
    x = load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = load_block(x_row, vocab, start + BLOCK, BLOCK)
        z = z_of(x, temp)
        keys = pack_key(z, (start + lane).to(tl.int64))
        count += ((keys > key) & (z > float("-inf"))).to(tl.int32)
        x = x_next
    return tl.sum(count, axis=0).to(tl.int64)


@triton.jit
def list_bracket(
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
    """fallback._cut_listed's read in one program: lists its tokens with lo < ordered32(z) <= hi in
    scratch_row and those above top in s_row, in row order."""
    lane = tl.arange(0, BLOCK)
    written = tl.full([], 0, tl.int32)
    above = tl.full([], 0, tl.int32)
    x = load_block(x_row, vocab, 0, BLOCK)
    for start in range(0, vocab, BLOCK):
        x_next = load_block(x_row, vocab, start + BLOCK, BLOCK)
        z = z_of(x, temp)
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
