"""Pass 1 over a tile of SUB chunks per program (same outputs as triton_band.band_kernel).

Why: SASS of band_kernel shows 23 block-wide barriers per program and, on the H200, pass 1
costs about 170 SM cycles per barrier phase no matter how few tokens the phase covers (6
bisection steps added 37 us at B=128, V=151936). The one-pass floor has 3. A [SUB, CHUNK] tile
runs every reduction along axis 1 for SUB chunks at once, so the phases are paid once per SUB
chunks. Each chunk keeps its own statistics and candidates, so resolve_kernel is unchanged.
Selected by BandConfig.sub > 1; not yet timed on a GPU (see docs/kernels.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_common import GREEDY_T


@triton.jit
def band_tiled_kernel(
    x_ptr,  # [B, V] logits (f32 / bf16 / f16), row stride stride_x
    temp_ptr,  # [B] float32
    cand_x_ptr,  # [B, n_chunks * KC] float32 candidate logits (-inf in unused slots)
    cand_id_ptr,  # [B, n_chunks * KC] int32 candidate token ids
    m_ptr,  # [B, n_chunks] float32 chunk max of z
    s_ptr,  # [B, n_chunks] float32 sum exp(z - m_c); NaN flags a NaN or +inf in the chunk
    d_ptr,  # [B, n_chunks] float32 max z among tokens not written as candidates
    stride_x,
    vocab,
    n_chunks,
    SUB: tl.constexpr,
    CHUNK: tl.constexpr,
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NBISECT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1) * SUB + tl.arange(0, SUB)  # [SUB]
    ids = chunk[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]  # [SUB, CHUNK]
    inside = ids < vocab
    x = tl.load(x_ptr + row * stride_x + ids, mask=inside, other=float("-inf")).to(tl.float32)
    temp = tl.load(temp_ptr + row)
    t = tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)  # greedy rows: z = x
    m = tl.max(x, axis=1)  # [SUB]
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp((x - m_safe[:, None]) * (1.0 / t)), axis=1)

    # Band below each chunk max, shrunk by bisection where it holds more than KC tokens;
    # the steps run for every chunk of the tile (a branch cannot differ between chunks).
    finite = x > float("-inf")
    lo = m - DELTA * t
    hi = m
    over = tl.sum((finite & (x >= lo[:, None])).to(tl.int32), axis=1) > KC
    for _ in range(NBISECT):
        mid = lo + (hi - lo) * 0.5
        more = tl.sum((x >= mid[:, None]).to(tl.int32), axis=1) > KC
        lo = tl.where(over & more, mid, lo)
        hi = tl.where(over & ~more, mid, hi)
    lo = tl.where(over, hi, lo)
    band = finite & (x >= lo[:, None])
    rank = tl.cumsum(band.to(tl.int32), axis=1) - 1  # ties beyond KC: lowest ids first
    write = band & (rank < KC)
    n_written = tl.sum(write.to(tl.int32), axis=1)
    d = tl.max(tl.where(write, float("-inf"), x), axis=1)

    valid = chunk < n_chunks
    base = (row * n_chunks + chunk) * KC  # [SUB]
    slot = base[:, None] + rank
    tl.store(cand_x_ptr + slot, x, mask=write)
    tl.store(cand_id_ptr + slot, ids, mask=write)
    slots = tl.arange(0, KC)[None, :]
    pad = valid[:, None] & (slots >= n_written[:, None])
    tl.store(
        cand_x_ptr + base[:, None] + slots, tl.full([SUB, KC], float("-inf"), tl.float32), mask=pad
    )
    stat = row * n_chunks + chunk
    tl.store(m_ptr + stat, tl.math.div_rn(m, tl.zeros_like(m) + t), mask=valid)
    tl.store(s_ptr + stat, s, mask=valid)
    tl.store(d_ptr + stat, tl.math.div_rn(d, tl.zeros_like(d) + t), mask=valid)
