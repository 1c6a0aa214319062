"""Logit generators of the kernel tests (bench/kernels.py draws its Zipf rows the same way).

peaked_logits: Zipf-shaped rows, z_r = -alpha * ln(rank r), ranks randomly permuted over the
vocabulary plus N(0, 0.1) jitter. alpha sets the entropy, nearly independent of V in
32000..262144: alpha 1.4 -> about 3.8 nats, 1.6 -> 2.7, 2.0 -> 1.7, 2.5 -> 1.0 (the benchmark
prints what it used), the range of real LM next-token distributions.
flat_logits: N(0, 1) logits, meant to be sampled at a high temperature (near-uniform rows).
adversarial_logits: the issue's hard cases, one kind per row.
"""

from __future__ import annotations

import math

import torch

ADVERSARIAL_KINDS = ("bf16_ties", "dyadic", "dominant", "flat", "neg_inf", "normal")


def peaked_logits(batch: int, vocab: int, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """[B, V] float32 Zipf-shaped logits (see module doc), on the generator's device."""
    dev = generator.device
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32, device=dev)
    base = -alpha * torch.log(ranks)
    perm = torch.argsort(torch.rand(batch, vocab, generator=generator, device=dev), dim=1)
    jitter = 0.1 * torch.randn(batch, vocab, generator=generator, device=dev)
    return base[perm] + jitter


def flat_logits(batch: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=generator, device=generator.device)


def entropy_nats(logits: torch.Tensor) -> torch.Tensor:
    """[B] entropy of softmax(logits) in nats (float64)."""
    logp = torch.log_softmax(logits.double(), dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def adversarial_row(kind: str, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """One [V] float32 row of the given kind."""
    g = generator
    if kind == "bf16_ties":  # few distinct values: long runs of equal z, broken by id
        return (torch.randn(vocab, generator=g) * 2).to(torch.bfloat16).to(torch.float32)
    if kind == "dyadic":  # masses 2^-i: top-p and min-p boundaries land exactly on 1/2, 3/4...
        levels = torch.randint(0, 6, (vocab,), generator=g).to(torch.float32)
        row = -levels * math.log(2.0)
        row[torch.randint(0, vocab, (1,), generator=g)] = 2.0 * math.log(2.0)
        return row
    if kind == "dominant":
        row = torch.randn(vocab, generator=g)
        row[torch.randint(0, vocab, (1,), generator=g)] = 40.0
        return row
    if kind == "flat":
        return torch.zeros(vocab)
    if kind == "neg_inf":  # most tokens banned, a few finite ones left (at least one)
        row = torch.randn(vocab, generator=g) * 3
        banned = torch.rand(vocab, generator=g) < 0.9
        banned[torch.randint(0, vocab, (1,), generator=g)] = False
        return row.masked_fill(banned, float("-inf"))
    if kind == "normal":
        return torch.randn(vocab, generator=g) * 3
    raise ValueError(f"unknown adversarial kind {kind!r}; expected one of {ADVERSARIAL_KINDS}")


def adversarial_logits(kinds: list[str], vocab: int, generator: torch.Generator) -> torch.Tensor:
    """[len(kinds), V] float32, one adversarial row per kind."""
    return torch.stack([adversarial_row(k, vocab, generator) for k in kinds])


def random_batch(seed: int, vocab_range: tuple[int, int] = (200, 700), rows: int = 12) -> dict:
    """A seeded random batch of kernels.sample's arguments for fuzzing a path against the
    oracle and the other path: V drawn from vocab_range, rows of normal logits at a random
    scale, some rounded to halves (ties, -0.0 among them), some a third at exactly 0.0, some
    with a fifth of their tokens at -inf; temperatures 1, 0.7, 1.3 and 2; top-k (5, 60, 250,
    past V or off), top-p (0.5 to 1), min-p (0, 0.05, 0.3); about 80% of rows asking for a
    mask, half of them bounded; a cap of 16 to 256 ids; fp32 or bf16 logits."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(torch.randint(vocab_range[0], vocab_range[1], (1,), generator=g))
    x = torch.randn(rows, vocab, generator=g) * float(torch.empty(1).uniform_(0.5, 4, generator=g))
    for r in range(rows):
        kind = int(torch.randint(0, 4, (1,), generator=g))
        if kind == 1:
            x[r] = torch.round(x[r] * 2) / 2
        elif kind == 2:
            x[r, : vocab // 3] = 0.0
        elif kind == 3:
            x[r, torch.randint(0, vocab, (vocab // 5,), generator=g)] = float("-inf")

    def pick(values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype)[
            torch.randint(0, len(values), (rows,), generator=g)
        ]

    batch = {
        "temperature": pick([1.0, 0.7, 1.3, 2.0]),
        "top_k": pick([-1, -1, 5, 60, 250, vocab + 3], torch.int32),
        "top_p": pick([1.0, 0.5, 0.9, 0.95, 0.999]),
        "min_p": pick([0.0, 0.0, 0.05, 0.3]),
        "want_mask": torch.rand(rows, generator=g) < 0.8,
        "bounded": torch.rand(rows, generator=g) < 0.5,
        "max_mask_tokens": [16, 64, 128, 256][int(torch.randint(0, 4, (1,), generator=g))],
        "seed": torch.arange(rows) + seed,
    }
    dtype = [torch.float32, torch.bfloat16][int(torch.randint(0, 2, (1,), generator=g))]
    batch["logits"] = x.to(dtype)
    return batch
