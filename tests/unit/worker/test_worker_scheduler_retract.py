"""Retraction (pause mode `retract`): running sequences give back their KV slots, wait at the
head of the queue, and on readmission prefill prompt + output so far, then go on as before."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from maskgate.worker.engine.batch import SamplingParams
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import SeqStatus, Sequence, StopRule

_spec = importlib.util.spec_from_file_location(
    "scheduler_fakes", Path(__file__).with_name("test_worker_scheduler.py")
)
assert _spec is not None and _spec.loader is not None
_fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fakes)
FakeRunner = _fakes.FakeRunner


def run_steps(sched: Scheduler, runner: FakeRunner, n: int) -> None:
    for _ in range(n):
        batch = sched.schedule()
        results, _ = runner.run([row for _, row in batch])
        sched.postprocess(batch, results)


def test_retracted_sequences_recompute_and_continue() -> None:
    runner = FakeRunner(slots=2)
    sched = Scheduler(runner, max_num_seqs=2, max_prefill_tokens=64, max_mask_tokens=8)
    params = SamplingParams()
    a = Sequence("a", [10, 11, 12], params, StopRule(8))
    b = Sequence("b", [40, 41], params, StopRule(8))
    queued = Sequence("c", [70], params, StopRule(2))
    for s in (a, b, queued):
        sched.add(s)
    run_steps(sched, runner, 3)  # a and b hold both slots; c waits
    assert a.output_ids == [13, 14, 15] and b.output_ids == [42, 43, 44]
    assert sched.retract_all() == 2
    assert [s.rid for s in sched.waiting] == ["a", "b", "c"] and not sched.running
    assert a.status is SeqStatus.WAITING and a.slot is None and len(sched.free_slots) == 2
    runner.steps.clear()
    run_steps(sched, runner, 1)
    rows = {row.token_ids[0]: row for row in runner.steps[0]}
    # Readmitted: one prefill of prompt + output, sampling output token 3 (keys seeded noise).
    assert rows[10].token_ids == [10, 11, 12, 13, 14, 15] and rows[10].start_pos == 0
    assert rows[10].step == 3 and rows[10].sample
    assert a.output_ids == [13, 14, 15, 16] and a.num_retractions == 1
    run_steps(sched, runner, 10)
    assert a.output_ids == list(range(13, 21)) and b.output_ids == list(range(42, 50))
    assert queued.output_ids == [71, 72]
