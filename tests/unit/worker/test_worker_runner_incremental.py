"""The runner's incremental paths give the logits of a full forward.

Several sequences share steps in different KV slots: chunked prefill, prefill rows of
different lengths padded into one attention call, and decode rows, interleaved. Every logits
row is compared with a fresh full prefill of the same prefix.
"""

from __future__ import annotations

import pytest
import torch

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.runner.runner import ModelRunner

ATOL = 1e-4


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load("tiny-random")


def full_logits(runner: ModelRunner, prefix: list[int]) -> torch.Tensor:
    """Last-position logits of one prefill of `prefix` in the last slot."""
    row = RowWork(slot=runner.max_num_slots - 1, token_ids=prefix, start_pos=0, sample=True)
    return runner.logits([row])[0]


def test_interleaved_prefill_chunks_and_decodes_match_full_forward(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=5, max_model_len=128)
    gen = torch.Generator().manual_seed(11)
    seqs = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (30, 17, 12, 9)]
    # Sequence 0: chunks of 8; 1: one token per step from the start; 2: chunks of 3 (a short
    # prefill row next to a longer one); 3: whole prompt of 5 at once, then decodes.
    plans = [
        [(s, min(s + 8, 30)) for s in range(0, 30, 8)],
        [(s, s + 1) for s in range(17)],
        [(s, s + 3) for s in range(0, 12, 3)],
        [(0, 5)] + [(s, s + 1) for s in range(5, 9)],
    ]
    step = 0
    checked = 0
    while any(step < len(p) for p in plans):
        rows, expect = [], []
        for slot, (seq, plan) in enumerate(zip(seqs, plans, strict=True)):
            if step < len(plan):
                start, end = plan[step]
                # Row 1 skips sampling on even steps: rows with sample=False still feed K/V.
                sample = slot != 1 or step % 2 == 1
                rows.append(RowWork(slot, seq[start:end], start, sample=sample))
                if sample:
                    expect.append(seq[:end])
        got = runner.logits(rows)
        assert got.shape == (len(expect), 512)
        for out, prefix in zip(got, expect, strict=True):
            torch.testing.assert_close(out, full_logits(runner, prefix), atol=ATOL, rtol=0)
            checked += 1
        step += 1
    assert checked == 4 + 8 + 4 + 5


def test_a_reused_slot_ignores_the_previous_sequence(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=64)
    runner.logits([RowWork(0, list(range(10, 50)), 0, sample=True)])
    runner.release(0)
    short = [7, 8, 9]
    got = runner.logits([RowWork(0, short, 0, sample=True)])[0]
    torch.testing.assert_close(got, full_logits(runner, short), atol=ATOL, rtol=0)


def test_bad_rows_are_rejected_with_a_clear_error(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=16)
    with pytest.raises(ValueError, match="slot 2 outside"):
        runner.run([RowWork(2, [1], 0, sample=True)])
    with pytest.raises(ValueError, match="positions"):
        runner.run([RowWork(0, [1, 2], 15, sample=True)])
    with pytest.raises(ValueError, match="token id outside"):
        runner.run([RowWork(0, [512], 0, sample=True)])
    with pytest.raises(ValueError, match="share a KV slot"):
        runner.run([RowWork(0, [1], 0, sample=True), RowWork(0, [2], 1, sample=True)])


def test_kv_budget_sets_the_slot_count(tiny: LoadedModel) -> None:
    # tiny-random: 2 layers x 2 kv heads x 16 dims x K and V x 4 bytes = 512 bytes per token.
    per_slot = 512 * 64
    runner = ModelRunner(tiny, max_num_slots=100, max_model_len=64, kv_cache_bytes=11 * per_slot)
    assert runner.max_num_slots == 10  # one slot of the budget is the scratch slot
    assert ModelRunner(tiny, max_num_slots=4, max_model_len=64).max_num_slots == 4
    with pytest.raises(ValueError, match="holds no sequence"):
        ModelRunner(tiny, max_model_len=64, kv_cache_bytes=per_slot)
    with pytest.raises(ValueError, match="max_model_len"):
        ModelRunner(tiny, max_model_len=10**6)


def test_a_slot_that_produced_nan_is_cleaned_on_release(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=64)
    runner.run([RowWork(0, list(range(10, 40)), 0, sample=True)])
    runner.kv.v[0, 0, :, 20] = float("nan")  # as if the sequence had blown up at position 20
    (bad,), _ = runner.run([RowWork(0, [5], 30, sample=True)])
    assert bad is not None and bad.nan
    runner.release(0)
    # The next sequence in the slot is shorter: the decode reads stale positions past it.
    short = [7, 8, 9]
    runner.logits([RowWork(0, short[:2], 0, sample=False)])
    got = runner.logits([RowWork(0, short[2:], 2, sample=True), RowWork(1, [3], 40, sample=True)])
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[0], full_logits(runner, short), atol=ATOL, rtol=0)
