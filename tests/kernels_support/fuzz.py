"""One seeded random batch (workloads.random_batch) on the Triton path, under the Triton
interpreter's shrunken band, against the float64 oracle and the torch path."""

from __future__ import annotations

from kernels_support.conformance import check_result
from kernels_support.workloads import random_batch
from maskgate.kernels.cpu.torch_path import sample_torch
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.reference import reference
from maskgate.kernels.triton.config import band_config
from maskgate.kernels.triton.launch import sample_triton


def run_batch(seed: int, vocab_range: tuple[int, int] = (200, 700)) -> dict:
    """One random batch: its oracle check and where the two paths disagree."""
    batch = random_batch(seed, vocab_range)
    inp = check_inputs(**batch)
    x = batch["logits"]
    tri = sample_triton(inp, band_config(x.shape[1], chunk=64, kc=8, lanes=16))
    cpu = sample_torch(inp)
    args = [batch[k] for k in ("temperature", "top_k", "top_p", "min_p")]
    ref = reference(x.float(), *args)
    rep = check_result(tri, ref, batch["want_mask"], batch["bounded"], batch["max_mask_tokens"])
    sure = ~ref.ambiguous
    rows = range(x.shape[0])
    mask_rows = tri.mask_rows.tolist()
    tri_masks, cpu_masks = tri.masks(), cpu.masks()
    return {
        "seed": seed,
        "vocab": x.shape[1],
        "rows": x.shape[0],
        "ok": rep.ok,
        "errors": rep.errors,
        "fallback": int(tri.fallback_rows.sum()),
        "ambiguous": int(ref.ambiguous.sum()),
        "token_diff": [r for r in rows if sure[r] and int(tri.tokens[r]) != int(cpu.tokens[r])],
        "mask_diff": [
            r for i, r in enumerate(mask_rows) if sure[r] and tri_masks[i] != cpu_masks[i]
        ],
    }
