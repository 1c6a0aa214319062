"""RowSampler (maskgate/worker/runner/row_sampling.py): per-row parameters to kernels.sample
and its outputs back to RowResults, held to a plain reference call of kernels.sample (one
tensor per argument, built from the rows) that the buffer reuse, the single parameter copy and
the packed copy back must not change."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from row_results import ListedSampler

from maskgate import kernels
from maskgate.kernels.result import STATUS_OVERFLOW
from maskgate.worker.engine.batch import RowResult, RowWork, SamplingParams

VOCAB = 300
CAP = 64  # max_mask_tokens: small enough that wide rows overflow
CPU = torch.device("cpu")
# The plain_sample fixture (tests/conftest.py): kernels.sample called the plain way.
PlainSample = Callable[..., list[RowResult]]


# (params, want_mask, bounded): greedy, each filter alone and combined, wide rows that
# overflow CAP in exact and in bounded mode.
KINDS = [
    (SamplingParams(temperature=0.0), True, False),
    (SamplingParams(temperature=0.8, top_k=20), True, False),
    (SamplingParams(temperature=1.0, top_p=0.9), True, False),
    (SamplingParams(temperature=1.3, min_p=0.05), False, False),
    (SamplingParams(temperature=0.7, top_k=50, top_p=0.8, min_p=0.01), True, False),
    (SamplingParams(temperature=1.0, top_p=0.999), True, False),
    (SamplingParams(temperature=1.0, top_p=0.999), True, True),
    (SamplingParams(temperature=1.0, top_k=10), False, True),
]


def make_rows(n: int, seeded: bool | None, salt: int = 0) -> list[RowWork]:
    """n rows cycling through KINDS; seeded: all, none (False) or every other row (None)."""
    rows = []
    for i in range(n):
        params, want, bounded = KINDS[(i + salt) % len(KINDS)]
        if seeded or (seeded is None and i % 2 == 0):
            params = SamplingParams(
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                min_p=params.min_p,
                seed=1000 + 7 * i + salt,
            )
        rows.append(RowWork(i, [1], 5, True, params, want_mask=want, bounded=bounded, step=i))
    return rows


def make_logits(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, VOCAB, generator=g) * 3.0
    x[:, :4] = x[:, :1]  # ties: the order breaks them by id
    x[:, 10:20] = float("-inf")
    return x


def seeds_of(rows: list[RowWork]) -> list[int]:
    seeds = [r.params.seed for r in rows]
    assert all(s is not None for s in seeds)
    return seeds  # type: ignore[return-value]


class Spy:
    """A sample_fn that records its arguments and the keys it was given, then samples."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kw: Any) -> Any:
        names = ("logits", "temperature", "top_k", "top_p", "min_p", "want_mask")
        call = {**dict(zip(names, args, strict=True)), **kw}
        self.calls.append(
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.items()}
        )
        self.last_args = call
        return kernels.sample(*args, **kw)


def keys_of(spy: Spy) -> list[int] | None:
    seed = spy.calls[-1]["seed"]
    return None if seed is None else seed.tolist()


@pytest.mark.parametrize("batch", [1, 2, 5, 16, 17, 40])
def test_seeded_rows_match_the_reference_and_each_other_across_batches(
    batch: int, plain_sample: PlainSample
) -> None:
    rows = make_rows(batch, seeded=True)
    logits = make_logits(batch)
    got, seconds, fallback = ListedSampler(kernels.sample, CPU, CAP).sample(logits, rows)
    want = plain_sample(logits, rows, CAP, seeds_of(rows))
    assert got == want
    assert seconds >= 0 and fallback == 0
    # Batch invariance: each row alone draws exactly what it drew in the batch.
    alone = ListedSampler(kernels.sample, CPU, CAP)
    for i in range(batch):
        (one,), _, _ = alone.sample(logits[i : i + 1], [rows[i]])
        assert one == got[i], i


def test_statuses_and_sizes_cover_every_kind() -> None:
    rows = make_rows(len(KINDS), seeded=True)
    got, _, _ = ListedSampler(kernels.sample, CPU, CAP).sample(make_logits(len(KINDS)), rows)
    greedy, topk, _, no_mask, _, exact_wide, bounded_wide, bounded_no_mask = got
    assert greedy.mask == [greedy.token] and greedy.logprob == 0.0 and greedy.support_size == 1
    assert topk.mask is not None and len(topk.mask) == topk.support_size == 20
    assert no_mask.mask is None and no_mask.support_size == 0 and no_mask.mask_status == 0
    assert exact_wide.mask is None and exact_wide.mask_status == STATUS_OVERFLOW
    assert exact_wide.support_size > CAP
    assert bounded_wide.mask_status == 2 and bounded_wide.mask is not None
    assert len(bounded_wide.mask) == CAP and bounded_wide.token in bounded_wide.mask
    assert bounded_no_mask.mask is None and bounded_no_mask.mask_status == 0
    assert all(isinstance(r.token, int) and isinstance(r.nan, bool) for r in got)


def test_unseeded_batches_are_keyed_from_the_random_module(plain_sample: PlainSample) -> None:
    # Every call is keyed, so the sampler runs one variant (no unseeded compile, no device
    # random draw); an unseeded batch's keys are fresh 63-bit values from `random`.
    rows = make_rows(9, seeded=False)
    logits = make_logits(9, seed=3)
    spy = Spy()
    random.seed(7)
    got, _, _ = ListedSampler(spy, CPU, CAP).sample(logits, rows)
    keys = keys_of(spy)
    random.seed(7)
    assert keys == [random.getrandbits(63) for _ in rows]
    assert spy.calls[-1]["step"].tolist() == [r.step for r in rows]
    assert got == plain_sample(logits, rows, CAP, keys)


def test_mixed_batches_keep_seeded_draws_and_give_unseeded_rows_fresh_keys(
    plain_sample: PlainSample,
) -> None:
    rows = make_rows(12, seeded=None)
    logits = make_logits(12, seed=5)
    spy = Spy()
    sampler = ListedSampler(spy, CPU, CAP)
    got, _, _ = sampler.sample(logits, rows)
    first = keys_of(spy)
    sampler.sample(logits, rows)
    second = keys_of(spy)
    assert first is not None and second is not None
    assert spy.calls[-1]["step"].tolist() == [r.step for r in rows]
    for i, r in enumerate(rows):
        if r.params.seed is not None:
            assert first[i] == second[i] == r.params.seed
        else:
            assert 0 <= first[i] < 2**63 and 0 <= second[i] < 2**63
            assert first[i] != second[i]
    # Seeded rows draw what they draw in an all-seeded batch (the keys of the others aside).
    want = plain_sample(logits, rows, CAP, first)
    assert got == want
    alone = [r for r in rows if r.params.seed is not None]
    idx = [i for i, r in enumerate(rows) if r.params.seed is not None]
    only, _, _ = ListedSampler(kernels.sample, CPU, CAP).sample(logits[idx], alone)
    assert only == [got[i] for i in idx]


def test_unseeded_keys_come_from_the_random_module() -> None:
    rows = make_rows(4, seeded=None)
    spy = Spy()
    random.seed(99)
    ListedSampler(spy, CPU, CAP).sample(make_logits(4), rows)
    random.seed(99)
    fresh = [random.getrandbits(63) for r in rows if r.params.seed is None]
    keys = keys_of(spy)
    assert keys is not None
    assert [k for k, r in zip(keys, rows, strict=True) if r.params.seed is None] == fresh


def test_want_mask_mixes(plain_sample: PlainSample) -> None:
    logits = make_logits(6, seed=8)
    base = make_rows(6, seeded=True)
    for pattern in ([False] * 6, [True] * 6, [True, False] * 3, [False] * 5 + [True]):
        rows = [
            RowWork(r.slot, r.token_ids, r.start_pos, True, r.params, want, r.bounded, r.step)
            for r, want in zip(base, pattern, strict=True)
        ]
        got, _, _ = ListedSampler(kernels.sample, CPU, CAP).sample(logits, rows)
        assert got == plain_sample(logits, rows, CAP, seeds_of(rows))
        assert [r.mask is not None or r.mask_status != 0 for r in got] == pattern


def test_one_sampler_reused_over_changing_batches(plain_sample: PlainSample) -> None:
    """Buffers grow and are rewritten in place: no value of an earlier step leaks."""
    spy = Spy()
    sampler = ListedSampler(spy, CPU, CAP)
    for step, (n, seeded) in enumerate([(3, True), (1, False), (40, True), (7, None), (2, True)]):
        rows = make_rows(n, seeded=seeded, salt=step)
        logits = make_logits(n, seed=step)
        torch.manual_seed(step)
        got, _, _ = sampler.sample(logits, rows)
        torch.manual_seed(step)
        assert got == plain_sample(logits, rows, CAP, keys_of(spy)), (n, seeded)
        args = spy.calls[-1]
        assert args["temperature"].tolist() == pytest.approx([r.params.temperature for r in rows])
        assert args["bounded"].tolist() == [r.bounded for r in rows]
        assert args["want_mask"].tolist() == [r.want_mask for r in rows]


@pytest.mark.parametrize("batch", [1, 3, 16, 33])
def test_arguments_have_the_sampler_dtypes_and_aligned_pointers(batch: int) -> None:
    spy = Spy()
    ListedSampler(spy, CPU, CAP).sample(make_logits(batch), make_rows(batch, seeded=True))
    args = spy.last_args
    dtypes = {
        "temperature": torch.float32,
        "top_p": torch.float32,
        "min_p": torch.float32,
        "top_k": torch.int32,
        "seed": torch.int64,
        "step": torch.int64,
        "bounded": torch.bool,
        "want_mask": torch.bool,
    }
    for name, dtype in dtypes.items():
        t = args[name]
        assert t.dtype == dtype and t.shape == (batch,) and t.is_contiguous(), name
        # Triton compiles another kernel variant for pointers not 16-byte aligned.
        assert t.data_ptr() % 16 == 0, name
        assert t.device.type == "cpu"


def test_nan_rows_are_flagged_alone(plain_sample: PlainSample) -> None:
    rows = make_rows(3, seeded=True)
    logits = make_logits(3)
    logits[1, 7] = float("nan")
    got, _, _ = ListedSampler(kernels.sample, CPU, CAP).sample(logits, rows)
    assert [r.nan for r in got] == [False, True, False]
    want = plain_sample(logits, rows, CAP, seeds_of(rows))
    assert math.isnan(got[1].logprob) and math.isnan(want[1].logprob)
    got[1].logprob = want[1].logprob = 0.0  # NaN != NaN
    assert got == want


def test_a_top_k_past_int32_means_off() -> None:
    """top_k >= V is off (docs/design.md, top-k); a value past the int32 range must not wrap."""
    logits = make_logits(1)
    wide = SamplingParams(temperature=1.0, top_k=2**40 + 5, seed=4)
    off = SamplingParams(temperature=1.0, top_k=-1, seed=4)
    sampler = ListedSampler(kernels.sample, CPU, 4096)
    (a,), _, _ = sampler.sample(logits, [RowWork(0, [1], 0, True, wide, want_mask=True)])
    (b,), _, _ = sampler.sample(logits, [RowWork(0, [1], 0, True, off, want_mask=True)])
    assert a == b and a.mask is not None and len(a.mask) == VOCAB - 10


def test_fallback_rows_are_counted() -> None:
    rows = make_rows(5, seeded=True)
    logits = make_logits(5)

    def all_fallback(*args: Any, **kw: Any) -> Any:
        res = kernels.sample(*args, **kw)
        flags = torch.tensor([True, False, True, True, False])
        return type(res)(**{**res.__dict__, "fallback_rows": flags})

    _, _, fallback = ListedSampler(all_fallback, CPU, CAP).sample(logits, rows)
    assert fallback == 3
