"""Pass 1 and pass 2 in one launch: the last segment of a row to finish resolves that row.

Each program streams its segment (triton_band_lanes.lanes_pass), then bumps its row's arrival
counter. The program that brings the count to n_chunks knows every segment of the row has
written its statistics and candidates, resets the counter for the next launch and runs the
row's pass 2 (triton_resolve.resolve_row) at once. This saves the launch gap between the two
passes (about 2 us on the H200) and lets a row resolve while other rows still stream.

Ordering: each program's stores are issued before a block barrier, and the counter update
is an acquire-release atomic at GPU scope, so the last program sees the other programs'
writes; resolve_row reads them through L2 (".cg"), never from a stale L1 line.

The counters ([B] int32) must be zero before the launch and are zero again after it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton_band_lanes import lanes_pass
from maskgate.kernels.triton_resolve import resolve_row


@triton.jit(do_not_specialize=["pack"])
def band_resolve_kernel(
    x_ptr,
    temp_ptr,
    cand_key_ptr,
    m_ptr,
    s_ptr,
    d_ptr,
    stride_x,
    vocab,
    n_chunks,
    arrived_ptr,  # [B] int32 arrival counters, zero between launches
    topk_ptr,
    topp_ptr,
    minp_ptr,
    bounded_ptr,
    seed_ptr,
    step_ptr,
    midx_ptr,
    tok_ptr,
    lp_ptr,
    size_ptr,
    nan_ptr,
    fb_ptr,
    band_ptr,
    cnt_ptr,
    status_ptr,
    slot_ptr,
    offsets_ptr,
    pack,
    ids_ptr,
    mask_sizes_ptr,
    scratch_ptr,
    help_ptr,
    max_mask,
    cap,
    ncand,
    SEG: tl.constexpr,
    W: tl.constexpr,
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    BAND_BISECT: tl.constexpr,
    KEEP: tl.constexpr,
    CAND_BLOCK: tl.constexpr,
    NCH_BLOCK: tl.constexpr,
    T1: tl.constexpr,
    T2: tl.constexpr,
    CAP_BLOCK: tl.constexpr,
    RESCUE: tl.constexpr,
    RESCUE_ROUNDS: tl.constexpr,
    FB_BLOCK: tl.constexpr,
    NBISECT: tl.constexpr,
    HAS_STEP: tl.constexpr,
    times_ptr,
    TIMING: tl.constexpr,
    EARLY: tl.constexpr,
    SHARED: tl.constexpr = False,  # band_config keeps it off here: the fused launch never packs
):
    row = tl.program_id(0).to(tl.int64)
    lanes_pass(
        row,
        tl.program_id(1),
        x_ptr,
        temp_ptr,
        cand_key_ptr,
        m_ptr,
        s_ptr,
        d_ptr,
        stride_x,
        vocab,
        n_chunks,
        SEG,
        W,
        KC,
        DELTA,
        BAND_BISECT,
        KEEP,
        0,
        0,
        1,
        None,
        False,
        False,
        None,
        False,
        1,
    )
    tl.debug_barrier()  # every thread's stores of this segment before the release
    arrived = tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel", scope="gpu")
    if arrived == n_chunks - 1:
        tl.store(arrived_ptr + row, 0)
        resolve_row(
            row,
            cand_key_ptr,
            m_ptr,
            s_ptr,
            d_ptr,
            x_ptr,
            stride_x,
            temp_ptr,
            topk_ptr,
            topp_ptr,
            minp_ptr,
            bounded_ptr,
            seed_ptr,
            step_ptr,
            midx_ptr,
            tok_ptr,
            lp_ptr,
            size_ptr,
            nan_ptr,
            fb_ptr,
            band_ptr,
            cnt_ptr,
            status_ptr,
            slot_ptr,
            offsets_ptr,
            pack,
            ids_ptr,
            mask_sizes_ptr,
            scratch_ptr,
            help_ptr,
            vocab,
            n_chunks,
            max_mask,
            cap,
            ncand,
            SEG,
            CAND_BLOCK,
            NCH_BLOCK,
            T1,
            T2,
            CAP_BLOCK,
            RESCUE,
            RESCUE_ROUNDS,
            FB_BLOCK,
            NBISECT,
            HAS_STEP,
            times_ptr,
            TIMING,
            EARLY,
            SHARED,
            False,  # HELP: the fused launch never packs
            (m_ptr, cand_key_ptr, 0),  # no race: typed stand-ins that raced = 0 never reads
        )
