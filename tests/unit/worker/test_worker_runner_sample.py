"""ModelRunner.run: sampling through kernels.sample, converted to per-row RowResults."""

from __future__ import annotations

import pytest
import torch

from maskgate.worker.engine.batch import RowWork, SamplingParams
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.runner.runner import ModelRunner

PROMPT = [17, 250, 33, 401, 92, 5, 64]


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load("tiny-random")


def prefill(slot: int, params: SamplingParams, **kw: object) -> RowWork:
    return RowWork(slot, PROMPT, 0, sample=True, params=params, **kw)  # type: ignore[arg-type]


def test_results_follow_the_mask_semantics(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=4, max_model_len=64)
    logits = runner.logits([prefill(3, SamplingParams())])[0]
    rows = [
        prefill(0, SamplingParams(temperature=0.0), want_mask=True),
        prefill(1, SamplingParams(temperature=0.7, top_k=20, top_p=0.9), want_mask=True),
        prefill(2, SamplingParams(temperature=1.0, top_p=0.8)),
        RowWork(3, [1, 2], 0, sample=False),
    ]
    results, stats = runner.run(rows)
    greedy, masked, plain, skipped = results
    assert skipped is None
    assert stats.num_rows == 4 and stats.num_tokens == 3 * len(PROMPT) + 2
    assert stats.mask_seconds > 0

    assert greedy is not None and masked is not None and plain is not None
    assert greedy.token == int(logits.argmax()) and greedy.mask == [greedy.token]
    assert greedy.logprob == 0.0 and greedy.support_size == 1

    assert masked.mask is not None and masked.mask_status == 0
    assert 1 < len(masked.mask) <= 20 and masked.support_size == len(masked.mask)
    assert masked.token in masked.mask and masked.mask[0] == greedy.token
    z = logits / torch.tensor(0.7)
    expect = z[masked.token] - torch.logsumexp(z[torch.tensor(masked.mask)], 0)
    assert masked.logprob == pytest.approx(float(expect), abs=1e-5)

    assert plain.mask is None and plain.support_size == 0 and plain.logprob <= 0


def test_seeded_draws_do_not_depend_on_the_batch(tiny: LoadedModel) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    alone = ModelRunner(tiny, max_num_slots=4, max_model_len=64)
    (a,), _ = alone.run([prefill(0, params, step=3)])
    crowded = ModelRunner(tiny, max_num_slots=4, max_model_len=64)
    others = [prefill(s, SamplingParams(top_k=5)) for s in (0, 1)]
    results, _ = crowded.run([*others, prefill(2, params, step=3)])
    assert a is not None and results[2] is not None
    # Batched matmuls round differently, so the log-prob agrees to float32 tolerance only.
    assert results[2].token == a.token
    assert results[2].logprob == pytest.approx(a.logprob, abs=1e-4)


def test_overflow_in_exact_mode_and_truncation_in_bounded_mode(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=64, max_mask_tokens=4)
    wide = SamplingParams(temperature=1.0, top_p=0.999)
    exact, bounded = runner.run(
        [prefill(0, wide, want_mask=True), prefill(1, wide, want_mask=True, bounded=True)]
    )[0]
    assert exact is not None and bounded is not None
    assert exact.mask is None and exact.mask_status == 1 and exact.support_size > 4
    assert bounded.mask is not None and bounded.mask_status == 2
    assert len(bounded.mask) == 4 and bounded.token in bounded.mask
    assert bounded.support_size == exact.support_size
