"""Sorting a block of packed keys in one program: tl.sort on short runs, then merges.

tl.sort is a bitonic network: a block of n keys takes log2(n) (log2(n) + 1) / 2 passes over
the whole block, so its cost grows faster than the block (on the H200 a 2048-key sort took
about 58k cycles of resolve, a 4096-key one about 150k). sort_desc sorts runs of RUN keys with
tl.sort along the minor axis of a [BLOCK / RUN, RUN] block (log2(RUN) (log2(RUN) + 1) / 2
passes), then merges pairs of runs until one is left: each key's place in the merged run is its
place in its own run plus the number of the other run's keys before it, found by a binary
search of the other run in memory (log2(run) + 1 loads a key, no block-wide step). A merge
level is one load, one search and one scattered store of the block, with barriers between.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import EMPTY_KEY

# sort_block's runs, and the smallest block it sorts in runs (smaller blocks: one tl.sort).
SORT_RUN = tl.constexpr(128)
MERGE_MIN = tl.constexpr(1024)


@triton.jit
def sort_block(buf, n, BLOCK: tl.constexpr):
    """sort_desc with this module's run length: the kernels' sorts of keys they listed in
    scratch memory (the tiers, the rescue, the whole-row fallback's bracket and S)."""
    if BLOCK >= MERGE_MIN:
        return sort_desc(buf, n, BLOCK, SORT_RUN)
    else:
        return sort_desc(buf, n, BLOCK, BLOCK)


@triton.jit
def sort_desc(buf, n, BLOCK: tl.constexpr, RUN: tl.constexpr):
    """buf[0:n] (int64 keys, unsorted, n <= BLOCK) in descending order: returns the sorted
    [BLOCK] block, EMPTY_KEY from n on. With RUN < BLOCK, buf[0:BLOCK] is overwritten (the
    sorted block is left there); with RUN == BLOCK it is one tl.sort and buf is only read.

    Equal keys (only EMPTY_KEY: a row's keys hold distinct ids) keep a strict order between
    runs, the left run's first, so every merge writes each slot exactly once."""
    if RUN >= BLOCK:
        pos = tl.arange(0, BLOCK)
        keys = tl.load(buf + pos, mask=pos < n, other=EMPTY_KEY)
        return tl.sort(keys, 0, descending=True)
    else:
        idx = tl.arange(0, BLOCK // RUN)[:, None] * RUN + tl.arange(0, RUN)[None, :]
        runs = tl.load(buf + idx, mask=idx < n, other=EMPTY_KEY)
        runs = tl.sort(runs, 1, descending=True)
        tl.debug_barrier()  # every thread's load before the stores
        tl.store(buf + idx, runs)
        pos = tl.arange(0, BLOCK)
        run = tl.full([], RUN, tl.int32)
        while run < BLOCK:
            tl.debug_barrier()  # the last level's stores before its loads
            key = tl.load(buf + pos)
            own = pos // run
            left = (own % 2) == 0
            other = buf + tl.where(left, own + 1, own - 1) * run
            # before: how many keys of the other run go first (a prefix of it, as it is
            # sorted), by binary lifting: log2(run) + 1 loads.
            before = tl.zeros([BLOCK], tl.int32)
            step = run
            while step > 0:
                probe = before + step
                inside = probe <= run
                b = tl.load(other + probe - 1, mask=inside, other=EMPTY_KEY)
                first = tl.where(left, b > key, b >= key) & inside
                before = tl.where(first, probe, before)
                step = step // 2
            dest = (own // 2) * (2 * run) + (pos - own * run) + before
            tl.debug_barrier()  # every search's loads before the level's stores
            tl.store(buf + dest, key)
            run = run * 2
        tl.debug_barrier()
        return tl.load(buf + pos)
