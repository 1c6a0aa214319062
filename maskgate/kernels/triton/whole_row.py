"""The whole-row fallback of pass 2: the rows neither the tiers nor the rescue decide (flat
rows, long top-p tails) and the rows nothing truncates that ask for a mask.

fallback.fallback_support finds the cut over the whole row; whole_row then draws (from a
sorted list of S, or by a read of the row) and writes the row's mask slot.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import unpack_id, unpack_z
from maskgate.kernels.triton.decide import draw, store_mask
from maskgate.kernels.triton.fallback import fallback_support
from maskgate.kernels.triton.reads import fallback_draw, fallback_gather, position_of
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
def whole_row(
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
    """The bisection fallback (fallback.fallback_support) over the whole row, its
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
