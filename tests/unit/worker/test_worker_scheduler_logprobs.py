"""The scheduler's raw log-prob plumbing against a fake runner: which prompt positions each
prefill chunk scores, output log-probs and top lists committed per token, and prompt scoring
with max_new_tokens 0.

The fake runner scores prompt target t with -t and a sampled token y with -y / 10, so the
sequences' lists show exactly which rows and targets were asked for.
"""

from __future__ import annotations

import dataclasses

from maskgate.worker.engine.batch import RowResult, RowWork, SamplingParams, StepStats
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import Sequence, StopRule
from tests.unit.worker.test_worker_scheduler_prefix import finish


class ScoringRunner:
    vocab_size = 100
    max_num_slots = 4
    max_model_len = 64
    eos_token_ids = frozenset({0})

    def __init__(self) -> None:
        self.steps: list[list[RowWork]] = []

    def run(self, rows: list[RowWork]) -> tuple[list[RowResult | None], StepStats]:
        self.steps.append([dataclasses.replace(r) for r in rows])
        out: list[RowResult | None] = []
        for r in rows:
            res = None
            if r.sample:
                y = r.token_ids[-1] % 90 + 1
                res = RowResult(token=y, logprob=-0.5)
                if r.want_logprob:
                    res.raw_logprob = -y / 10
                    if r.top_logprobs:
                        res.top = [(-0.1, y)] * r.top_logprobs
            if r.prompt_targets:
                if res is None:
                    res = RowResult(token=-1, logprob=float("nan"))
                res.prompt_logprobs = [-float(t) for t in r.prompt_targets]
                res.prompt_top = [[(-1.0, t)] for t in r.prompt_targets] if r.top_logprobs else None
            out.append(res)
        return out, StepStats(num_rows=len(rows))

    def release(self, slot: int) -> None:
        pass


def seq(prompt: list[int], max_new: int, *, start: int, top: int = 0) -> Sequence:
    return Sequence(
        rid="r",
        prompt_ids=prompt,
        params=SamplingParams(temperature=0.0),
        rule=StopRule(max_new, ignore_eos=True),
        want_logprob=True,
        top_logprobs=top,
        logprob_start=start,
    )


def make(budget: int) -> tuple[Scheduler, ScoringRunner]:
    runner = ScoringRunner()
    sched = Scheduler(runner, max_num_seqs=4, max_prefill_tokens=budget, max_mask_tokens=4)
    return sched, runner


def test_chunked_prefill_scores_every_prompt_position_once() -> None:
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    sched, runner = make(budget=4)  # chunks [0, 4), [4, 8), [8, 10)
    s = seq(prompt, 3, start=2, top=2)
    sched.add(s)
    finish(sched, runner)
    # Positions 2..8 score tokens 3..9; position 9 (the last) scores the first output token.
    assert s.input_logprobs == [-float(t) for t in prompt[3:]]
    assert len(s.input_top) == len(prompt) - 3
    chunks = [r for step in runner.steps for r in step if len(r.token_ids) > 1]
    assert [(c.start_pos, c.prompt_from, c.prompt_targets) for c in chunks] == [
        (0, 2, [13, 14]),
        (4, 0, [15, 16, 17, 18]),
        (8, 0, [19]),
    ]
    assert len(s.output_ids) == 3
    assert s.raw_logprobs == [-y / 10 for y in s.output_ids]
    assert all(len(t) == 2 for t in s.top)


def test_output_only_requests_score_no_prompt() -> None:
    sched, runner = make(budget=16)
    s = seq([5, 6, 7], 2, start=-1)
    sched.add(s)
    finish(sched, runner)
    assert s.input_logprobs == [] and s.top == []
    assert all(r.prompt_targets is None for step in runner.steps for r in step)
    assert len(s.raw_logprobs) == 2


def test_max_new_tokens_zero_scores_the_prompt_only() -> None:
    sched, runner = make(budget=16)
    s = seq([5, 6, 7, 8], 0, start=0)
    sched.add(s)
    assert not s.is_finished  # it must prefill to be scored
    finish(sched, runner)
    assert s.finish_reason == "length" and s.output_ids == [] and s.raw_logprobs == []
    assert s.input_logprobs == [-6.0, -7.0, -8.0]
    plain = seq([5, 6], 0, start=-1)
    sched.add(plain)
    assert plain.is_finished  # nothing to score: finished without running
