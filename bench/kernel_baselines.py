"""The baselines bench_kernels.py times kernels.sample against: (a) a one-pass floor that reads
the logits once for max and sum-exp, (b) the sort-based mask path SGLang's reference mask
reconstruction takes, (c) a torch.topk(1024)-based path. CUDA tensors; no result checks
(they are timing references, not samplers)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _floor_kernel(x_ptr, m_ptr, s_ptr, stride_x, vocab, n_chunks, CHUNK: tl.constexpr):
    """One read of the logits: chunk max and sum-exp, nothing else (the memory floor)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + ids, mask=ids < vocab, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(m_ptr + row * n_chunks + chunk, m)
    tl.store(s_ptr + row * n_chunks + chunk, tl.sum(tl.exp(x - m), axis=0))


def floor_pass(x: torch.Tensor, chunk: int) -> None:
    batch, vocab = x.shape
    n_chunks = triton.cdiv(vocab, chunk)
    m = torch.empty(batch, n_chunks, device=x.device)
    s = torch.empty_like(m)
    _floor_kernel[(batch, n_chunks)](
        x, m, s, x.stride(0), vocab, n_chunks, CHUNK=chunk, num_warps=8
    )


def sort_path(x, temp, top_k, top_p, min_p):
    """(b) SGLang-style reference: full sort, cumsum, masks, sample, nonzero into CSR."""
    z = x.float() / temp[:, None]
    vals, order = torch.sort(z, dim=1, descending=True)
    probs = torch.softmax(vals, dim=1)
    pos = torch.arange(z.shape[1], device=z.device)[None, :]
    keep = pos < torch.where(top_k > 0, top_k, z.shape[1])[:, None]
    kept = probs * keep
    kept = kept / kept.sum(dim=1, keepdim=True)
    keep &= (torch.cumsum(kept, dim=1) - kept) < top_p[:, None]
    keep &= probs >= min_p[:, None] * probs[:, :1]
    pick = torch.multinomial(probs * keep, 1)
    token = order.gather(1, pick)
    rows, cols = keep.nonzero(as_tuple=True)
    offsets = torch.cumsum(torch.bincount(rows, minlength=z.shape[0]), 0)
    return token, order[rows, cols], offsets


def topk_path(x, temp, top_k, top_p, min_p, k=1024):
    """(c) topk(1024) candidates, full logsumexp for top-p, masks, sample, nonzero CSR."""
    z = x.float() / temp[:, None]
    vals, idx = torch.topk(z, k, dim=1)
    lse = torch.logsumexp(z, dim=1, keepdim=True)
    probs = torch.exp(vals - lse)
    pos = torch.arange(k, device=z.device)[None, :]
    keep = pos < torch.where(top_k > 0, top_k, k)[:, None]
    kept = probs * keep
    norm = torch.where(top_k[:, None] > 0, kept.sum(dim=1, keepdim=True), 1.0)
    keep &= (torch.cumsum(kept, dim=1) - kept) / norm < top_p[:, None]
    keep &= probs >= min_p[:, None] * probs[:, :1]
    pick = torch.multinomial(probs * keep, 1)
    token = idx.gather(1, pick)
    rows, cols = keep.nonzero(as_tuple=True)
    return token, idx[rows, cols]
