"""Pass 1 with a histogram band cut: the contract of triton_band.band_kernel at a fraction of
its instructions and block-wide barriers.

Why: band_kernel finds each chunk's band threshold by a 6-step bisection (one block-wide
reduction per step, plus the count before it) and compacts the candidates with a scan over
the chunk in id order. On the H200 pass 1 took 162 us at B=128, V=151936 against 29 us for a
read of the logits: it is bound by instruction issue and serial barrier phases. Here:

* every token gets an integer level below the chunk max (0 = the max itself, then NT - 2
  steps over DELTA * T, NT - 1 = deeper); one histogram counts the levels and the band is
  the deepest levels that fit KC. The band is decided from the same integers the histogram
  counted, so its size is exact whatever the rounding of the level arithmetic;
* the chunk is a [R, W] tile, W = 32 * num_warps, so with scalar loads each thread holds one
  column; candidates are numbered column-major: an in-thread prefix down the column plus one
  scan of the per-column counts (W values), instead of a scan over the whole chunk;
* with TOPS = 2 only the two largest tokens of each column compete (found in-thread, no
  shuffles), so the level arithmetic, the histogram and the scan run on 2 values per thread
  instead of R; the largest of the rest of each column joins d_c. The band then also ends
  where a column holds 3 of the chunk's best tokens;
* each program handles G consecutive chunks and issues chunk g + 1's read before working on
  chunk g.

Outputs, per chunk c (the contract resolve_kernel relies on):
  m_c = max z, s_c = sum exp(z - m_c) (NaN when the chunk holds a NaN or +inf),
  up to KC candidates (x, id), -inf in unused slots, in column-major order (resolve_kernel
  does not depend on the order of a chunk's candidates),
  d_c = the largest z among the tokens not written (so every z > max_c d_c is a candidate).
When more than KC tokens tie at the chunk max, KC of them are written, always including the
lowest id (greedy rows take it), and d_c = m_c.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_common import GREEDY_T

INT32_MAX = tl.constexpr(2**31 - 1)


@triton.jit
def _pick(sel, vals, fill):
    """The entry of vals [N, 1] where sel [N, 1] holds (at most one), else fill; [1, 1]."""
    return tl.max(tl.where(sel, vals, fill), axis=0, keep_dims=True)


@triton.jit
def _cut_levels(x, m, t, KC: tl.constexpr, DELTA: tl.constexpr, NT: tl.constexpr):
    """x [P, W] -> (band mask [P, W], band size [1, 1] before the KC cap).

    The [NT, 1] histogram and its prefix keep NT inside each thread, so choosing the cut is
    a per-thread computation (a 1-D [NT] vector would be spread over the warps, and every
    pick among its entries would cost block-wide barriers).
    """
    m0 = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk: every level is NT - 1
    # Never 0 (DELTA * T may overflow): -inf tokens must still land on level NT - 1.
    inv = tl.maximum((NT - 2) / (DELTA * t), 1e-30)
    lvl = tl.ceil(tl.minimum((m0 - x) * inv, NT - 1.0)).to(tl.int32)
    hist = tl.histogram(tl.reshape(lvl, [x.shape[0] * x.shape[1]]), NT)[:, None]  # [NT, 1]
    k = tl.arange(0, NT)[:, None]
    at_most = tl.cumsum(hist, axis=0)  # tokens at levels <= k
    # The deepest level that fits KC; 0 (the ties at the max, capped later) when none does.
    cut = tl.max(tl.where((at_most <= KC) & (k < NT - 1), k, 0), axis=0, keep_dims=True)
    return lvl <= cut, _pick(k == cut, at_most, 0)


@triton.jit
def _column_tops(x, ids):
    """x, ids [R, W] -> the two largest tokens of each column, first occurrences first
    (values and ids [2, W]), and the largest of the rest of each column ([1, W]).

    Each thread holds one column, so these are in-thread reductions (no shuffles). When a
    column has no second finite token its second top is -inf (never written)."""
    rows = tl.arange(0, x.shape[0])[:, None]
    v1 = tl.max(x, axis=0, keep_dims=True)
    a1 = tl.argmax(x, axis=0, tie_break_left=True, keep_dims=True)  # lowest row: lowest id
    x2 = tl.where(rows == a1, float("-inf"), x)
    v2 = tl.max(x2, axis=0, keep_dims=True)
    a2 = tl.argmax(x2, axis=0, tie_break_left=True, keep_dims=True)
    rest = tl.max(tl.where(rows == a2, float("-inf"), x2), axis=0, keep_dims=True)
    i1 = tl.sum(tl.where(rows == a1, ids, 0), axis=0, keep_dims=True)
    i2 = tl.sum(tl.where(rows == a2, ids, 0), axis=0, keep_dims=True)
    top = tl.arange(0, 2)[:, None]
    return tl.where(top == 0, v1, v2), tl.where(top == 0, i1, i2), rest


@triton.jit
def _chunk(
    x,  # [R, W] float32, token r * W + c of the chunk at (r, c)
    ids,  # [R, W] int32
    t,
    row,
    chunk,
    n_chunks,
    cand_x_ptr,
    cand_id_ptr,
    m_ptr,
    s_ptr,
    d_ptr,
    CHUNK: tl.constexpr,
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NT: tl.constexpr,
    TOPS: tl.constexpr,
):
    # The tokens that may be written: all of them ([R, W]), or the two tops of each column
    # ([2, W]) with `rest`, the largest of the others.
    if TOPS:
        cand, cand_ids, rest = _column_tops(x, ids)
    else:
        cand, cand_ids = x, ids
        rest = tl.full([1, ids.shape[1]], float("-inf"), tl.float32)
    m = tl.max(cand)  # scalars: they are stored, and a [1, 1] store needs a layout conversion
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk sums to 0, not NaN
    # NaN propagates into s, and so does +inf (inf - inf): both mark the row as bad.
    s = tl.sum(tl.exp((x - m_safe) * (1.0 / t)))
    band, n_band = _cut_levels(cand, m, t, KC, DELTA, NT)

    # Slots in column-major order: the band tokens of earlier columns, then those above in
    # this column.
    b32 = band.to(tl.int32)
    per_col = tl.sum(b32, axis=0, keep_dims=True)  # [1, W]
    slot = (tl.cumsum(per_col, axis=1) - per_col) + (tl.cumsum(b32, axis=0) - b32)
    n_written = tl.minimum(n_band, KC)
    if tl.max(n_band) > KC:  # only ties at the max can overflow: keep the lowest id first
        pr = tl.arange(0, cand.shape[0])[:, None]
        pc = tl.arange(0, cand.shape[1])[None, :]
        id_min = tl.min(tl.where(band, cand_ids, INT32_MAX))
        is_min = band & (cand_ids == id_min)
        pr_min = tl.max(tl.where(is_min, pr, -1))
        pc_min = tl.max(tl.where(is_min, pc, -1))
        # Is id_min before this entry in column-major order? Then this entry moves up one.
        before = (pc_min < pc) | ((pc_min == pc) & (pr_min < pr))
        slot = tl.where(is_min, 0, slot - before.to(tl.int32) + 1)
    write = band & (slot < KC)
    left = tl.max(tl.where(write, float("-inf"), cand), axis=0, keep_dims=True)
    d = tl.max(tl.maximum(left, rest))  # the largest token not written, exactly

    base = (row * n_chunks + chunk) * KC
    tl.store(cand_x_ptr + base + slot, cand, mask=write)
    tl.store(cand_id_ptr + base + slot, cand_ids, mask=write)
    slots = tl.arange(0, KC)[None, :]
    tl.store(
        cand_x_ptr + base + slots,
        tl.full([1, KC], float("-inf"), tl.float32),
        mask=slots >= n_written,
    )
    stat = row * n_chunks + chunk
    # z = RN(x / T) is monotone in x, so the maxima map through one division each.
    tl.store(m_ptr + stat, tl.math.div_rn(m, t))
    tl.store(s_ptr + stat, s)
    tl.store(d_ptr + stat, tl.math.div_rn(d, t))


# vocab and stride_x are not specialised on divisibility: that would vectorise the loads to 4
# tokens per thread, and the scattered candidate stores would then need the whole chunk moved
# through shared memory into a one-token-per-thread layout.
@triton.jit(do_not_specialize=["stride_x", "vocab"])
def band_multi_kernel(
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
    G: tl.constexpr,  # chunks per program
    CHUNK: tl.constexpr,
    W: tl.constexpr,  # tile width: 32 * num_warps (one column per thread)
    KC: tl.constexpr,
    DELTA: tl.constexpr,
    NT: tl.constexpr,  # histogram levels (a power of two)
    TOPS: tl.constexpr,  # 0: any token may be a candidate; 2: only the two tops of a column
):
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * G
    temp = tl.load(temp_ptr + row)
    t = tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)  # greedy rows: z = x
    x_row = x_ptr + row * stride_x
    tile = tl.arange(0, CHUNK // W)[:, None] * W + tl.arange(0, W)[None, :]  # [R, W]
    ids = first * CHUNK + tile
    x_next = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
    for g in tl.static_range(G):
        x = x_next.to(tl.float32)
        ids_g = ids + g * CHUNK
        if g + 1 < G:  # issue the next chunk's read before this chunk's reductions
            nxt = ids_g + CHUNK
            x_next = tl.load(x_row + nxt, mask=nxt < vocab, other=float("-inf"))
        chunk = first + g
        if chunk < n_chunks:  # the last program's group may run past the row
            _chunk(
                x,
                ids_g,
                t,
                row,
                chunk,
                n_chunks,
                cand_x_ptr,
                cand_id_ptr,
                m_ptr,
                s_ptr,
                d_ptr,
                CHUNK,
                KC,
                DELTA,
                NT,
                TOPS,
            )
