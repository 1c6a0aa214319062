"""maskgate.kernels.sample: the one entry point; dispatches on the logits' device."""

from __future__ import annotations

import torch

from maskgate.kernels.cpu.torch_path import sample_torch
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.result import SampleResult


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    want_mask: torch.Tensor,
    *,
    max_mask_tokens: int,
    seed: torch.Tensor | None = None,
    step: torch.Tensor | None = None,
    bounded: torch.Tensor | None = None,
) -> SampleResult:
    """Samples one token per row and emits the sampling masks of the rows that ask.

    logits [B, V] float32/bfloat16/float16; temperature, top_p, min_p [B] float32; top_k [B]
    int32 (-1 or 0 = off); want_mask [B] bool on the host; seed, step [B] int64 (both or
    neither: with them the draw is keyed by (seed, step, token id) and batch-invariant);
    bounded [B] bool (docs/design.md, mask semantics). Every per-row tensor except want_mask
    lives on logits.device. CUDA logits take the Triton path (no host sync); others the torch path.
    """
    inp = check_inputs(
        logits,
        temperature,
        top_k,
        top_p,
        min_p,
        want_mask,
        max_mask_tokens=max_mask_tokens,
        seed=seed,
        step=step,
        bounded=bounded,
    )
    if inp.logits.is_cuda:
        from maskgate.kernels.triton.launch import sample_triton  # triton is only needed on CUDA

        return sample_triton(inp)
    return sample_torch(inp)
