"""The sampler call of a step: per-row parameters to device tensors, `kernels.sample` (or the
sort-all baseline, same signature), and its outputs back to per-row `RowResult`s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import torch

import kernels
from kernels.result import STATUS_OVERFLOW
from worker.batch import RowResult, RowWork

SampleFn = Callable[..., Any]  # kernels.sample or worker.sort_all.sample_sort_all_rows


# Batch sizes whose every sampler variant (seeded, unseeded, with and without masks) is
# compiled at start: Triton specialises integer arguments equal to 1 or divisible by 16.
SMALL_BATCHES = (1, 2, 16)
# The runner's logits dtype (LlamaForCausalLM.compute_logits): pass 1's config depends on it.
LOGITS_DTYPE = torch.float32


@torch.inference_mode()
def warm_up_sampler(
    sample_fn: SampleFn,
    vocab_size: int,
    device: torch.device,
    max_mask_tokens: int,
    max_batch: int,
) -> None:
    """Compile the sampler's Triton variants before traffic arrives; compiled mid-traffic, a
    variant stalls every stream of the worker for seconds.

    SMALL_BATCHES run every variant of sample_fn. Then `kernels.sample` (the baseline sends
    its mask-free batches there too) runs once seeded and once unseeded, every row asking for
    a mask, at each size of `warm_up_batches(vocab_size, max_batch)`: its pass 1 has a config
    per batch range, and its resolve kernel specialises on that config's chunk count.
    """
    for b in SMALL_BATCHES:
        for want, seeded in ((True, True), (False, False), (True, False)):
            _warm_call(sample_fn, b, vocab_size, device, max_mask_tokens, want, seeded)
    covered = SMALL_BATCHES if sample_fn is kernels.sample else ()
    for b in warm_up_batches(vocab_size, max_batch):
        if b not in covered:
            for seeded in (True, False):
                _warm_call(kernels.sample, b, vocab_size, device, max_mask_tokens, True, seeded)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up_batches(vocab_size: int, max_batch: int) -> list[int]:
    """Batch sizes that meet every compiled variant of kernels.sample's CUDA path for batches of
    1..max_batch rows, all rows asking for masks (ascending, few: ~10 for max_batch 256).

    Two things vary with the batch: pass 1's `band_config(vocab, batch=B)` for LOGITS_DTYPE
    (a handful of configs, in power-of-two steps of B) and the emit kernel's block over the
    mask rows (next power of two of their count). The powers of two up to max_batch, and
    max_batch itself, give every emit block; each config none of them meets adds its
    smallest B.
    """
    from kernels.triton_path import band_config  # triton: only needed on CUDA

    batches = {1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch}
    batches.add(max_batch)
    itemsize = LOGITS_DTYPE.itemsize
    seen = {band_config(vocab_size, batch=b, itemsize=itemsize) for b in batches}
    for b in range(1, max_batch + 1):
        cfg = band_config(vocab_size, batch=b, itemsize=itemsize)
        if cfg not in seen:
            seen.add(cfg)
            batches.add(b)
    return sorted(batches)


def _warm_call(
    sample_fn: SampleFn,
    b: int,
    vocab_size: int,
    device: torch.device,
    max_mask_tokens: int,
    want: bool,
    seeded: bool,
) -> None:
    """One sampler call over [b, vocab_size] random logits of the runner's dtype."""
    logits = torch.randn(b, vocab_size, device=device, dtype=LOGITS_DTYPE)
    rows = torch.ones(b, device=device)
    ids = torch.arange(b, device=device, dtype=torch.int64)
    sample_fn(
        logits,
        rows.clone(),
        torch.full((b,), 50, device=device, dtype=torch.int32),
        rows * 0.9,
        rows * 0.0,
        torch.full((b,), want, dtype=torch.bool),
        max_mask_tokens=max_mask_tokens,
        seed=ids if seeded else None,
        step=ids.clone() if seeded else None,
        bounded=torch.zeros(b, device=device, dtype=torch.bool),
    )


def sample_rows(
    sample_fn: SampleFn, logits: torch.Tensor, rows: list[RowWork], max_mask_tokens: int
) -> tuple[list[RowResult], float, int]:
    """kernels.sample over [B, V] logits; returns per-row results, sampler seconds and the
    number of rows that needed the sampler's slow full pass."""
    dev = logits.device
    floats = torch.tensor(
        [[r.params.temperature, r.params.top_p, r.params.min_p] for r in rows],
        dtype=torch.float32,
    ).to(dev)
    seeded = any(r.params.seed is not None for r in rows)
    # Unseeded rows in a batch with seeded ones get a fresh random key, which is what
    # kernels does for seed=None.
    ints = torch.tensor(
        [
            [
                r.params.top_k,
                r.step,
                r.params.seed if r.params.seed is not None else random.getrandbits(63),
                r.bounded,
            ]
            for r in rows
        ],
        dtype=torch.int64,
    ).to(dev)
    want_mask = torch.tensor([r.want_mask for r in rows], dtype=torch.bool)
    timer = _Timer(dev)
    res = sample_fn(
        logits,
        _column(floats, 0),
        ints[:, 0].to(torch.int32),
        _column(floats, 1),
        _column(floats, 2),
        want_mask,
        max_mask_tokens=max_mask_tokens,
        seed=_column(ints, 2) if seeded else None,
        step=_column(ints, 1) if seeded else None,
        bounded=ints[:, 3].bool(),
    )
    seconds = timer.stop()
    # Three device-to-host copies instead of eight (each .tolist() of a CUDA tensor is a
    # synchronous copy): per-row values in one float64 block (exact for ids, sizes and
    # float32 log-probs), the mask rows' metadata with the CSR offsets, and the mask ids.
    per_row = torch.stack(
        [
            res.tokens.double(),
            res.logprobs.double(),
            res.nan_rows.double(),
            res.support_sizes.double(),
            res.fallback_rows.double(),
        ]
    ).tolist()
    tokens, logprobs, nan, sizes, fallback = per_row
    results = [
        RowResult(token=int(t), logprob=lp, nan=bool(bad))
        for t, lp, bad in zip(tokens, logprobs, nan, strict=True)
    ]
    num_masks = res.mask_rows.shape[0]
    if num_masks:
        meta = torch.cat([res.mask_rows, res.mask_status.long(), res.mask_offsets.long()]).tolist()
        mask_rows, status, offsets = (
            meta[:num_masks],
            meta[num_masks : 2 * num_masks],
            meta[2 * num_masks :],
        )
        ids = res.mask_ids[: offsets[-1]].tolist()
        for j, (row, st) in enumerate(zip(mask_rows, status, strict=True)):
            r = results[row]
            r.mask_status = st
            r.support_size = int(sizes[row])
            r.mask = None if st == STATUS_OVERFLOW else ids[offsets[j] : offsets[j + 1]]
    return results, seconds, int(sum(fallback))


class _Timer:
    """Wall time of a device region: CUDA events on CUDA (no extra sync), perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1000.0
        return time.perf_counter() - self.t0


def _column(t: torch.Tensor, j: int) -> torch.Tensor:
    """Column j of a [B, k] tensor in a fresh allocation. `.contiguous()` returns a [1]-row
    column as a view at a 4- or 8-byte offset, and Triton compiles a separate kernel for
    pointers that are not 16-byte aligned: a batch of one would trigger a recompile."""
    return t[:, j].clone(memory_format=torch.contiguous_format)
