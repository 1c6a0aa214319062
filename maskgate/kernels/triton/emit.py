"""Pack the per-row mask slots into CSR (offsets + ids) without a host sync.

emit_kernel, grid (R,), R >= 2 (a single mask row is already packed): program r sums the
counts of the requesting rows before it and copies its slot to that offset. It runs as a
third launch, after resolve_kernel, when the batch has more rows than the GPU has SMs.

pack_row does the same inside resolve_kernel, one row at a time, and saves that launch: each
row publishes its mask size and waits (spinning on the device) until every earlier row has
published its own. Like a single-pass scan, this relies on the GPU starting a grid's
programs in order, so a row only ever waits on programs that already run or have finished.
Up to one program an SM, a row that takes long (the rescue) only delays the launch's end,
which it holds anyway; with more rows, rows waiting behind it would hold SMs the next wave
of rows needs, so larger batches keep emit_kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def emit_kernel(
    slot_ptr,  # [R, cap] int32, each row's mask ids in design order
    cnt_ptr,  # [R] int64, ids to emit per requesting row
    offsets_ptr,  # [R + 1] int64 out
    ids_ptr,  # [>= N] int32 out
    cap,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch after resolve
):
    """One compile serves every R (no block over the rows: the sum runs in BLOCK pieces), so
    a worker's warm-up meets it with any batch that packs here."""
    if PDL:
        gdc_wait()  # resolve_kernel finished, its counts and slots visible
        gdc_launch_dependents()  # the next sample's pass 1 may launch (it waits in turn)
    r = tl.program_id(0)
    start = sum_before(cnt_ptr, r, BLOCK, False)
    count = tl.load(cnt_ptr + r)
    copy_ids(slot_ptr + r.to(tl.int64) * cap, ids_ptr + start, count, BLOCK)
    tl.store(offsets_ptr + r + 1, start + count)  # offsets[0]: resolve_kernel's row 0


@triton.jit
def sum_before(sizes_ptr, n, BLOCK: tl.constexpr, WAIT: tl.constexpr):
    """sizes[0] + ... + sizes[n - 1], in BLOCK pieces. WAIT: other programs are still writing
    them (-1 until then): re-read a piece until none of it is -1."""
    total = tl.zeros([], tl.int64)
    for first in range(0, n, BLOCK):
        offs = first + tl.arange(0, BLOCK)
        before = offs < n
        seen = tl.load(sizes_ptr + offs, mask=before, other=0, volatile=WAIT)
        if WAIT:
            while tl.min(seen, axis=0) < 0:  # an earlier row still resolving
                seen = tl.load(sizes_ptr + offs, mask=before, other=0, volatile=True)
        total += tl.sum(seen, axis=0)
    return total


@triton.jit
def copy_ids(src, dst, count, BLOCK: tl.constexpr):
    for i in range(0, count, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        keep = offs < count
        tl.store(dst + offs, tl.load(src + offs, mask=keep), mask=keep)


@triton.jit
def pack_row(row, midx, count, slot_row, ids_ptr, sizes_ptr, offsets_ptr, BLOCK: tl.constexpr):
    """emit_kernel's work for one row, from inside resolve_kernel (module docstring).

    sizes_ptr: [B] int64, -1 for every row before the launch (pass 1 sets them); the row
    stores its mask size there (0 without a mask), then sums the sizes of the rows before
    it, waiting for any still at -1, and copies its slot to that offset of the CSR."""
    tl.store(sizes_ptr + row, count)
    start = sum_before(sizes_ptr, row, BLOCK, True)
    if midx >= 0:
        tl.debug_barrier()  # the slot's stores (every thread's) before the copy reads them
        copy_ids(slot_row, ids_ptr + start, count, BLOCK)
        tl.store(offsets_ptr + midx + 1, start + count)
