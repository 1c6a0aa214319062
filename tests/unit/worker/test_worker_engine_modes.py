"""The engine's four modes (overlap schedule off / on x prefix cache off / on) give the same
outputs on random workloads: prompts sharing prefixes, groups of one prompt, stop tokens,
few slots (eviction), small prefill budgets (chunks), and flushes and retractions between
steps.

The runner is the token-level KV fake of test_worker_scheduler_prefix: a sampled token is a
hash of what its slot holds, and reading a position nobody wrote fails. So a wrong copy, a
stale or missing K/V entry, a dropped or doubled token in flight, or a slot reused too early
shows up as a different output or an assertion.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from maskgate.worker.engine.batch import PENDING, RowWork, SamplingParams
from maskgate.worker.engine.engine import Engine
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import Sequence, StopRule
from maskgate.worker.metrics import WorkerMetrics
from tests.unit.worker.test_worker_scheduler import Done
from tests.unit.worker.test_worker_scheduler_prefix import KVRunner


class LaunchingKVRunner(KVRunner):
    def __init__(self, slots: int) -> None:
        super().__init__(slots, max_model_len=64)
        self.last: dict[int, int] = {}

    def launch(self, rows: list[RowWork]) -> Done:
        rows = [
            dataclasses.replace(r, token_ids=[self.last[r.slot]]) if r.token_ids == [PENDING] else r
            for r in rows
        ]
        done = Done(self.run(rows))
        pairs = zip(rows, done.out[0], strict=True)
        self.last = {r.slot: res.token for r, res in pairs if res is not None and r.sample}
        return done


FAMILIES = [[], [7, 8, 9, 10, 11, 12], [20 + i for i in range(18)]]

request = st.tuples(
    st.sampled_from(range(len(FAMILIES))),  # the shared start
    st.lists(st.integers(1, 90), min_size=1, max_size=6),  # its own tail
    st.integers(1, 3),  # n
    st.integers(1, 6),  # max_new_tokens
    st.sampled_from([None, 5, 40]),  # a stop token id
)
workload = st.fixed_dictionaries(
    {
        "slots": st.integers(1, 4),
        "budget": st.integers(3, 40),
        "requests": st.lists(request, min_size=1, max_size=6),
        "events": st.dictionaries(st.integers(0, 30), st.sampled_from(["flush", "retract"])),
    }
)


def run(w: dict[str, Any], *, overlap: bool, cache: bool) -> list[tuple[list[int], str | None]]:
    runner = LaunchingKVRunner(w["slots"])
    sched = Scheduler(
        runner,
        max_num_seqs=w["slots"],
        max_prefill_tokens=w["budget"],
        max_mask_tokens=4,
        prefix_cache=cache,
    )
    engine = Engine(runner, sched, WorkerMetrics(), overlap=overlap)
    seqs = []
    for k, (family, tail, n, max_new, stop) in enumerate(w["requests"]):
        rule = StopRule(max_new, stop_token_ids=frozenset() if stop is None else {stop})
        for j in range(n):
            params = SamplingParams(temperature=0.0)
            seqs.append(Sequence(f"r{k}-{j}", FAMILIES[family] + tail, params, rule))
    engine.submit(seqs)
    assert engine._drain_inbox(block=False)
    for i in range(500):
        if not sched.has_work():
            break
        event = w["events"].get(i)
        if event == "flush":
            engine.between_steps(sched.flush_cache)
        elif event == "retract":
            engine.between_steps(lambda: engine.pause("retract"))
            engine.between_steps(engine.resume)
        assert engine._drain_inbox(block=False)
        engine.step()
    engine.finish_step()
    assert not sched.has_work(), "did not finish"
    # Every slot is back: free or cached, none held.
    assert sched.owner == {} and all(s.num_in_flight == 0 for s in seqs)
    assert len(sched.free_slots) + sched.cache.num_cached == w["slots"]
    return [(s.output_ids, s.finish_reason) for s in seqs]


@settings(max_examples=60, deadline=None)
@given(workload)
def test_every_mode_gives_the_same_outputs(w: dict[str, Any]) -> None:
    base = run(w, overlap=False, cache=False)
    assert all(reason in ("stop", "length") for _, reason in base)
    for overlap, cache in ((True, False), (False, True), (True, True)):
        assert run(w, overlap=overlap, cache=cache) == base, (overlap, cache)
