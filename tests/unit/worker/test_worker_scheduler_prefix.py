"""The scheduler with the prefix cache, against a fake runner that keeps a real (token-level)
KV cache: each slot records the token written at each position, copies move those records,
and a sampled token is a hash of the slot's content up to the fed position. A wrong copy, a
hole or a stale entry changes the outputs, so "same outputs with the cache on and off" checks
the cache's bookkeeping end to end."""

from __future__ import annotations

from typing import Any

from maskgate.worker.engine.batch import RowResult, RowWork, SamplingParams, StepStats
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import Sequence, StopRule


class KVRunner:
    vocab_size = 97
    eos_token_ids = frozenset({0})

    def __init__(self, slots: int, max_model_len: int = 256) -> None:
        self.max_num_slots = slots
        self.max_model_len = max_model_len
        self.kv: list[list[int | None]] = [[None] * max_model_len for _ in range(slots)]
        self.fed = 0  # prompt tokens fed by prefill rows (a decode row feeds one)
        self.copied = 0
        self.steps = 0

    def run(self, rows: list[RowWork]) -> tuple[list[RowResult | None], StepStats]:
        self.steps += 1
        out: list[RowResult | None] = []
        for r in rows:
            kv = self.kv[r.slot]
            assert None not in kv[: r.start_pos], "a row reads a position nobody wrote"
            kv[r.start_pos : r.start_pos + len(r.token_ids)] = r.token_ids
            if len(r.token_ids) > 1 or not r.sample or r.step == 0:
                self.fed += len(r.token_ids)
            res = None
            if r.sample:
                content = kv[: r.start_pos + len(r.token_ids)]
                h = 7
                for t in content:
                    h = (h * 31 + (t or 0)) % 1_000_003
                res = RowResult(token=1 + (h + 13 * r.step) % 96, logprob=-h / 1e6)
            if r.prompt_targets:
                res = res or RowResult(token=-1, logprob=0.0)
                res.prompt_logprobs = [-float(t) for t in r.prompt_targets]
            out.append(res)
        return out, StepStats(num_rows=len(rows))

    def copy_kv(self, copies: list[tuple[int, int, int, int]]) -> None:
        for src, dst, start, end in copies:
            assert None not in self.kv[src][start:end], "copied an unwritten position"
            self.kv[dst][start:end] = self.kv[src][start:end]
            self.copied += end - start

    def release(self, slot: int) -> None:
        pass


def make_seq(rid: str, prompt: list[int], max_new: int = 4, start: int = -1) -> Sequence:
    return Sequence(
        rid,
        prompt,
        SamplingParams(temperature=0.0),
        StopRule(max_new, ignore_eos=True),
        logprob_start=start,
    )


def run(
    prompts: list[list[int]], *, cache: bool, slots: int = 16, budget: int = 512, **kw: int
) -> tuple[list[Sequence], KVRunner]:
    runner = KVRunner(slots)
    sched = Scheduler(
        runner, max_num_seqs=slots, max_prefill_tokens=budget, max_mask_tokens=4, prefix_cache=cache
    )
    seqs = [make_seq(f"r{i}", p, **kw) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    finish(sched, runner)
    return seqs, runner


def finish(sched: Scheduler, runner: Any) -> None:
    """Step `sched` with `runner` until every sequence is done."""
    for _ in range(500):
        if not sched.has_work():
            return
        batch = sched.schedule()
        results, _ = runner.run([row for _, row in batch])
        sched.postprocess(batch, results)
    raise AssertionError("did not finish")


PROMPT = [(i * 7) % 90 + 3 for i in range(40)]


def test_a_group_of_one_prompt_prefills_it_once() -> None:
    group = [PROMPT] * 8
    off, r_off = run(group, cache=False)
    on, r_on = run(group, cache=True)
    assert [s.output_ids for s in on] == [s.output_ids for s in off]
    assert r_off.fed == 8 * 40
    assert r_on.fed == 40 + 7 * 1  # each sibling feeds only the last prompt token
    assert [s.num_cached for s in on] == [0] + [39] * 7
    assert r_on.steps == r_off.steps + 1  # the siblings wait one step for the leader


def test_siblings_follow_a_chunked_prefill() -> None:
    group = [PROMPT] * 4
    off, _ = run(group, cache=False, budget=16)
    on, r_on = run(group, cache=True, budget=16)
    assert [s.output_ids for s in on] == [s.output_ids for s in off]
    assert r_on.fed == 40 + 3
    assert [s.num_cached for s in on] == [0, 39, 39, 39]


def test_a_short_shared_start_is_copied_without_waiting() -> None:
    prompts = [[1, 2, *PROMPT], [1, 2, *reversed(PROMPT)]]
    off, r_off = run(prompts, cache=False)
    on, r_on = run(prompts, cache=True)
    assert [s.output_ids for s in on] == [s.output_ids for s in off]
    assert r_on.fed == r_off.fed and r_on.steps == r_off.steps  # both prefill in step one


def test_same_outputs_when_eviction_is_forced() -> None:
    # 2 slots for 12 sequences, pairs from 3 prompt families in turn: every pair evicts the
    # slots the one before cached, and its second sequence copies from its first.
    families = [[f * 11 + 1] * 5 + PROMPT[f : f + 20] for f in range(3)]
    prompts = [families[(i // 2) % 3] + [i, i + 1] for i in range(12)]
    off, _ = run(prompts, cache=False, slots=2)
    on, r_on = run(prompts, cache=True, slots=2)
    assert [s.output_ids for s in on] == [s.output_ids for s in off]
    assert r_on.copied > 0


def test_positions_scored_for_prompt_logprobs_are_always_computed() -> None:
    group = [PROMPT] * 3
    off, _ = run(group, cache=False, start=30)
    on, r_on = run(group, cache=True, start=30)
    assert [s.input_logprobs for s in on] == [s.input_logprobs for s in off]
    assert [s.num_cached for s in on] == [0, 30, 30]
    assert r_on.fed == 40 + 2 * 10


def test_a_later_request_reuses_a_finished_one_with_its_output() -> None:
    runner = KVRunner(4)
    sched = Scheduler(
        runner, max_num_seqs=4, max_prefill_tokens=512, max_mask_tokens=4, prefix_cache=True
    )
    first = make_seq("a", PROMPT)
    sched.add(first)
    finish(sched, runner)
    # A second turn: the history (prompt + answer) plus new tokens.
    second = make_seq("b", PROMPT + first.output_ids + [5, 6])
    sched.add(second)
    finish(sched, runner)
    # All but the newest output token (sampled, never fed) came from the cache.
    assert second.num_cached == len(PROMPT) + len(first.output_ids) - 1
    sched.flush_cache()
    third = make_seq("c", PROMPT)
    sched.add(third)
    finish(sched, runner)
    assert third.num_cached == 0 and third.output_ids == first.output_ids
