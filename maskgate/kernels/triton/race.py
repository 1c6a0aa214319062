"""Pass 1's Gumbel race for the rows nothing truncates (docs/design.md, mask semantics).

With RACE (sample_triton sets it when a row of the launch asks for no mask), a row that
nothing truncates also gets, per segment, the race's winner over the segment's finite
tokens: g_c its z + g, its (z, id) key, and the count of finite tokens. An untruncated row's
support is every finite token, so the row's winner is the best of its segments' winners, and
resolve_kernel takes it with no read of the row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import (
    EMPTY_KEY,
    exact_z,
    gumbel,
    race_step,
    race_winner,
    row_keys,
    unpack_id,
    unpack_z,
    untruncated,
)


@triton.jit
def race_row(
    row,
    x_row,
    temp_ptr,
    race,
    vocab,
    n_chunks,
    end,
    t,
    start,
    stat,
    HAS_STEP: tl.constexpr,
    W: tl.constexpr,
):
    """The race's part of a segment for a row nothing truncates: its winner's score, key and
    the segment's count of finite tokens. The row's parameters are loaded here (temperature
    again), not before the loop: values held across the loop and the cut made the compiler
    spill there, which cost every row (B = 128: 45.9 us against 43.9 on the H200)."""
    topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr, g_ptr, w_ptr = race
    whole = untruncated(
        tl.load(topk_ptr + row).to(tl.int64),
        tl.load(topp_ptr + row),
        tl.load(minp_ptr + row),
        tl.load(temp_ptr + row),
        vocab,
    )
    if whole:  # a row nothing truncates: its token is raced here
        seed = tl.load(seed_ptr + row)
        step = tl.full([], 0, tl.int64)
        if HAS_STEP:
            step = tl.load(step_ptr + row)
        k0, k1 = row_keys(seed, step)
        key, n = _race_segment(x_row, end, t, start, k0, k1, W)
        tl.store(g_ptr + stat, _race_score(key, k0, k1))
        tl.store(w_ptr + stat, key)
        tl.store(w_ptr + n_chunks * tl.num_programs(0) + stat, n)


@triton.jit
def _race_segment(x_row, end, t, start, k0, k1, W: tl.constexpr):
    """The Gumbel race over the segment's finite tokens, read again (from L2:
    this program read them moments ago): the winner's (z, id) key and the count of finite
    tokens. An untruncated row's support is every finite token, so the row's winner is the
    best of its segments' winners, and resolve_kernel needs no read of the row."""
    # (Addresses from the row's start, not the loop's pointers: those held past the loop
    # spilled in the cut that every row runs.)
    lanes = tl.arange(0, W)
    best = tl.full([W], float("-inf"), tl.float32)
    best_key = tl.full([W], EMPTY_KEY, tl.int64)
    count = tl.zeros([W], tl.int32)
    x = tl.load(x_row + start + lanes, mask=lanes < end, other=float("-inf"))
    for it in range(0, (end + W - 1) // W):
        nxt = (it + 1) * W
        x_next = tl.load(x_row + (start + nxt) + lanes, mask=nxt + lanes < end, other=float("-inf"))
        z = exact_z(x.to(tl.float32), t)
        ids = (start + it * W + lanes).to(tl.int64)
        live = z > float("-inf")
        best, best_key = race_step(z, ids, live, k0, k1, best, best_key)
        count += live.to(tl.int32)
        x = x_next
    return race_winner(best, best_key), tl.sum(count, axis=0).to(tl.int64)


@triton.jit
def _race_score(key, k0, k1):
    """The winner's score z + g (-inf for a segment with no finite token)."""
    z = tl.where(key == EMPTY_KEY, float("-inf"), unpack_z(key))
    return z + gumbel(k0, k1, unpack_id(key))
