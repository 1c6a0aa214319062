"""ModelRunner.run: raw-distribution log-probs of sampled tokens and of prompt tokens, checked
against a float64 log_softmax of the same model's logits."""

from __future__ import annotations

import pytest
import torch

from maskgate.worker.engine.batch import RowWork, SamplingParams
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.runner.runner import ModelRunner

PROMPT = [17, 250, 33, 401, 92, 5, 64, 300, 12]


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load("tiny-random")


def full_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] float64 at every position (the last slot, scratch for this)."""
    slot = runner.max_num_slots - 1
    rows = [RowWork(slot, ids[: i + 1], 0, sample=True) for i in range(len(ids))]
    out = []
    for r in rows:  # each prefix as its own prefill: the logits of its last position
        out.append(runner.logits([r])[0])
    return torch.stack(out).double()


def test_sampled_token_logprobs_match_float64(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=5, max_model_len=64)
    ref = full_logits(runner, PROMPT)[-1]
    rows = [
        RowWork(0, PROMPT, 0, True, SamplingParams(temperature=0.0), want_logprob=True),
        RowWork(
            1,
            PROMPT,
            0,
            True,
            SamplingParams(temperature=0.7, top_p=0.9, seed=3),
            want_mask=True,
            want_logprob=True,
            top_logprobs=4,
        ),
        RowWork(2, PROMPT, 0, True, SamplingParams(temperature=1.3, seed=5)),  # asks nothing
        RowWork(3, PROMPT, 0, True, SamplingParams(temperature=1.3, seed=5), want_logprob=True),
    ]
    greedy, masked, plain, sampled = runner.run(rows)[0]
    assert greedy is not None and masked is not None and plain is not None
    assert sampled is not None
    assert plain.raw_logprob is None and plain.top is None
    # Greedy: T = 1 (SGLang's choice for greedy rows).
    lp1 = torch.log_softmax(ref, 0)
    assert greedy.token == int(ref.argmax())
    assert greedy.raw_logprob == pytest.approx(float(lp1[greedy.token]), abs=1e-4)
    lp07 = torch.log_softmax(ref / 0.7, 0)
    assert masked.raw_logprob == pytest.approx(float(lp07[masked.token]), abs=1e-4)
    # The mask log-prob is over the truncated support: never below the raw one.
    assert masked.raw_logprob is not None and masked.logprob >= masked.raw_logprob - 1e-6
    assert masked.top is not None and len(masked.top) == 4
    want = torch.topk(lp07, 4)
    assert [i for _, i in masked.top] == want.indices.tolist()
    assert [v for v, _ in masked.top] == pytest.approx(want.values.tolist(), abs=1e-4)
    lp13 = torch.log_softmax(ref / 1.3, 0)
    assert sampled.token == plain.token  # same seed: asking costs no change in the draw
    assert sampled.raw_logprob == pytest.approx(float(lp13[sampled.token]), abs=1e-4)


def test_prompt_logprobs_over_chunks(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=3, max_model_len=64)
    ref = torch.log_softmax(full_logits(runner, PROMPT), 1)  # [n, V]
    expect = [float(ref[p, PROMPT[p + 1]]) for p in range(len(PROMPT) - 1)]
    # Two chunks: positions 0..3 (not sampling) then 4..8; the last position scores nothing.
    first = RowWork(0, PROMPT[:4], 0, False, prompt_from=0, prompt_targets=PROMPT[1:5])
    first.top_logprobs = 3
    (a,), _ = runner.run([first])
    assert a is not None and a.token == -1
    second = RowWork(
        0, PROMPT[4:], 4, True, want_logprob=True, prompt_from=0, prompt_targets=PROMPT[5:]
    )
    (b,), _ = runner.run([second])
    assert b is not None and b.token >= 0 and b.raw_logprob is not None
    got = [*(a.prompt_logprobs or []), *(b.prompt_logprobs or [])]
    assert got == pytest.approx(expect, abs=1e-4)
    assert a.prompt_top is not None and len(a.prompt_top) == 4
    assert [i for _, i in a.prompt_top[0]] == torch.topk(ref[0], 3).indices.tolist()
    assert b.prompt_top is None  # top_logprobs 0 on that row


def test_rows_that_ask_nothing_get_nothing(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=64)
    (r, skipped), _ = runner.run([RowWork(0, PROMPT, 0, True), RowWork(1, PROMPT[:3], 0, False)])
    assert r is not None and r.raw_logprob is None and r.prompt_logprobs is None
    assert skipped is None


def test_prompt_targets_past_the_row_are_refused(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=64)
    with pytest.raises(ValueError, match="prompt_targets"):
        runner.run([RowWork(0, PROMPT[:3], 0, False, prompt_from=1, prompt_targets=[1, 2, 3])])


def test_logprob_ids_match_float64_at_output_and_prompt(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=4, max_model_len=64)
    ref = full_logits(runner, PROMPT)
    ids = (3, 401, 3, 0)
    rows = [
        RowWork(0, PROMPT, 0, True, SamplingParams(temperature=0.7, seed=1), want_logprob=True),
        RowWork(
            1,
            PROMPT,
            0,
            True,
            SamplingParams(temperature=0.7, seed=1),
            want_logprob=True,
            top_logprobs=2,
            logprob_ids=ids,
        ),
        RowWork(2, PROMPT[:4], 0, False, prompt_targets=PROMPT[1:5], logprob_ids=ids[:1]),
    ]
    plain, asked, chunk = runner.run(rows)[0]
    assert plain is not None and asked is not None and chunk is not None
    assert plain.ids_logprobs is None and asked.token == plain.token
    lp07 = torch.log_softmax(ref[-1] / 0.7, 0)
    assert asked.ids_logprobs == pytest.approx([float(lp07[i]) for i in ids], abs=1e-4)
    assert asked.top is not None and len(asked.top) == 2  # the columns before stay in place
    lp1 = torch.log_softmax(ref[:4], 1)  # prompt positions: T = 1
    assert chunk.prompt_ids_logprobs is not None
    assert [v for (v,) in chunk.prompt_ids_logprobs] == pytest.approx(
        [float(lp1[p, 3]) for p in range(4)], abs=1e-4
    )
