"""The sampler call of a step: per-row parameters to device tensors, `kernels.sample` (or the
sort-all baseline, same signature), and its outputs back to per-row `RowResult`s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import torch

from kernels.result import STATUS_OVERFLOW
from worker.batch import RowResult, RowWork

SampleFn = Callable[..., Any]  # kernels.sample or worker.sort_all.sample_sort_all_rows


@torch.inference_mode()
def warm_up_sampler(
    sample_fn: SampleFn, vocab_size: int, device: torch.device, max_mask_tokens: int
) -> None:
    """Compile the sampler's Triton variants before traffic arrives. Triton specialises
    on integer arguments equal to 1 or divisible by 16, so a batch of 1, of 2 and of 16
    rows each compile their own kernels; compiled mid-traffic, that stalls every stream
    of the worker for tens of seconds."""
    v = vocab_size
    for b in (1, 2, 16):
        logits = torch.randn(b, v, device=device, dtype=torch.float32)
        rows = torch.ones(b, device=device)
        for want, seeded in ((True, True), (False, False), (True, False)):
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
    torch.cuda.synchronize(device)


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
