"""The CUDA sampler: Triton launches, no host synchronisation, no full vocabulary sort.

  band_lanes_kernel (B, n_chunks)  the one full read of the logits: per-segment stats and
                                   candidates (pass1.py)
  resolve_kernel    (B,)           sort candidates, decide S (or the whole-row fallback),
                                   draw, slots; up to one row an SM, each row also packs its
                                   slot as CSR (resolve.py)
  emit_kernel       (R,)           pack the slots as CSR (R >= 2, more rows than SMs; emit.py)

The shapes come from config.py. The only host-side inputs are shapes and
want_mask (a CPU tensor: it sizes the outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from maskgate.kernels.inputs import SampleInputs
from maskgate.kernels.result import SampleResult
from maskgate.kernels.triton.config import (
    BAND_WARPS,
    DELTA,
    FB_BLOCK,
    FP_FUSION,
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
        enable_fp_fusion=FP_FUSION,
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


@dataclass(frozen=True)
class Launch:
    """One sample_triton call's buffers on the device: pass 1's outputs, resolve_kernel's
    per-row arguments and outputs, and the mask slots and CSR."""

    cand_key: torch.Tensor  # [B, ncand] int64, pass 1's candidates as (z, id) keys
    m_c: torch.Tensor  # [B, n_chunks] float32 segment max, sum exp(z - max), floor
    s_c: torch.Tensor
    d_c: torch.Tensor
    seed: torch.Tensor  # [B] int64 (host-random for unseeded launches)
    step: torch.Tensor  # [B] int64 (seed again when the call has none: never read then)
    midx: torch.Tensor  # [B] int64 each row's mask index, -1 for none
    tokens: torch.Tensor  # [B] outputs
    logprobs: torch.Tensor
    sizes: torch.Tensor
    nan_rows: torch.Tensor
    fallback: torch.Tensor
    band_sizes: torch.Tensor
    counts: torch.Tensor  # [max(R, 1)] int64 ids each mask slot holds
    status: torch.Tensor  # [R] int8
    slots: torch.Tensor  # [max(R, 1) * cap] int32 mask slots
    offsets: torch.Tensor  # [R + 1] int64 CSR offsets
    pack: int  # pack_mode
    mask_ids: torch.Tensor  # [R * cap] int32 CSR ids (the slots themselves when R == 1)
    mask_sizes: torch.Tensor  # [B] int64, set to -1 by pass 1
    scratch: torch.Tensor  # [B, T1 + T2 + max(CAP_BLOCK, RESCUE)] int64
    meta: dict[str, int]  # resolve_meta's compile-time sizes
    n_rows: int  # R, the rows that ask for a mask

    def stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cand_key, self.m_c, self.s_c, self.d_c

    def row_args(self, inp: SampleInputs) -> tuple:
        """resolve_kernel's arguments from top_k to scratch, in its order."""
        return (
            inp.top_k,
            inp.top_p,
            inp.min_p,
            inp.bounded,
            self.seed,
            self.step,
            self.midx,
            self.tokens,
            self.logprobs,
            self.sizes,
            self.nan_rows,
            self.fallback,
            self.band_sizes,
            self.counts,
            self.status,
            self.slots,
            self.offsets,
            self.pack,
            self.mask_ids,
            self.mask_sizes,
            self.scratch,
        )


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
    if band_sizes is None:
        band_sizes = torch.empty(batch, dtype=torch.int64, device=dev)
    run = allocate(inp, cfg, cap, index, band_sizes)
    raced = run.n_rows < batch
    race, race_g, race_w = race_buffers(inp, cfg, run.seed, run.step, raced)
    if race_g is None or race_w is None:  # no race: stand-ins resolve_kernel never reads
        race_g, race_w = run.m_c, run.cand_key
    # Programmatic dependent launch (sm_90+): resolve and emit launch while the kernel before
    # them finishes and wait for it on the device, so no launch gap separates the passes.
    pdl = pdl_capable(dev)
    launch_band(
        x, inp.temperature, *run.stats(), cfg, pdl=pdl, mask_sizes=run.mask_sizes, race=race
    )
    launch_resolve(inp, cfg, cap, run, (race_g, race_w, raced), pdl)
    if run.pack == 0 and run.n_rows > 1:
        emit_kernel[(run.n_rows,)](
            run.slots,
            run.counts,
            run.offsets,
            run.mask_ids,
            cap,
            BLOCK=1024,
            PDL=pdl,
            num_warps=4,
            enable_fp_fusion=FP_FUSION,
            **({"launch_pdl": True} if pdl else {}),
        )
    return SampleResult(
        tokens=run.tokens,
        logprobs=run.logprobs,
        mask_rows=index[batch:],
        mask_offsets=run.offsets,
        mask_ids=run.mask_ids,
        mask_status=run.status,
        nan_rows=run.nan_rows.view(torch.bool),
        fallback_rows=run.fallback.view(torch.bool),
        support_sizes=run.sizes,
        chunk_max=run.m_c,
        chunk_sumexp=run.s_c,
    )


def allocate(
    inp: SampleInputs, cfg: BandConfig, cap: int, index: torch.Tensor, band_sizes: torch.Tensor
) -> Launch:
    """The launches' buffers for inp under cfg (mask cap `cap`, mask_index `index`)."""
    x = inp.logits
    batch, vocab = x.shape
    dev = x.device
    n_rows = index.shape[0] - batch
    meta = resolve_meta(cfg, vocab, cap, has_step=inp.step is not None)
    cand_key = torch.empty(batch, cfg.ncand, dtype=torch.int64, device=dev)
    m_c, s_c, d_c = (torch.empty(batch, cfg.n_chunks, device=dev) for _ in range(3))
    slots = torch.empty(max(n_rows, 1) * cap, dtype=torch.int32, device=dev)
    scratch_len = meta["T1"] + meta["T2"] + max(meta["CAP_BLOCK"], meta["RESCUE"])
    if inp.seed is None:
        seed = torch.randint(-(2**63), 2**63 - 1, (batch,), dtype=torch.int64, device=dev)
    else:
        seed = inp.seed
    return Launch(
        cand_key=cand_key,
        m_c=m_c,
        s_c=s_c,
        d_c=d_c,
        seed=seed,
        step=inp.step if inp.step is not None else seed,
        midx=index[:batch],
        tokens=torch.empty(batch, dtype=torch.int64, device=dev),
        logprobs=torch.empty(batch, dtype=torch.float32, device=dev),
        sizes=torch.empty(batch, dtype=torch.int64, device=dev),
        nan_rows=torch.empty(batch, dtype=torch.int8, device=dev),
        fallback=torch.empty(batch, dtype=torch.int8, device=dev),
        band_sizes=band_sizes,
        counts=torch.empty(max(n_rows, 1), dtype=torch.int64, device=dev),
        status=torch.empty(n_rows, dtype=torch.int8, device=dev),
        slots=slots,
        offsets=torch.empty(n_rows + 1, dtype=torch.int64, device=dev),
        pack=pack_mode(n_rows, may_pack(cfg, batch, dev)),
        mask_ids=(
            slots if n_rows == 1 else torch.empty(n_rows * cap, dtype=torch.int32, device=dev)
        ),
        # Pass 1 clears mask_sizes whether or not resolve packs: one pass-1 compile per config.
        mask_sizes=torch.empty(batch, dtype=torch.int64, device=dev),
        scratch=torch.empty(batch, scratch_len, dtype=torch.int64, device=dev),
        meta=meta,
        n_rows=n_rows,
    )


def launch_resolve(
    inp: SampleInputs,
    cfg: BandConfig,
    cap: int,
    run: Launch,
    race: tuple[torch.Tensor, torch.Tensor, bool],
    pdl: bool,
) -> None:
    """Pass 2: one program per row, over pass 1's outputs. race: pass 1's race outputs (g, w)
    and whether pass 1 raced (stand-ins that resolve never reads when it did not)."""
    x = inp.logits
    batch, vocab = x.shape
    race_g, race_w, raced = race
    resolve_kernel[(batch,)](
        *run.stats(),
        x,
        x.stride(0),
        inp.temperature,
        *run.row_args(inp),
        vocab,
        cfg.n_chunks,
        inp.max_mask_tokens,
        cap,
        cfg.ncand,
        cfg.chunk,
        **run.meta,
        PDL=pdl,
        g_ptr=race_g,
        w_ptr=race_w,
        raced=int(raced),
        num_warps=8 if run.meta["CAND_BLOCK"] >= 2048 else 4,
        enable_fp_fusion=FP_FUSION,
        **({"maxnreg": cfg.resolve_regs} if cfg.resolve_regs else {}),
        **({"launch_pdl": True} if pdl else {}),
    )
