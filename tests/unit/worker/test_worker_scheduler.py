"""The scheduler against a fake runner: admission, chunked prefill, queueing, finish rules, abort.

The fake runner is deterministic: a sampling row's token is `next_token(row)` (by default the
last fed token + 1), so each test can predict the whole trajectory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from maskgate.worker.engine.batch import PENDING, RowResult, RowWork, SamplingParams, StepStats
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import SeqStatus, Sequence, StopRule

EOS = 0


class FakeRunner:
    def __init__(
        self,
        *,
        slots: int = 4,
        max_model_len: int = 64,
        next_token: Callable[[RowWork], int] | None = None,
        mask_status: Callable[[RowWork], int] | None = None,
        nan_at: Callable[[RowWork], bool] | None = None,
    ) -> None:
        self.vocab_size = 100
        self.max_num_slots = slots
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset({EOS})
        self.next_token = next_token or (lambda row: (row.token_ids[-1] + 1) % 100)
        self.mask_status = mask_status or (lambda row: 0)
        self.nan_at = nan_at or (lambda row: False)
        self.steps: list[list[RowWork]] = []
        self.released: list[int] = []
        self.held: set[int] = set()
        self.last: dict[int, int] = {}  # slot -> token sampled by the last launch

    def launch(self, rows: list[RowWork]) -> Done:
        # The runner's contract for a step launched before the last one is collected: a
        # PENDING token is the one the slot's row of the previous launch sampled.
        rows = [
            dataclasses.replace(r, token_ids=[self.last[r.slot]]) if r.token_ids == [PENDING] else r
            for r in rows
        ]
        done = Done(self.run(rows))
        out = zip(rows, done.out[0], strict=True)
        self.last = {r.slot: res.token for r, res in out if res is not None}
        return done

    def run(self, rows: list[RowWork]) -> tuple[list[RowResult | None], StepStats]:
        # Copies: the scheduler reuses a sequence's decode RowWork from step to step.
        self.steps.append([dataclasses.replace(r) for r in rows])
        slots = [r.slot for r in rows]
        assert len(slots) == len(set(slots)), "one row per slot per step"
        out: list[RowResult | None] = []
        for row in rows:
            self.held.add(row.slot)
            if not row.sample:
                out.append(None)
                continue
            token = self.next_token(row)
            status = self.mask_status(row) if row.want_mask else 0
            mask = None if status == 1 or not row.want_mask else [token, token + 1]
            out.append(
                RowResult(
                    token=token,
                    logprob=-0.5,
                    mask=mask,
                    mask_status=status,
                    support_size=7 if row.want_mask else 0,
                    nan=self.nan_at(row),
                )
            )
        return out, StepStats(num_rows=len(rows), num_tokens=sum(len(r.token_ids) for r in rows))

    def release(self, slot: int) -> None:
        assert slot in self.held, "released a slot that never ran"
        self.held.discard(slot)
        self.released.append(slot)


class Done:
    def __init__(self, out: tuple[list[RowResult | None], StepStats]) -> None:
        self.out = out

    def collect(self) -> tuple[list[RowResult | None], StepStats]:
        return self.out


def make_seq(
    rid: str,
    prompt: list[int],
    *,
    max_new: int = 5,
    stop: tuple[str, ...] = (),
    stop_ids: frozenset[int] = frozenset(),
    ignore_eos: bool = False,
    want_mask: bool = False,
    bounded: bool = False,
) -> Sequence:
    return Sequence(
        rid=rid,
        prompt_ids=prompt,
        params=SamplingParams(temperature=0.0),
        rule=StopRule(max_new, stop, stop_ids, ignore_eos),
        want_mask=want_mask,
        bounded=bounded,
    )


def make_sched(runner: FakeRunner, *, max_num_seqs: int = 8, budget: int = 16) -> Scheduler:
    return Scheduler(
        runner,
        max_num_seqs=max_num_seqs,
        max_prefill_tokens=budget,
        max_mask_tokens=4,
        decode=lambda ids: "".join(chr(ord("a") + i % 26) for i in ids),
    )


def step(sched: Scheduler, runner: FakeRunner) -> list[Sequence]:
    batch = sched.schedule()
    results, _ = runner.run([row for _, row in batch])
    return sched.postprocess(batch, results).updated


def drain(sched: Scheduler, runner: FakeRunner, limit: int = 200) -> None:
    for _ in range(limit):
        if not sched.has_work():
            return
        step(sched, runner)
    raise AssertionError("scheduler did not finish")


def test_greedy_decode_feeds_each_sampled_token_at_the_next_position() -> None:
    runner = FakeRunner()
    sched = make_sched(runner)
    seq = make_seq("a", [10, 11, 12], max_new=3)
    sched.add(seq)
    drain(sched, runner)
    assert seq.output_ids == [13, 14, 15]
    assert seq.finish_reason == "length"
    prefill, d1, d2 = (steps[0] for steps in runner.steps)
    assert (prefill.token_ids, prefill.start_pos, prefill.sample) == ([10, 11, 12], 0, True)
    assert (d1.token_ids, d1.start_pos, d1.step) == ([13], 3, 1)
    assert (d2.token_ids, d2.start_pos, d2.step) == ([14], 4, 2)
    assert runner.released == [0] and sched.num_running == 0


def test_long_prompt_is_prefilled_in_chunks_alongside_decodes() -> None:
    runner = FakeRunner()
    sched = make_sched(runner, budget=4)
    short = make_seq("short", [50], max_new=4)
    sched.add(short)
    step(sched, runner)  # short is now decoding
    long = make_seq("long", list(range(20, 30)), max_new=1)
    sched.add(long)
    chunks = []
    while long.is_prefilling:
        batch = sched.schedule()
        by_rid = {s.rid: r for s, r in batch}
        assert "short" in by_rid or short.is_finished  # decode is never starved by prefill
        chunks.append(by_rid["long"])
        results, _ = runner.run([r for _, r in batch])
        sched.postprocess(batch, results)
    assert [c.token_ids for c in chunks] == [[20, 21, 22, 23], [24, 25, 26, 27], [28, 29]]
    assert [c.start_pos for c in chunks] == [0, 4, 8]
    assert [c.sample for c in chunks] == [False, False, True]
    assert long.output_ids == [30] and long.finish_reason == "length"


def test_full_slots_queue_requests_in_fifo_order() -> None:
    runner = FakeRunner(slots=2)
    sched = make_sched(runner)
    seqs = [make_seq(str(i), [40 + i], max_new=2 + i) for i in range(4)]
    for s in seqs:
        sched.add(s)
    step(sched, runner)
    assert [s.status for s in seqs] == [SeqStatus.RUNNING] * 2 + [SeqStatus.WAITING] * 2
    assert sched.num_waiting == 2 and sched.kv_usage == 1.0
    step(sched, runner)  # seq 0 finishes (2 tokens), freeing its slot
    assert seqs[0].is_finished and seqs[2].status is SeqStatus.WAITING
    step(sched, runner)  # seq 2 takes the freed slot; seq 3 still waits
    assert seqs[2].status is SeqStatus.RUNNING and seqs[3].status is SeqStatus.WAITING
    drain(sched, runner)
    assert all(s.finish_reason == "length" for s in seqs)
    assert [len(s.output_ids) for s in seqs] == [2, 3, 4, 5]
    assert sched.kv_usage == 0.0 and sorted(sched.free_slots) == [0, 1]


def test_max_num_seqs_limits_admission_below_the_slot_count() -> None:
    runner = FakeRunner(slots=8)
    sched = make_sched(runner, max_num_seqs=3)
    for i in range(5):
        sched.add(make_seq(str(i), [1, 2], max_new=50))
    step(sched, runner)
    assert sched.num_running == 3 and sched.num_waiting == 2


def test_eos_finishes_unless_ignore_eos() -> None:
    runner = FakeRunner()
    sched = make_sched(runner)
    stops = make_seq("eos", [98], max_new=10)
    ignores = make_seq("ign", [98], max_new=3, ignore_eos=True)
    sched.add(stops)
    sched.add(ignores)
    drain(sched, runner)
    assert stops.output_ids == [99, 0] and stops.finish_reason == "stop"
    assert stops.matched_stop == EOS
    assert ignores.output_ids == [99, 0, 1] and ignores.finish_reason == "length"


def test_stop_token_ids_and_stop_strings() -> None:
    runner = FakeRunner()
    sched = make_sched(runner)
    by_id = make_seq("id", [5], max_new=10, stop_ids=frozenset({8}))
    # decode maps id i to chr('a' + i % 26): output 6,7,8,9 reads "ghij".
    by_text = make_seq("txt", [5], max_new=10, stop=("hi", "zz"))
    sched.add(by_id)
    sched.add(by_text)
    drain(sched, runner)
    assert by_id.output_ids == [6, 7, 8] and by_id.matched_stop == 8
    assert by_text.output_ids == [6, 7, 8] and by_text.finish_reason == "stop"
    assert by_text.matched_stop == "hi" and by_text.text_limit == 1  # text "g" kept


def test_max_model_len_caps_the_output() -> None:
    runner = FakeRunner(max_model_len=8)
    sched = make_sched(runner)
    seq = make_seq("a", [1, 2, 3, 4, 5], max_new=100)
    sched.add(seq)
    drain(sched, runner)
    assert len(seq.output_ids) == 3 and seq.finish_reason == "length"


def test_zero_max_new_tokens_finishes_without_running() -> None:
    runner = FakeRunner()
    sched = make_sched(runner)
    seq = make_seq("a", [1], max_new=0)
    sched.add(seq)
    assert seq.finish_reason == "length" and not sched.has_work() and runner.steps == []


def test_abort_waiting_and_running_sequences_frees_their_slots() -> None:
    runner = FakeRunner(slots=1)
    sched = make_sched(runner)
    running = make_seq("r", [1], max_new=50)
    waiting = make_seq("w", [1], max_new=50)
    sched.add(running)
    sched.add(waiting)
    step(sched, runner)
    assert sched.abort(waiting) and waiting.finish_reason == "abort"
    assert sched.abort(running) and running.finish_reason == "abort"
    assert not sched.abort(running)  # idempotent
    assert not sched.has_work() and runner.released == [0] and list(sched.free_slots) == [0]


def test_masks_logprobs_and_bounded_truncation_flags() -> None:
    runner = FakeRunner(mask_status=lambda row: 2 if row.step == 1 else 0)
    sched = make_sched(runner)
    seq = make_seq("m", [3], max_new=3, want_mask=True, bounded=True)
    plain = make_seq("p", [3], max_new=3)
    sched.add(seq)
    sched.add(plain)
    drain(sched, runner)
    assert seq.masks == [[4, 5], [5, 6], [6, 7]]
    assert seq.logprobs == [-0.5] * 3 and seq.truncated == [False, True, False]
    assert plain.masks == [] and plain.logprobs == []
    assert all(r.bounded and r.want_mask for s in runner.steps for r in s if r.slot == 0)
    assert not any(r.want_mask for s in runner.steps for r in s if r.slot == 1)


def test_exact_overflow_fails_the_request_without_committing_the_token() -> None:
    runner = FakeRunner(mask_status=lambda row: 1 if row.step == 2 else 0)
    sched = make_sched(runner)
    seq = make_seq("m", [3], max_new=10, want_mask=True)
    other = make_seq("o", [3], max_new=4)
    sched.add(seq)
    sched.add(other)
    drain(sched, runner)
    assert seq.output_ids == [4, 5] and len(seq.masks) == 2  # step 2's token is not committed
    assert seq.finish_reason == "error" and seq.error is not None
    assert seq.error.status == 400 and seq.error.code == "sampling_mask_overflow"
    assert "|S|=7" in seq.error.message and "C=4" in seq.error.message
    assert "bounded" in seq.error.message
    assert other.output_ids == [4, 5, 6, 7]  # the batch neighbour is unaffected


def test_nan_logits_fail_with_a_500() -> None:
    runner = FakeRunner(nan_at=lambda row: row.step == 1)
    sched = make_sched(runner)
    seq = make_seq("n", [3], max_new=10)
    sched.add(seq)
    drain(sched, runner)
    assert seq.output_ids == [4] and seq.error is not None
    assert (seq.error.status, seq.error.code) == (500, "worker_numerical_error")
    assert runner.released == [0]


def test_step_outcome_reports_ttft_itl_and_token_counts() -> None:
    runner = FakeRunner()
    sched = make_sched(runner)
    sched.add(make_seq("a", [1, 2, 3], max_new=2))
    first = sched.schedule()
    out = sched.postprocess(first, runner.run([r for _, r in first])[0])
    assert (out.num_prompt_tokens, out.num_generated, len(out.ttft), out.itl) == (3, 1, 1, [])
    second = sched.schedule()
    out = sched.postprocess(second, runner.run([r for _, r in second])[0])
    assert (out.num_prompt_tokens, out.num_generated, out.ttft, len(out.itl)) == (0, 1, [], 1)


@pytest.mark.parametrize("bad", [{"max_num_seqs": 0}, {"max_prefill_tokens": 0}])
def test_bad_limits_are_rejected(bad: dict[str, int]) -> None:
    limits = {"max_num_seqs": 4, "max_prefill_tokens": 16, "max_mask_tokens": 4} | bad
    with pytest.raises(ValueError):
        Scheduler(FakeRunner(), **limits)


def test_stop_string_late_in_a_long_output_is_found() -> None:
    # 60 x "b", then "y", "z": the match is found from the decoded tail, cut at char 60.
    runner = FakeRunner(next_token=lambda row: {60: 24, 61: 25}.get(row.step, 27))
    sched = make_sched(runner)
    seq = make_seq("late", [5], max_new=100, stop=("yz",))
    sched.add(seq)
    drain(sched, runner)
    assert len(seq.output_ids) == 62 and seq.matched_stop == "yz" and seq.text_limit == 60


def test_engine_counts_the_samplers_fallback_rows() -> None:
    """The engine exports the sampler's fallback rows (wide supports that hold a GPU step)
    as maskgate_worker_sampler_fallback_rows_total, step by step."""
    from maskgate.worker.engine.engine import Engine
    from maskgate.worker.metrics import WorkerMetrics

    class FallbackRunner(FakeRunner):
        def run(self, rows: list[RowWork]) -> tuple[list[RowResult | None], StepStats]:
            out, stats = super().run(rows)
            stats.num_fallback_rows = sum(1 for r in rows if r.sample)
            return out, stats

    runner = FallbackRunner()
    metrics = WorkerMetrics()
    engine = Engine(runner, make_sched(runner), metrics)
    engine.submit([make_seq("a", [5, 6], max_new=3), make_seq("b", [7], max_new=3)])
    assert engine._drain_inbox(block=False)
    while engine.scheduler.has_work():
        engine.step()
    text = metrics.render().decode()
    assert "\nmaskgate_worker_sampler_fallback_rows_total 6.0" in text  # 2 rows x 3 tokens
