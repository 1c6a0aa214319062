"""The sort-all-rows sampler: the baseline the isolation benchmark measures the kernel against.

This is how SGLang's reference computes sampling masks: whenever ANY row of a decode batch asks
for a mask, every row of the batch is sorted over the full vocabulary, renormalised and cut by
a cumulative sum, and the masks are rebuilt with `nonzero`. Rows that did not ask pay the same.
Batches where no row asks go to `kernels.sample` unchanged (the reference pays nothing then).

Tokens, log-probs and masks all come from the sort, not from `kernels.sample`: a sampler that
drew its token elsewhere and sorted only "for the cost" could return a token outside its own
mask when two float32 cumulative sums disagree at the top-p boundary. The semantics are
docs/design.md's (stable descending sort = z descending, then id ascending; exclusive cumulative
mass < top_p over the top-k survivors; min-p against the maximum; Gumbel-max draw keyed by the same
(seed, step, token id) noise as the kernels), so a client cannot tell the two samplers apart,
only time them. Every row's mask is copied to the host, as the reference does; only the rows
that asked are returned. Runs on any device; it is meant for CUDA benchmarks.
"""

from __future__ import annotations

from typing import Any

import torch

from maskgate import kernels
from maskgate.kernels.cpu.torch_path import noise_keys
from maskgate.kernels.inputs import SampleInputs, check_inputs
from maskgate.kernels.noise import gumbel
from maskgate.kernels.order import GREEDY_T, scaled_logits
from maskgate.kernels.result import STATUS_OK, STATUS_OVERFLOW, STATUS_TRUNCATED, SampleResult

NEG_INF = float("-inf")


def sample_sort_all_rows(*args: Any, **kwargs: Any) -> SampleResult:
    """Same arguments and result as `kernels.sample`, checked by the same `check_inputs`."""
    inp = check_inputs(*args, **kwargs)
    if not bool(inp.want_mask.any()):
        return kernels.sample(*args, **kwargs)
    return _sort_all_rows(inp)


def _sort_all_rows(inp: SampleInputs) -> SampleResult:
    """Every row sorted over the full vocabulary; at least one row asks for a mask."""
    batch, vocab = inp.logits.shape
    dev = inp.logits.device
    z = scaled_logits(inp.logits.float(), inp.temperature)  # [B, V] float32
    z_max = z.amax(dim=1)
    nan_rows = torch.isnan(z_max) | torch.isinf(z_max)  # NaN, +inf, or no finite logit
    z = torch.where(nan_rows[:, None], 0.0, z)
    # The full-vocabulary sort of every row; stable, so equal z keep ascending ids.
    vals, order = torch.sort(z, dim=1, descending=True, stable=True)  # [B, V]
    pos = torch.arange(vocab, device=dev)[None, :]
    k = inp.top_k.to(torch.int64)
    k = torch.where((k > 0) & (k < vocab), k, vocab)
    keep = pos < k[:, None]
    probs = torch.where(keep, torch.exp(vals - vals[:, :1]), 0.0)
    probs = probs / probs.sum(dim=1, keepdim=True)  # renormalised over the top-k survivors
    before = torch.cumsum(probs, dim=1) - probs  # mass strictly before each token
    use_p = (inp.top_p < 1.0)[:, None]
    keep &= ~use_p | (before < inp.top_p[:, None])
    use_min = (inp.min_p > 0)[:, None]
    keep &= ~use_min | (torch.exp(vals - vals[:, :1]) >= inp.min_p[:, None])
    greedy = inp.temperature.double() < GREEDY_T
    keep &= ~(greedy | nan_rows)[:, None] | (pos == 0)
    keep[:, 0] = True  # top-p keeps at least one token

    k0, k1 = noise_keys(inp)
    score = torch.where(keep, vals + gumbel(k0[:, None], k1[:, None], order), NEG_INF)
    j = torch.where(greedy, 0, score.argmax(dim=1))  # [B] position of the token
    token = order.gather(1, j[:, None]).squeeze(1)
    lse = vals[:, 0] + torch.log(torch.where(keep, torch.exp(vals - vals[:, :1]), 0.0).sum(1))
    logprob = torch.where(greedy, 0.0, vals.gather(1, j[:, None]).squeeze(1) - lse)
    token = torch.where(nan_rows, 0, token)
    logprob = torch.where(nan_rows, float("nan"), logprob)
    keep &= ~nan_rows[:, None]  # flagged rows: empty mask, |S| = 0
    n = keep.sum(dim=1)

    # Every row's mask as CSR (the nonzero is a host sync, as in the reference), to the host.
    rows, cols = keep.nonzero(as_tuple=True)
    ids = order[rows, cols].to(torch.int32).cpu()
    counts = torch.bincount(rows, minlength=batch).cpu()
    return _pick_rows(inp, token, logprob, j, n, nan_rows, ids, counts)


def _pick_rows(
    inp: SampleInputs,
    token: torch.Tensor,
    logprob: torch.Tensor,
    j: torch.Tensor,
    n: torch.Tensor,
    nan_rows: torch.Tensor,
    ids: torch.Tensor,
    counts: torch.Tensor,
) -> SampleResult:
    """The asking rows' masks from every row's CSR (host tensors), with the cap applied.

    ids [N] int32 and counts [B] int64 on the host: each row's support in mask order.
    """
    cap = inp.max_mask_tokens
    starts = [0, *torch.cumsum(counts, 0).tolist()]
    tokens_h, j_h = token.cpu().tolist(), j.cpu().tolist()
    bounded = inp.bounded.cpu().tolist()
    mask_rows = inp.want_mask.nonzero().squeeze(1)
    pieces: list[torch.Tensor] = []
    status: list[int] = []
    for r in mask_rows.tolist():
        row = ids[starts[r] : starts[r + 1]]
        if row.numel() <= cap:
            pieces.append(row)
            status.append(STATUS_OK)
        elif not bounded[r]:
            pieces.append(row[:0])
            status.append(STATUS_OVERFLOW)
        else:
            row = row[:cap].clone()
            if j_h[r] >= cap:  # the token replaces the last id when it is not among them
                row[-1] = tokens_h[r]
            pieces.append(row)
            status.append(STATUS_TRUNCATED)
    offsets = torch.zeros(len(pieces) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([p.numel() for p in pieces], dtype=torch.int64), 0)
    return SampleResult(
        tokens=token,
        logprobs=logprob.to(torch.float32),
        mask_rows=mask_rows,
        mask_offsets=offsets,
        mask_ids=torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32),
        mask_status=torch.tensor(status, dtype=torch.int8),
        nan_rows=nan_rows,
        fallback_rows=torch.zeros_like(nan_rows),
        support_sizes=n.to(torch.int64),
    )
