"""The sampler warm-up's plan: which batch sizes compile every variant of kernels.sample.

The calls themselves compile Triton kernels only on CUDA; here the plan is checked against
kernels' own band_config and with a recording sampler on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from maskgate import kernels
from maskgate.kernels.triton.config import band_config
from maskgate.worker.engine.batch import RowWork
from maskgate.worker.runner.row_sampling import (
    LOGITS_DTYPE,
    SMALL_BATCHES,
    warm_up_batches,
    warm_up_sampler,
)
from maskgate.worker.runner.runner import ModelRunner


@pytest.mark.parametrize(
    ("vocab", "max_batch"),
    [(151936, 256), (151936, 200), (128256, 256), (32000, 1024), (49152, 99), (257, 1)],
)
def test_warm_up_batches_meet_every_pass1_config(vocab: int, max_batch: int) -> None:
    batches = warm_up_batches(vocab, max_batch)
    assert batches == sorted(set(batches)) and batches[0] == 1 and batches[-1] == max_batch
    every = range(1, max_batch + 1)
    configs = {band_config(vocab, batch=b) for b in every}
    assert {band_config(vocab, batch=b) for b in batches} == configs
    assert len(batches) <= len(configs) + 1  # one size per config, and max_batch


def test_warm_up_batches_for_qwen_vocab_at_256_rows() -> None:
    batches = warm_up_batches(151936, 256)
    configs = {band_config(151936, batch=b) for b in range(1, 257)}
    assert 2 <= len(configs) <= 8  # pass 1 changes segment size with the batch
    assert len(batches) <= 10
    assert batches[0] == 1 and batches[-1] == 256


def test_warm_up_calls_kernels_sample_keyed_at_every_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, bool]] = []  # (rows, all rows ask for masks)

    def recording_sample(logits: torch.Tensor, *args: Any, **kw: Any) -> None:
        assert logits.dtype == LOGITS_DTYPE  # the dtype warm_up_batches planned for
        # keyed, as RowSampler always calls it: the unseeded variant is never compiled
        assert kw["seed"] is not None and kw["step"] is not None
        want = args[4]
        calls.append((logits.shape[0], bool(want.all())))

    monkeypatch.setattr(kernels, "sample", recording_sample)
    vocab, max_batch = 32000, 64
    warm_up_sampler(kernels.sample, vocab, torch.device("cpu"), 4096, max_batch)
    for b in warm_up_batches(vocab, max_batch):  # pass 1 with and without the race
        assert {(b, True), (b, False)} <= set(calls)
    for b in SMALL_BATCHES:
        assert {(b, True), (b, False)} <= set(calls)
    assert len(calls) == len(set(calls))  # nothing compiled twice for nothing


def test_warm_up_of_the_baseline_still_compiles_kernels_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sort_all_rows sends mask-free batches to kernels.sample, at any batch size.
    baseline: list[int] = []
    kernel: list[int] = []
    monkeypatch.setattr(kernels, "sample", lambda x, *a, **k: kernel.append(x.shape[0]))
    warm_up_sampler(
        lambda x, *a, **k: baseline.append(x.shape[0]), 1000, torch.device("cpu"), 64, 48
    )
    assert sorted(set(baseline)) == sorted(SMALL_BATCHES)
    assert sorted(set(kernel)) == warm_up_batches(1000, 48)


def test_the_runner_samples_logits_of_the_planned_dtype() -> None:
    runner = ModelRunner("tiny-random", max_num_slots=2, max_model_len=32)
    logits = runner.logits([RowWork(0, [5, 6, 7], 0, sample=True)])
    assert logits.dtype == LOGITS_DTYPE
