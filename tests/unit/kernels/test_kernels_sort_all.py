"""The sort-all-rows baseline sampler answers exactly what kernels.sample answers (CPU)."""

from __future__ import annotations

import torch

from maskgate import kernels
from maskgate.kernels import sample_sort_all_rows


def _case(bounded_row: int | None = None) -> tuple[tuple[torch.Tensor, ...], dict]:
    gen = torch.Generator().manual_seed(0)
    batch, vocab = 12, 3001
    x = torch.randn(batch, vocab, generator=gen) * 5
    x[3, :] = 1.0  # flat row: |S| over the cap
    x[4, 10] = float("nan")
    x[6, 100:] = float("-inf")
    temp = torch.tensor([1.0, 0.7, 0.0, 1.0, 1.0, 1.3, 1, 1, 1, 1, 1, 1])
    top_k = torch.tensor([-1, 50, -1, -1, 0, 20, -1, -1, 5, -1, -1, -1], dtype=torch.int32)
    top_p = torch.tensor([0.95, 0.9, 0.9, 0.95, 0.9, 1.0, 0.5, 0.95, 1.0, 0.99, 0.95, 0.95])
    min_p = torch.tensor([0, 0, 0, 0, 0, 0.1, 0, 0, 0, 0, 0.05, 0.0])
    want = torch.tensor([1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    bounded = torch.zeros(batch, dtype=torch.bool)
    if bounded_row is not None:
        bounded[bounded_row] = True
    kw = {
        "max_mask_tokens": 2000,
        "seed": torch.arange(batch, dtype=torch.int64) * 7 + 1,
        "step": torch.arange(batch, dtype=torch.int64),
        "bounded": bounded,
    }
    return (x, temp, top_k, top_p, min_p, want), kw


def _same(args: tuple[torch.Tensor, ...], kw: dict) -> None:
    want = kernels.sample(*args, **kw)
    got = sample_sort_all_rows(*args, **kw)
    assert got.tokens.tolist() == want.tokens.tolist()
    torch.testing.assert_close(got.logprobs, want.logprobs, equal_nan=True)
    assert got.masks() == want.masks()
    assert got.mask_rows.tolist() == want.mask_rows.tolist()
    assert got.mask_status.tolist() == want.mask_status.tolist()
    assert got.support_sizes.tolist() == want.support_sizes.tolist()
    assert got.nan_rows.tolist() == want.nan_rows.tolist()


def test_sort_all_matches_kernel_exact_mode() -> None:
    args, kw = _case()
    _same(args, kw)
    assert sample_sort_all_rows(*args, **kw).mask_status.tolist()[2] == 1  # row 3 overflows


def test_sort_all_matches_kernel_bounded_mode() -> None:
    args, kw = _case(bounded_row=3)
    _same(args, kw)


def test_sort_all_without_mask_rows_is_the_kernel() -> None:
    args, kw = _case()
    args = (*args[:5], torch.zeros(12, dtype=torch.bool))
    _same(args, kw)
