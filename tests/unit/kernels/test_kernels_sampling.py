"""Stochastic behaviour of the torch path: the draw follows the truncated distribution, seeded
draws are deterministic and batch-invariant."""

from __future__ import annotations

import math

import torch

from maskgate import kernels
from maskgate.kernels.reference import reference


def draws(
    logits_row: torch.Tensor,
    n: int,
    k: int,
    p: float,
    min_p: float,
    temp: float,
    seed: torch.Tensor | None,
) -> torch.Tensor:
    """n draws of one row: the row repeated n times, each copy its own step (or generator)."""
    logits = logits_row[None, :].expand(n, -1).contiguous()
    ones = torch.ones(n)
    step = None if seed is None else torch.arange(n, dtype=torch.int64)
    res = kernels.sample(
        logits,
        ones * temp,
        torch.full((n,), k, dtype=torch.int32),
        ones * p,
        ones * min_p,
        torch.zeros(n, dtype=torch.bool),
        max_mask_tokens=4096,
        seed=seed,
        step=step,
    )
    return res.tokens


def assert_matches_truncated(
    logits_row: torch.Tensor, tokens: torch.Tensor, k: int, p: float, min_p: float, temp: float
) -> None:
    one = torch.ones(1)
    ref = reference(
        logits_row[None], one * temp, torch.tensor([k], dtype=torch.int32), one * p, one * min_p
    )
    support = ref.support(0)
    probs = ref.probs(0)
    counts = torch.bincount(tokens, minlength=logits_row.numel()).double()
    assert counts.sum() == counts[support].sum(), "a token outside the support was drawn"
    n = tokens.numel()
    freq = counts[support] / n
    tv = 0.5 * (freq - probs).abs().sum().item()
    expected = probs * n
    chi2 = ((counts[support] - expected) ** 2 / expected).sum().item()
    dof = len(support) - 1
    # 6 sigma above the chi-square mean: a false alarm is far below one in a million runs.
    assert chi2 <= dof + 6 * math.sqrt(2 * dof), (chi2, dof)
    assert tv < 0.03, tv


def test_seeded_draws_follow_truncated_distribution() -> None:
    g = torch.Generator().manual_seed(3)
    row = torch.randn(64, generator=g) * 1.5
    for k, p, min_p, temp in [(10, 0.9, 0.0, 1.0), (-1, 0.95, 0.05, 0.8), (-1, 1.0, 0.2, 1.3)]:
        tokens = draws(row, 20000, k, p, min_p, temp, seed=torch.full((20000,), 1234))
        assert_matches_truncated(row, tokens, k, p, min_p, temp)


def test_unseeded_draws_use_torch_generator() -> None:
    g = torch.Generator().manual_seed(4)
    row = torch.randn(40, generator=g)
    torch.manual_seed(0)
    first = draws(row, 10000, 8, 1.0, 0.0, 1.0, seed=None)
    assert_matches_truncated(row, first, 8, 1.0, 0.0, 1.0)
    torch.manual_seed(0)
    again = draws(row, 10000, 8, 1.0, 0.0, 1.0, seed=None)
    assert torch.equal(first, again)


def test_seeded_draw_is_batch_invariant() -> None:
    # More rows than HOST_KEY_ROWS: the batch hashes its noise keys as tensors, a row alone
    # on Python ints, and both draw the same token.
    B = 40
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(B, 3000, generator=g) * 2
    ones = torch.ones(B)
    k = torch.full((B,), -1, dtype=torch.int32)
    seed = torch.arange(100, 100 + B, dtype=torch.int64)
    step = torch.full((B,), 9, dtype=torch.int64)
    want = torch.ones(B, dtype=torch.bool)
    full = kernels.sample(
        logits, ones, k, ones * 0.95, ones * 0.0, want, max_mask_tokens=4096, seed=seed, step=step
    )
    again = kernels.sample(
        logits, ones, k, ones * 0.95, ones * 0.0, want, max_mask_tokens=4096, seed=seed, step=step
    )
    assert torch.equal(full.tokens, again.tokens)
    perm = torch.randperm(B, generator=g)
    shuffled = kernels.sample(
        logits[perm],
        ones,
        k,
        ones * 0.95,
        ones * 0.0,
        want,
        max_mask_tokens=4096,
        seed=seed[perm],
        step=step[perm],
    )
    assert torch.equal(shuffled.tokens, full.tokens[perm])
    assert torch.equal(shuffled.logprobs, full.logprobs[perm])
    for b in (0, 7, B - 1):
        alone = kernels.sample(
            logits[b : b + 1],
            ones[:1],
            k[:1],
            ones[:1] * 0.95,
            ones[:1] * 0.0,
            want[:1],
            max_mask_tokens=4096,
            seed=seed[b : b + 1],
            step=step[b : b + 1],
        )
        assert alone.tokens.item() == full.tokens[b].item()
        assert alone.masks()[0] == full.masks()[b]
    moved = kernels.sample(
        logits,
        ones,
        k,
        ones * 0.95,
        ones * 0.0,
        want,
        max_mask_tokens=4096,
        seed=seed,
        step=step + 1,
    )
    assert not torch.equal(moved.tokens, full.tokens)  # the step is part of the key
