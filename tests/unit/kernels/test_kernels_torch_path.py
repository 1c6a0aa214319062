"""The CPU torch path against the float64 oracle: supports, CSR, log-probs, edge rows."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from kernels_support.conformance import check_result
from kernels_support.workloads import ADVERSARIAL_KINDS, adversarial_logits

from maskgate import kernels
from maskgate.kernels.reference import reference
from maskgate.kernels.result import STATUS_OVERFLOW, STATUS_TRUNCATED


def grid_batch(vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """One mixed batch: every (kind, k, p, min_p) of the issue's grid, temperatures cycled."""
    ks = [1, 2, 50, vocab - 1, vocab, vocab + 5, -1]
    ps = [1e-6, 0.5, 0.9, 0.999, 1.0]
    min_ps = [0.0, 0.05, 0.5, 1.0]
    combos = list(itertools.product(ADVERSARIAL_KINDS, ks, ps, min_ps))
    g = torch.Generator().manual_seed(seed)
    temps = torch.tensor([1.0, 0.7, 2.0, 0.0, 1.0])
    b = len(combos)
    return {
        "logits": adversarial_logits([c[0] for c in combos], vocab, g),
        "temperature": temps[torch.arange(b) % len(temps)],
        "top_k": torch.tensor([c[1] for c in combos], dtype=torch.int32),
        "top_p": torch.tensor([c[2] for c in combos], dtype=torch.float32),
        "min_p": torch.tensor([c[3] for c in combos], dtype=torch.float32),
        "want_mask": torch.arange(b) % 7 != 3,
        "bounded": torch.arange(b) % 2 == 0,
        "seed": torch.arange(b, dtype=torch.int64) * 7919,
        "step": torch.full((b,), 3, dtype=torch.int64),
    }


def run(batch: dict[str, torch.Tensor], cap: int) -> kernels.SampleResult:
    return kernels.sample(
        batch["logits"],
        batch["temperature"],
        batch["top_k"],
        batch["top_p"],
        batch["min_p"],
        batch["want_mask"],
        max_mask_tokens=cap,
        seed=batch.get("seed"),
        step=batch.get("step"),
        bounded=batch.get("bounded"),
    )


def oracle(batch: dict[str, torch.Tensor]):
    keys = ("logits", "temperature", "top_k", "top_p", "min_p")
    return reference(*(batch[k] for k in keys))


@pytest.mark.parametrize("vocab", [111, 1000, 5000])
@pytest.mark.parametrize("cap", [16, 4096])
def test_grid_matches_oracle(vocab: int, cap: int) -> None:
    batch = grid_batch(vocab, seed=vocab)
    res = run(batch, cap)
    report = check_result(res, oracle(batch), batch["want_mask"], batch["bounded"], cap)
    assert report.ok, report.errors
    assert report.rows == batch["logits"].shape[0]
    # The dyadic rows are built to sit on top-p boundaries; elsewhere ambiguity is rare.
    assert report.ambiguous < report.rows // 4
    assert report.logprob_max_err <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(dtype: torch.dtype) -> None:
    batch = grid_batch(1000, seed=5)
    batch["logits"] = batch["logits"].clamp(-60000, 60000).to(dtype)
    res = run(batch, 64)
    report = check_result(res, oracle(batch), batch["want_mask"], batch["bounded"], 64)
    assert report.ok, report.errors


def test_greedy_takes_lowest_id_among_ties() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    two = torch.ones(2)
    res = kernels.sample(
        logits,
        torch.tensor([0.0, 1e-7]),
        torch.full((2,), -1, dtype=torch.int32),
        two * 0.5,
        two * 0.0,
        torch.ones(2, dtype=torch.bool),
        max_mask_tokens=8,
    )
    assert res.tokens.tolist() == [1, 0]
    assert res.logprobs.tolist() == [0.0, 0.0]
    assert res.masks() == [[1], [0]]


def test_bad_rows_are_flagged_and_others_unaffected() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 300, generator=g)
    logits[1, 7] = float("nan")
    logits[2] = float("-inf")
    logits[3, 9] = float("inf")  # +inf under a temperature: softmax is undefined
    ones = torch.ones(5)
    args = (
        torch.full((5,), -1, dtype=torch.int32),
        ones * 0.9,
        ones * 0.0,
        torch.ones(5, dtype=torch.bool),
    )
    seed = torch.arange(5, dtype=torch.int64)
    res = kernels.sample(logits, ones, *args, max_mask_tokens=300, seed=seed)
    assert res.nan_rows.tolist() == [False, True, True, True, False]
    masks = res.masks()
    assert [len(m) for m in masks][1:4] == [0, 0, 0]
    assert torch.isnan(res.logprobs[1:4]).all()
    alone = kernels.sample(
        logits[4:], ones[4:], *(a[4:] for a in args), max_mask_tokens=300, seed=seed[4:]
    )
    assert alone.tokens.item() == res.tokens[4].item()
    assert alone.masks()[0] == masks[4]


def test_overflow_and_truncation_status() -> None:
    vocab, cap = 2000, 10
    logits = torch.zeros(2, vocab)  # flat rows: |S| = V under top-p 0.999
    ones = torch.ones(2)
    res = kernels.sample(
        logits,
        ones,
        torch.full((2,), -1, dtype=torch.int32),
        ones * 0.999,
        ones * 0.0,
        torch.ones(2, dtype=torch.bool),
        max_mask_tokens=cap,
        seed=torch.tensor([11, 11]),
        bounded=torch.tensor([False, True]),
    )
    assert res.mask_status.tolist() == [STATUS_OVERFLOW, STATUS_TRUNCATED]
    masks = res.masks()
    assert masks[0] == []
    token = int(res.tokens[1])
    expect = list(range(cap))
    if token not in expect:
        expect[-1] = token
    assert masks[1] == expect
    # Keep j iff j / 2000 < float32(0.999) = 0.99900001...: j = 0..1998, so |S| = 1999. The
    # log-prob stays over that full support, not over the C emitted ids.
    assert res.support_sizes.tolist() == [1999, 1999]
    assert abs(float(res.logprobs[1]) + math.log(1999)) < 1e-5


def test_only_requesting_rows_get_masks_and_k_beyond_vocab() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 40, generator=g)
    ones = torch.ones(3)
    res = kernels.sample(
        logits,
        ones,
        torch.tensor([100, 40, 5], dtype=torch.int32),
        ones,
        ones * 0.0,
        torch.tensor([False, True, True]),
        max_mask_tokens=64,
        seed=torch.arange(3),
    )
    assert res.mask_rows.tolist() == [1, 2]
    assert res.support_sizes.tolist() == [40, 40, 5]
    assert res.mask_offsets.tolist() == [0, 40, 45]
    assert res.mask_ids.dtype == torch.int32 and res.mask_ids.numel() == 45


def test_negative_zero_ties_with_zero_on_the_id() -> None:
    """-0.0 and +0.0 are one z (equal values tie on the id), also where the
    support is cut inside their tie and only the full sort of a row's keys decides it (a
    fuzz run found the CPU path putting every -0.0 after the +0.0s there)."""
    x = torch.zeros(2, 300)
    x[:, 1::2] = -0.0
    x[:, 250:] = -1.0
    ones = torch.ones(2)
    want = torch.ones(2, dtype=torch.bool)
    top_p = torch.tensor([0.5, 1.0])
    top_k = torch.tensor([-1, 101], dtype=torch.int32)
    res = kernels.sample(x, ones, top_k, top_p, ones * 0.0, want, max_mask_tokens=300)
    ref = reference(x, ones, top_k, top_p, ones * 0.0)
    assert check_result(res, ref, want, None, 300).ok
    masks = res.masks()
    assert masks[1] == list(range(101))  # ids 0..100, -0.0 and +0.0 alike, by id
    assert masks[0] == list(range(len(masks[0]))) and 100 < len(masks[0]) < 250


def test_single_row_and_result_dtypes() -> None:
    res = kernels.sample(
        torch.randn(1, 111),
        torch.ones(1),
        torch.tensor([50], dtype=torch.int32),
        torch.tensor([0.9]),
        torch.tensor([0.05]),
        torch.tensor([True]),
        max_mask_tokens=4096,
    )
    assert res.tokens.dtype == torch.int64 and res.tokens.shape == (1,)
    assert res.logprobs.dtype == torch.float32
    assert res.mask_rows.dtype == torch.int64 and res.mask_offsets.dtype == torch.int64
    assert res.mask_status.dtype == torch.int8
    assert res.nan_rows.dtype == torch.bool and res.fallback_rows.dtype == torch.bool
    assert int(res.tokens[0]) in res.masks()[0]


def test_untruncated_rows_without_a_mask_draw_as_the_tiers_do() -> None:
    """Rows nothing truncates (top_k off or >= V, top_p 1, min_p 0) that want no mask take
    one Gumbel-max over the row instead of the prefix tiers and their full sort: the same
    token, log-prob and support size as the tiers give the same rows asking for a mask."""
    vocab, b = 3000, 12
    g = torch.Generator().manual_seed(9)
    x = 3 * torch.randn(b, vocab, generator=g)
    x[1, ::3] = float("-inf")
    x[2] = torch.round(x[2])  # ties
    x[3] = 0.0  # flat
    args = (
        x,
        torch.tensor([1.0, 0.7, 1.3, 2.0] * 3),
        torch.tensor([-1, 0, vocab, vocab + 9] * 3, dtype=torch.int32),
        torch.ones(b),
        torch.zeros(b),
    )
    kw = {"max_mask_tokens": 64, "seed": torch.arange(b) * 101, "step": torch.full((b,), 4)}
    plain = kernels.sample(*args, torch.zeros(b, dtype=torch.bool), **kw)
    masked = kernels.sample(
        *args, torch.ones(b, dtype=torch.bool), **kw, bounded=torch.ones(b, dtype=torch.bool)
    )
    assert torch.equal(plain.tokens, masked.tokens)
    assert torch.equal(plain.support_sizes, masked.support_sizes)
    assert torch.allclose(plain.logprobs, masked.logprobs, atol=1e-5)
    assert int(plain.support_sizes[1]) == vocab - 1000
    assert int(masked.fallback_rows.sum()) == b and int(plain.fallback_rows.sum()) == 0
    ref = reference(*args)
    assert torch.equal(plain.support_sizes, ref.support_sizes)
    z = x / args[1][:, None]
    lse = torch.logsumexp(z.double(), dim=1)
    want = z.double().gather(1, plain.tokens[:, None]).squeeze(1) - lse
    assert torch.allclose(plain.logprobs.double(), want, atol=1e-5)


@pytest.mark.parametrize("rows_a_block", [1, 3])
def test_row_blocks_do_not_change_results(rows_a_block: int, monkeypatch) -> None:
    """The pass over whole rows goes a block of rows at a time (torch_path.ROW_BLOCK): blocks
    of one or three rows give bit for bit what one block for the whole batch gives, on the
    grid's mixed batch with greedy, plain, bad (NaN, +inf, all -inf) and fallback rows."""
    from maskgate.kernels.cpu import torch_path

    vocab = 1000
    batch = grid_batch(vocab, seed=11)
    x = batch["logits"]
    x[5, 17] = float("nan")
    x[40] = float("-inf")
    x[41, 3] = float("inf")
    plain = slice(60, 63)  # temperatures 1, 0.7, 2: nothing truncates, no mask
    batch["top_k"][plain] = -1
    batch["top_p"][plain] = 1.0
    batch["min_p"][plain] = 0.0
    batch["want_mask"][plain] = False
    monkeypatch.setattr(torch_path, "ROW_BLOCK", 1 << 30)
    whole = run(batch, 64)
    monkeypatch.setattr(torch_path, "ROW_BLOCK", rows_a_block * vocab)
    blocks = run(batch, 64)
    for name in (
        "tokens",
        "support_sizes",
        "nan_rows",
        "fallback_rows",
        "mask_rows",
        "mask_offsets",
        "mask_ids",
        "mask_status",
    ):
        assert torch.equal(getattr(blocks, name), getattr(whole, name)), name
    assert torch.equal(blocks.logprobs.isnan(), whole.logprobs.isnan())
    ok = ~whole.logprobs.isnan()
    assert torch.equal(blocks.logprobs[ok], whole.logprobs[ok])
    assert whole.nan_rows.tolist().count(True) == 3 and whole.nan_rows[[5, 40, 41]].all()
    assert whole.fallback_rows.any() and (batch["temperature"] == 0).any()
    report = check_result(whole, oracle(batch), batch["want_mask"], batch["bounded"], 64)
    assert report.ok, report.errors


def test_top_k_rows_take_a_shorter_first_prefix(monkeypatch) -> None:
    """A batch whose rows all keep at most 50 tokens by top-k lists 64 tokens a row first
    (torch_path._first_tier); ties at the cut (bf16 ties, flat rows) send rows on to the usual
    tiers. Every output equals what the usual first prefix of 512 gives, fallback flags
    included, and matches the oracle."""
    from maskgate.kernels.cpu import torch_path

    batch = grid_batch(5000, seed=21)
    rows = torch.isin(batch["top_k"], torch.tensor([1, 2, 50], dtype=torch.int32)).nonzero()
    batch = {name: t[rows.squeeze(1)] for name, t in batch.items()}
    assert torch_path._first_tier(batch["top_k"].to(torch.int64)) == 64
    short = run(batch, 16)
    monkeypatch.setattr(torch_path, "_first_tier", lambda top_k: None)
    usual = run(batch, 16)
    for name in ("tokens", "logprobs", "support_sizes", "fallback_rows", "mask_offsets"):
        assert torch.equal(getattr(short, name), getattr(usual, name)), name
    assert torch.equal(short.mask_ids, usual.mask_ids)
    assert torch.equal(short.mask_status, usual.mask_status)
    report = check_result(short, oracle(batch), batch["want_mask"], batch["bounded"], 16)
    assert report.ok, report.errors


def test_noise_keys_of_a_few_rows_hash_on_the_host_alike() -> None:
    """Up to HOST_KEY_ROWS rows the noise keys are hashed on Python ints: the same words as
    the tensor hash, for seeds and steps across the whole int64 range."""
    from maskgate.kernels.cpu.torch_path import HOST_KEY_ROWS, noise_keys
    from maskgate.kernels.inputs import check_inputs
    from maskgate.kernels.noise import row_keys

    lo, hi = -(2**63), 2**63 - 1
    seed = torch.tensor([lo, hi, -1, 0, 1, 2**32, -(2**32) - 7, 123456789012345], dtype=torch.int64)
    step = torch.tensor([0, lo, hi, -1, 2**40 + 3, 5, 1 << 62, -(1 << 33)], dtype=torch.int64)
    b = len(seed)
    assert b <= HOST_KEY_ROWS
    ones = torch.ones(b)
    inp = check_inputs(
        torch.zeros(b, 7),
        ones,
        torch.full((b,), -1, dtype=torch.int32),
        ones,
        ones * 0,
        torch.ones(b, dtype=torch.bool),
        max_mask_tokens=4,
        seed=seed,
        step=step,
    )
    host = noise_keys(inp)
    tensor = row_keys(seed, step)
    assert torch.equal(host[0], tensor[0]) and torch.equal(host[1], tensor[1])
    assert host[0].dtype == torch.int64 and bool(((host[0] >= 0) & (host[0] < 2**32)).all())


def test_plain_row_draw_keeps_every_token_that_can_win() -> None:
    """Plain rows without a mask give noise only to tokens that could still beat the row's top
    token (draw_whole). A row built so that the token with the largest noise wins from about 14
    nats below the top, by a hair, draws it, as the tiers (noise on every token of S) do."""
    from maskgate.kernels.noise import gumbel, row_keys

    vocab, b = 50000, 4
    seed = torch.arange(b, dtype=torch.int64) * 31 + 5
    step = torch.full((b,), 2, dtype=torch.int64)
    k0, k1 = row_keys(seed, step)
    g = gumbel(k0[:, None], k1[:, None], torch.arange(vocab).expand(b, vocab))
    x = torch.full((b, vocab), -40.0)
    for r in range(b):
        top = int(g[r].argmin())  # the top token gets the smallest noise of its row
        deep = int(g[r].argmax())  # the largest noise, about log(V) + 0.5 above 0
        x[r, top] = 0.0
        margin = 1e-3 if r % 2 == 0 else -1e-3  # wins, or loses, by a hair
        x[r, deep] = float(g[r, top] - g[r, deep]) + margin
    assert float(x.amax(dim=1).sub(x.topk(2, dim=1).values[:, 1]).min()) > 8
    args = (
        x,
        torch.ones(b),
        torch.full((b,), -1, dtype=torch.int32),
        torch.ones(b),
        torch.zeros(b),
    )
    kw = {
        "max_mask_tokens": 8,
        "seed": seed,
        "step": step,
        "bounded": torch.ones(b, dtype=torch.bool),
    }
    plain = kernels.sample(*args, torch.zeros(b, dtype=torch.bool), **kw)
    masked = kernels.sample(*args, torch.ones(b, dtype=torch.bool), **kw)
    assert torch.equal(plain.tokens, masked.tokens)
    deep_won = plain.tokens == g.argmax(dim=1)
    assert deep_won.tolist() == [True, False, True, False]
    assert torch.allclose(plain.logprobs, masked.logprobs, atol=1e-5)
