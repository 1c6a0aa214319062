"""The engine's overlap schedule (step N + 1 launched before step N is post-processed), on the
CPU: the same tokens, masks and seeded samples as one step at a time over the real
tiny-random model; a sequence that ends at step N has a row in N + 1 whose token is never
committed and none in N + 2; control calls run with nothing in flight; and the runner's
PENDING tokens come from the previous launch."""

from __future__ import annotations

from typing import Any

import pytest

from maskgate.worker.engine.batch import PENDING, RowWork, SamplingParams
from maskgate.worker.engine.engine import Engine
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import Sequence, StopRule
from maskgate.worker.metrics import WorkerMetrics
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.runner.runner import ModelRunner
from tests.unit.worker.test_worker_scheduler import Done, FakeRunner, make_sched, make_seq


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load("tiny-random")


def drive(engine: Engine, seqs: list[Sequence]) -> None:
    """The engine thread's loop, run here (no asyncio: events are not delivered)."""
    engine.submit(seqs)
    assert engine._drain_inbox(block=False)
    for _ in range(1000):
        if not engine.scheduler.has_work():
            engine.finish_step()
            assert engine._in_flight is None
            return
        engine.step()
    raise AssertionError("did not finish")


def workload() -> list[Sequence]:
    """Greedy, seeded top-p with masks and log-probs, a stop token, a group sharing a prompt,
    and more sequences than slots (admissions while steps are in flight)."""
    prompts = [[(i * 29 + k) % 500 + 3 for i in range(12 + 3 * k)] for k in range(5)]
    seqs = []
    for k, prompt in enumerate(prompts):
        for j in range(2):
            greedy = k == 0
            params = SamplingParams(
                temperature=0.0 if greedy else 0.8, top_p=0.9, seed=None if greedy else 7 * k + j
            )
            rule = StopRule(5 + k, stop_token_ids=frozenset({17}) if k == 2 else frozenset())
            seq = Sequence(f"r{k}-{j}", prompt, params, rule, want_mask=True, want_logprob=True)
            seqs.append(seq)
    return seqs


def run_engine(
    tiny: LoadedModel, *, overlap: bool, cache: bool, **runner_kwargs: Any
) -> list[Sequence]:
    """The workload through the engine; `runner_kwargs` go to the ModelRunner."""
    runner = ModelRunner(tiny, max_num_slots=4, max_model_len=64, **runner_kwargs)
    sched = Scheduler(
        runner, max_num_seqs=4, max_prefill_tokens=32, max_mask_tokens=4096, prefix_cache=cache
    )
    engine = Engine(runner, sched, WorkerMetrics(), overlap=overlap)
    seqs = workload()
    drive(engine, seqs)
    return seqs


@pytest.mark.parametrize("cache", [False, True])
def test_overlap_gives_the_same_tokens_masks_and_seeded_samples(
    tiny: LoadedModel, cache: bool
) -> None:
    off = run_engine(tiny, overlap=False, cache=cache)
    on = run_engine(tiny, overlap=True, cache=cache)
    for a, b in zip(off, on, strict=True):
        assert a.finish_reason == b.finish_reason and a.finish_reason in ("stop", "length")
        assert a.output_ids == b.output_ids
        assert [list(m) for m in a.masks] == [list(m) for m in b.masks]
        # The batches differ (a finished sequence rides along one more step): rounding only.
        assert a.logprobs == pytest.approx(b.logprobs, abs=2e-5)
        assert a.raw_logprobs == pytest.approx(b.raw_logprobs, abs=2e-5)


def test_a_finished_sequence_rides_one_step_and_its_token_is_dropped() -> None:
    # Token = step + 50, except step 2 answers the EOS: the sequence ends at its third token.
    runner = FakeRunner(slots=1, next_token=lambda row: 0 if row.step == 2 else row.step + 50)
    engine = Engine(runner, make_sched(runner), WorkerMetrics(), overlap=True)
    first = make_seq("a", [5, 6], max_new=10)
    second = make_seq("b", [7], max_new=2)
    drive(engine, [first, second])
    assert first.output_ids == [50, 51, 0] and first.finish_reason == "stop"
    rows = [[(r.slot, r.step, r.token_ids) for r in step] for step in runner.steps]
    # Steps: a's prefill, its decodes at steps 1 and 2 (the last one samples the EOS), one
    # more decode (step 3) launched before the EOS was known, whose token is dropped; then
    # b, in the same slot, only once that step is back.
    assert rows[:4] == [[(0, 0, [5, 6])], [(0, 1, [50])], [(0, 2, [51])], [(0, 3, [0])]]
    assert rows[4] == [(0, 0, [7])]
    assert second.output_ids == [50, 51] and second.finish_reason == "length"
    # The length limit is known ahead: no row is launched for a token past it.
    assert len(rows) == 6


def test_control_calls_run_with_nothing_in_flight() -> None:
    runner = FakeRunner(slots=2)
    engine = Engine(runner, make_sched(runner), WorkerMetrics(), overlap=True)
    engine.submit([make_seq("a", [5, 6], max_new=8)])
    assert engine._drain_inbox(block=False)
    engine.step()
    engine.step()
    assert engine._in_flight is not None
    seen = engine.between_steps(lambda: engine._in_flight is None)
    assert engine._drain_inbox(block=False)
    assert seen.result() is True
    seq = engine.scheduler.running[0]
    assert seq.num_in_flight == 0 and len(seq.output_ids) == 2


def test_pending_tokens_come_from_the_previous_launch(tiny: LoadedModel) -> None:
    prompt = [9, 8, 7, 6]
    params = SamplingParams(temperature=0.7, seed=3)

    def steps(pending: bool) -> list[int]:
        runner = ModelRunner(tiny, max_num_slots=2, max_model_len=32)
        first = runner.launch([RowWork(1, prompt, 0, True, params)])
        token = [PENDING] if pending else None
        if not pending:
            token = [first.collect()[0][0].token]  # type: ignore[union-attr]
        assert token is not None
        second = runner.launch([RowWork(1, token, len(prompt), True, params, step=1)])
        got = [r.token for r in (*first.collect()[0], *second.collect()[0]) if r is not None]
        return got

    assert steps(pending=True) == steps(pending=False)
    runner = ModelRunner(tiny, max_num_slots=2, max_model_len=32)
    runner.launch([RowWork(0, prompt, 0, True, params)]).collect()
    with pytest.raises(ValueError, match="PENDING"):
        runner.launch([RowWork(1, [PENDING], 4, True, params)])


def test_the_step_in_flight_keeps_its_decode_row() -> None:
    """Two decode rows per sequence, used in turn: the next step fills one while the step in
    flight still holds the other."""
    runner = FakeRunner(slots=1)
    sched = make_sched(runner)
    seq = make_seq("a", [5], max_new=4)
    sched.add(seq)
    prefill = sched.schedule()
    sched.postprocess(prefill, runner.launch([r for _, r in prefill]).collect()[0])
    first = sched.schedule()
    runner.launch([r for _, r in first])
    second = sched.schedule()  # before the first is post-processed
    (_, row1), (_, row2) = first[0], second[0]
    assert row1 is not row2
    assert (row1.token_ids, row1.start_pos, row1.step) == ([6], 1, 1)
    assert (row2.token_ids, row2.start_pos, row2.step) == ([PENDING], 2, 2)


def test_a_failed_launch_fails_its_rows_after_the_step_in_flight_is_collected() -> None:
    class Failing(FakeRunner):
        def launch(self, rows: list[RowWork]) -> Done:
            if len(self.steps) == 2:  # the third launch
                raise RuntimeError("device fault")
            return super().launch(rows)

    runner = Failing(slots=2)
    engine = Engine(runner, make_sched(runner), WorkerMetrics(), overlap=True)
    seq = make_seq("a", [5, 6], max_new=8)
    drive(engine, [seq])
    # The first two steps' tokens are committed; the third step's rows fail the request,
    # and its slot is free again (not cached: what the step wrote is unknown).
    assert seq.output_ids == [7, 8] and seq.finish_reason == "error"
    assert seq.error is not None and seq.error.code == "worker_error"
    sched = engine.scheduler
    assert sched.owner == {} and sorted(sched.free_slots) == [0, 1]


class WaitingRunner(FakeRunner):
    """A runner whose every step reports 2 ms waited for the device."""

    def launch(self, rows: list[RowWork]) -> Done:
        done = super().launch(rows)
        done.out[1].device_wait_seconds = 0.002
        return done


@pytest.mark.parametrize("overlap", [False, True])
def test_step_time_and_device_wait_are_recorded_per_step(overlap: bool) -> None:
    runner = WaitingRunner(slots=2)
    metrics = WorkerMetrics()
    engine = Engine(runner, make_sched(runner), metrics, overlap=overlap)
    drive(engine, [make_seq("a", [5, 6], max_new=4), make_seq("b", [7], max_new=3)])
    get = metrics.registry.get_sample_value
    launched = len(runner.steps)
    # One step-time sample per launch, one device wait per collected step: the same steps.
    assert get("maskgate_worker_step_seconds_count") == launched
    assert get("maskgate_worker_step_device_wait_seconds_count") == launched
    assert get("maskgate_worker_step_device_wait_seconds_sum") == pytest.approx(0.002 * launched)
    assert get("maskgate_worker_step_seconds_sum") > 0


def test_the_cpu_runner_never_waits_for_a_device(tiny: LoadedModel) -> None:
    runner = ModelRunner(tiny, max_num_slots=4, max_model_len=64)
    sched = Scheduler(runner, max_num_seqs=4, max_prefill_tokens=32, max_mask_tokens=4096)
    metrics = WorkerMetrics()
    drive(Engine(runner, sched, metrics, overlap=True), workload())
    get = metrics.registry.get_sample_value
    assert get("maskgate_worker_step_device_wait_seconds_count") > 0
    assert get("maskgate_worker_step_device_wait_seconds_sum") == 0.0  # it computes at launch
