"""Pass 3: pack the per-row mask slots into CSR (offsets + ids) without a host sync.

Grid (R,), R >= 2 (a single mask row is already packed). Program r sums the counts of the requesting rows before it (R is at most the
batch size, so one block load does it) and copies its slot to that offset.
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
    R_BLOCK: tl.constexpr,
    COPY_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch after resolve
):
    if PDL:
        gdc_wait()  # resolve_kernel finished, its counts and slots visible
        gdc_launch_dependents()  # the next sample's pass 1 may launch (it waits in turn)
    r = tl.program_id(0)
    rr = tl.arange(0, R_BLOCK)
    start = tl.sum(tl.load(cnt_ptr + rr, mask=rr < r, other=0), axis=0)
    count = tl.load(cnt_ptr + r)
    slot = slot_ptr + r.to(tl.int64) * cap
    for i in range(0, count, COPY_BLOCK):
        offs = i + tl.arange(0, COPY_BLOCK)
        keep = offs < count
        tl.store(ids_ptr + start + offs, tl.load(slot + offs, mask=keep), mask=keep)
    tl.store(offsets_ptr + r + 1, start + count)  # offsets[0]: resolve_kernel's row 0
