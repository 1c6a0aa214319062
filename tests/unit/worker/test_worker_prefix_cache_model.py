"""The prefix cache over the real tiny-random model on the CPU: tokens, masks and seeded
samples are identical with the cache on and off, with a KV budget so small that cached slots
are evicted all the time, and log-probs (raw and of the prompt) agree to float32 rounding.

Log-probs are not bitwise equal: with the cache a sibling's last prompt token runs as a
one-token row over copied K/V rather than as the end of a long prefill row, and the step
batches differ (a sibling waits a step), so reductions run in another order. Batch
composition alone does the same without the cache (the group leaders below, which copy
nothing, differ by ~1e-6 in their later tokens too)."""

from __future__ import annotations

import pytest

from maskgate.worker.engine.batch import SamplingParams
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import Sequence, StopRule
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.runner.runner import ModelRunner

SLOTS = 3
ROUNDING = 2e-5  # float32 log-probs of order 1, summed over a few hundred terms


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load("tiny-random")


def workload() -> list[Sequence]:
    """Groups of 3 seeded samples of one prompt (GRPO), some prompts sharing a long system
    prefix, one scoring its prompt; more sequences than slots."""
    system = [(i * 37) % 500 + 7 for i in range(24)]
    prompts = [[*system, 11, 12, 13], [5, 6, 7, 8, 9, 10], [*system, 14], [*system, 11, 12, 99]]
    seqs = []
    for p, prompt in enumerate(prompts):
        for j in range(3):
            seq = Sequence(
                f"r{p}-{j}",
                prompt,
                SamplingParams(temperature=0.9, top_p=0.9, seed=1000 * p + j),
                StopRule(6, ignore_eos=True),
                want_mask=True,
                want_logprob=True,
                top_logprobs=2,
                logprob_start=20 if p == 3 else -1,
            )
            seqs.append(seq)
    return seqs


def run(tiny: LoadedModel, *, cache: bool) -> tuple[list[Sequence], int]:
    runner = ModelRunner(tiny, max_num_slots=SLOTS, max_model_len=64)
    sched = Scheduler(
        runner, max_num_seqs=SLOTS, max_prefill_tokens=64, max_mask_tokens=4096, prefix_cache=cache
    )
    seqs = workload()
    for s in seqs:
        sched.add(s)
    fed = 0
    for _ in range(200):
        if not sched.has_work():
            return seqs, fed
        batch = sched.schedule()
        fed += sum(len(r.token_ids) for _, r in batch)
        results, _ = runner.run([r for _, r in batch])
        sched.postprocess(batch, results)
    raise AssertionError("did not finish")


def test_outputs_are_the_same_with_the_cache_on_and_off(tiny: LoadedModel) -> None:
    off, fed_off = run(tiny, cache=False)
    on, fed_on = run(tiny, cache=True)
    for a, b in zip(off, on, strict=True):
        assert a.finish_reason == b.finish_reason == "length"
        assert a.output_ids == b.output_ids
        assert [list(m) for m in a.masks] == [list(m) for m in b.masks]
        assert a.logprobs == pytest.approx(b.logprobs, abs=ROUNDING)
        assert a.raw_logprobs == pytest.approx(b.raw_logprobs, abs=ROUNDING)
        assert a.input_logprobs == pytest.approx(b.input_logprobs, abs=ROUNDING)
        for tops_a, tops_b in ((a.top, b.top), (a.input_top, b.input_top)):
            assert [[i for _, i in t] for t in tops_a] == [[i for _, i in t] for t in tops_b]
            flat_a = [lp for t in tops_a for lp, _ in t]
            assert flat_a == pytest.approx([lp for t in tops_b for lp, _ in t], abs=ROUNDING)
    assert all(s.num_cached == 0 for s in off)
    assert sum(s.num_cached for s in on) > 0
    assert fed_on < fed_off
