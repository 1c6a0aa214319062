"""The CUDA sampler: Triton launches, no host synchronisation, no full vocabulary sort.

  band_lanes_kernel (B, n_chunks)  the one full read of the logits: per-segment stats and
                                   candidates (maskgate/kernels/triton_band.py)
  resolve_kernel    (B,)           sort candidates, decide S (or bisect: fallback), draw, slots;
                                   up to one row an SM, each row also packs its slot as CSR
                                   (maskgate/kernels/triton_resolve.py)
  emit_kernel       (R,)           pack the slots as CSR (R >= 2, more rows than SMs)

The shapes come from maskgate/kernels/band_config.py. The only host-side inputs are shapes and
want_mask (a CPU tensor: it sizes the outputs).
"""

from __future__ import annotations

import torch

from maskgate.kernels.inputs import SampleInputs
from maskgate.kernels.result import SampleResult
from maskgate.kernels.triton.config import (
    BAND_WARPS,
    DELTA,
    FB_BLOCK,
    MAX_CAP,
    NBISECT,
    RESCUE_ROUNDS,
    RESCUE_TIERS,
    RESOLVE_BISECT,
    TIERS,
    BandConfig,
    default_config,
    max_chunks,
    next_pow2,
    reread_constants,
)
from maskgate.kernels.triton.emit import emit_kernel
from maskgate.kernels.triton.pass1 import band_lanes_kernel
from maskgate.kernels.triton.resolve import resolve_kernel


def may_pack(cfg: BandConfig, batch: int, device: torch.device) -> bool:
    """Whether a launch of `batch` rows under cfg packs the CSR in resolve when more than one
    row asks for a mask (pack 2): launches of up to one row an SM."""
    return cfg.pack and 1 < batch <= sm_count(device)


_PDL: dict[torch.device, bool] = {}


def pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch needs a CUDA device of compute capability 9 or more."""
    if device.type != "cuda":
        return False
    if device not in _PDL:
        _PDL[device] = torch.cuda.get_device_capability(device)[0] >= 9
    return _PDL[device]


_SMS: dict[torch.device, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; the interpreter (CPU) runs programs one
    at a time in order, so any batch counts as resident there."""
    if device.type != "cuda":
        return 1 << 62
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def launch_band(
    x: torch.Tensor,
    temperature: torch.Tensor,
    cand_key: torch.Tensor,
    m_c: torch.Tensor,
    s_c: torch.Tensor,
    d_c: torch.Tensor,
    cfg: BandConfig,
    pdl: bool = False,
    mask_sizes: torch.Tensor | None = None,
    race: dict | None = None,
) -> None:
    """Pass 1: one program per segment. pdl: a programmatic dependent launch of the kernel
    before, and the primary of the next (resolve_kernel). mask_sizes: [B] int64, set to -1
    for resolve_kernel's packing. race: the keyword arguments of its Gumbel race over the
    rows nothing truncates (see sample_triton)."""
    batch, vocab = x.shape
    band_lanes_kernel[(batch, cfg.n_chunks)](
        x,
        temperature,
        cand_key,
        m_c,
        s_c,
        d_c,
        x.stride(0),
        vocab,
        cfg.n_chunks,
        SEG=cfg.chunk,
        W=cfg.lanes,
        KC=cfg.kc,
        DELTA=DELTA,
        NBISECT=NBISECT,
        **reread_constants(cfg),
        mask_sizes_ptr=mask_sizes,
        CLEAR=mask_sizes is not None,
        PDL=pdl,
        LOOK=cfg.look,
        **(race or {}),
        num_warps=BAND_WARPS,
        **({"maxnreg": cfg.regs} if cfg.regs else {}),
        **({"launch_pdl": True} if pdl else {}),
    )


def mask_index(want_mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[B + R] int64 on device: each row's mask index (-1: none), then the R requesting rows.

    Built on the host from want_mask and copied without waiting for the device.
    """
    batch = want_mask.shape[0]
    rows = want_mask.nonzero().squeeze(1)
    index = torch.full((batch + rows.numel(),), -1, dtype=torch.int64)
    index[rows] = torch.arange(rows.numel())
    index[batch:] = rows
    return index.to(device, non_blocking=True)


def race_buffers(
    inp: SampleInputs, cfg: BandConfig, seed: torch.Tensor, step: torch.Tensor, raced: bool
) -> tuple[dict | None, torch.Tensor | None, torch.Tensor | None]:
    """Pass 1's race arguments and its outputs (g, w), or (None, None, None).

    Rows nothing truncates (plain temperature sampling) draw from the whole row: pass 1 runs
    their Gumbel race segment by segment (g: each winner's z + g; w: its (z, id) key, then
    the segment's count of finite tokens), and resolve takes the best segment winner, with
    no read of the row in one program. Only rows that ask for no mask are raced (a plain
    row's mask is the whole row, which resolve reads in any case), so a launch whose rows
    all ask for masks (a mask pool's batches) compiles pass 1 without the race: its check
    at the end of every segment, taken or not, cost every row 5% on the H200 (B = 128,
    V = 151936 fp32: 46.3 us steady against 43.9; B = 1: 13.5 against 13.2). resolve_kernel
    takes `raced` at run time."""
    if not raced:
        return None, None, None
    batch, dev = inp.logits.shape[0], inp.logits.device
    race_g = torch.empty(batch, cfg.n_chunks, device=dev)
    race_w = torch.empty(2, batch, cfg.n_chunks, dtype=torch.int64, device=dev)
    race = {
        "topk_ptr": inp.top_k,
        "topp_ptr": inp.top_p,
        "minp_ptr": inp.min_p,
        "seed_ptr": seed,
        "step_ptr": step,
        "g_ptr": race_g,
        "w_ptr": race_w,
        "RACE": True,
        "HAS_STEP": inp.step is not None,
    }
    return race, race_g, race_w


def pack_mode(n_rows: int, packs: bool) -> int:
    """How the CSR gets packed. Resolve's row 0 writes offsets[0]. 1: a single mask row, whose
    slot already is mask_ids (resolve writes its count to offsets[1] too). 2: resolve's rows
    pack their own slots (launches of up to one row an SM, see may_pack; pass 1 sets
    mask_sizes to -1 first). 0: emit_kernel packs them after resolve (or no row asks)."""
    if n_rows == 1:
        return 1
    return 2 if n_rows > 1 and packs else 0


def resolve_meta(cfg: BandConfig, vocab: int, cap: int, has_step: bool) -> dict[str, int]:
    """resolve_kernel's compile-time sizes for a config and mask cap: the candidate block, the
    segment-statistics block (fixed per vocabulary, see max_chunks), the two sorted tiers,
    the slot block and the rescue's gather."""
    cand_block = next_pow2(cfg.ncand)
    t1, t2 = (min(t, cand_block) for t in TIERS)
    return {
        "CAND_BLOCK": cand_block,
        "NCH_BLOCK": next_pow2(max(cfg.n_chunks, max_chunks(vocab, cfg))),
        "T1": t1,
        "T2": t2,
        "CAP_BLOCK": next_pow2(cap),
        "RESCUE": RESCUE_TIERS * t2,
        "RESCUE_ROUNDS": RESCUE_ROUNDS,
        "FB_BLOCK": FB_BLOCK,
        "NBISECT": RESOLVE_BISECT,
        "HAS_STEP": has_step,
    }


def sample_triton(
    inp: SampleInputs,
    config: BandConfig | None = None,
    index: torch.Tensor | None = None,
    band_sizes: torch.Tensor | None = None,
) -> SampleResult:
    """kernels.sample on the Triton path (CUDA tensors, or CPU under TRITON_INTERPRET=1).

    index: a precomputed mask_index (lets a caller capture the launches in a CUDA graph).
    band_sizes: optional [B] int64 out, candidates listed above the band floor (tests).
    """
    x = inp.logits
    batch, vocab = x.shape
    dev = x.device
    cfg = config or default_config(vocab, batch)
    cap = min(inp.max_mask_tokens, vocab)
    if cap > MAX_CAP:
        raise ValueError(
            f"max_mask_tokens {inp.max_mask_tokens} exceeds {MAX_CAP}, the largest mask the "
            "CUDA sampler emits; lower max_mask_tokens"
        )
    if index is None:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "capturing kernels.sample in a CUDA graph needs index=mask_index(want_mask, "
                "device), built before the capture (its host-to-device copy cannot be captured)"
            )
        index = mask_index(inp.want_mask, dev)
    n_rows = index.shape[0] - batch
    midx, mask_rows = index[:batch], index[batch:]
    if band_sizes is None:
        band_sizes = torch.empty(batch, dtype=torch.int64, device=dev)

    meta = resolve_meta(cfg, vocab, cap, has_step=inp.step is not None)
    cand_key = torch.empty(batch, cfg.ncand, dtype=torch.int64, device=dev)
    m_c, s_c, d_c = (torch.empty(batch, cfg.n_chunks, device=dev) for _ in range(3))
    tokens = torch.empty(batch, dtype=torch.int64, device=dev)
    logprobs = torch.empty(batch, dtype=torch.float32, device=dev)
    sizes = torch.empty(batch, dtype=torch.int64, device=dev)
    nan_rows = torch.empty(batch, dtype=torch.int8, device=dev)
    fallback = torch.empty(batch, dtype=torch.int8, device=dev)
    counts = torch.empty(max(n_rows, 1), dtype=torch.int64, device=dev)
    status = torch.empty(n_rows, dtype=torch.int8, device=dev)
    slots = torch.empty(max(n_rows, 1) * cap, dtype=torch.int32, device=dev)
    scratch_len = meta["T1"] + meta["T2"] + max(meta["CAP_BLOCK"], meta["RESCUE"])
    scratch = torch.empty(batch, scratch_len, dtype=torch.int64, device=dev)
    if inp.seed is None:
        seed = torch.randint(-(2**63), 2**63 - 1, (batch,), dtype=torch.int64, device=dev)
    else:
        seed = inp.seed
    step = inp.step if inp.step is not None else seed
    offsets = torch.empty(n_rows + 1, dtype=torch.int64, device=dev)
    pack = pack_mode(n_rows, may_pack(cfg, batch, dev))
    mask_ids = slots if n_rows == 1 else torch.empty(n_rows * cap, dtype=torch.int32, device=dev)
    # Pass 1 clears mask_sizes whether or not resolve packs: one pass-1 compile per config.
    mask_sizes = torch.empty(batch, dtype=torch.int64, device=dev)
    row_args = (
        inp.top_k,
        inp.top_p,
        inp.min_p,
        inp.bounded,
        seed,
        step,
        midx,
        tokens,
        logprobs,
        sizes,
        nan_rows,
        fallback,
        band_sizes,
        counts,
        status,
        slots,
        offsets,
        pack,
        mask_ids,
        mask_sizes,
        scratch,
    )
    stats = (cand_key, m_c, s_c, d_c)
    raced = n_rows < batch
    race, race_g, race_w = race_buffers(inp, cfg, seed, step, raced)
    if race is None:  # stand-ins resolve_kernel never reads
        race_g, race_w = m_c, cand_key
    # Programmatic dependent launch (sm_90+): resolve and emit launch while the kernel before
    # them finishes and wait for it on the device, so no launch gap separates the passes.
    pdl = pdl_capable(dev)
    launch_band(x, inp.temperature, *stats, cfg, pdl=pdl, mask_sizes=mask_sizes, race=race)
    resolve_kernel[(batch,)](
        *stats,
        x,
        x.stride(0),
        inp.temperature,
        *row_args,
        vocab,
        cfg.n_chunks,
        inp.max_mask_tokens,
        cap,
        cfg.ncand,
        cfg.chunk,
        **meta,
        PDL=pdl,
        g_ptr=race_g,
        w_ptr=race_w,
        raced=int(raced),
        num_warps=8 if meta["CAND_BLOCK"] >= 2048 else 4,
        **({"maxnreg": cfg.resolve_regs} if cfg.resolve_regs else {}),
        **({"launch_pdl": True} if pdl else {}),
    )

    if pack == 0 and n_rows > 1:
        emit_kernel[(n_rows,)](
            slots,
            counts,
            offsets,
            mask_ids,
            cap,
            BLOCK=1024,
            PDL=pdl,
            num_warps=4,
            **({"launch_pdl": True} if pdl else {}),
        )
    return SampleResult(
        tokens=tokens,
        logprobs=logprobs,
        mask_rows=mask_rows,
        mask_offsets=offsets,
        mask_ids=mask_ids,
        mask_status=status,
        nan_rows=nan_rows.view(torch.bool),
        fallback_rows=fallback.view(torch.bool),
        support_sizes=sizes,
        chunk_max=m_c,
        chunk_sumexp=s_c,
    )
