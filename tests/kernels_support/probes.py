"""Jit wrappers that call one of the kernels' device functions alone, for contract tests
under the Triton interpreter (imported by the interpreted check's fresh process)."""

from __future__ import annotations

import triton
import triton.language as tl

from maskgate.kernels.triton.common import logit_floor
from maskgate.kernels.triton.reads import gather_above


@triton.jit
def gather_probe(
    x_ptr,  # [vocab] one row of logits
    temp_ptr,  # [1] the row's temperature
    t_ptr,  # [1] the floor t
    d_ptr,  # [n_chunks] the row's segment floors
    keys_ptr,  # [CB] candidate keys, their z and whether each is known (segments complete)
    z_ptr,
    known_ptr,
    out_ptr,  # [1] the count gather_above returns
    scratch_ptr,  # the keys it writes
    vocab,
    n_chunks,
    seg_len,
    NCH: tl.constexpr,
    CB: tl.constexpr,
    LIMIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    ch = tl.arange(0, NCH)
    pos = tl.arange(0, CB)
    got = gather_above(
        x_ptr,
        tl.load(temp_ptr),
        vocab,
        tl.load(t_ptr),
        tl.load(d_ptr + ch, mask=ch < n_chunks, other=float("-inf")),
        ch,
        seg_len,
        tl.load(keys_ptr + pos),
        tl.load(z_ptr + pos),
        tl.load(known_ptr + pos) != 0,
        scratch_ptr,
        LIMIT,
        BLOCK,
    )
    tl.store(out_ptr, got)


@triton.jit
def floor_probe(t_ptr, temp_ptr, x_t_ptr, ok_ptr, N: tl.constexpr):
    """logit_floor over N (t, temperature) pairs."""
    i = tl.arange(0, N)
    x_t, ok = logit_floor(tl.load(t_ptr + i), tl.load(temp_ptr + i))
    tl.store(x_t_ptr + i, x_t)
    tl.store(ok_ptr + i, ok.to(tl.int8))
