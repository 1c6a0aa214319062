"""ModelRunner._order: the per-step validation and ordering of rows (decode rows first, the
given order otherwise), and what `run` reports from it."""

from __future__ import annotations

import random

import pytest

from maskgate.worker.engine.batch import RowWork, SamplingParams
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.runner.runner import ModelRunner


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner("tiny-random", max_num_slots=8, max_model_len=64)


def test_decode_rows_come_first_in_their_given_order(runner: ModelRunner) -> None:
    gen = random.Random(0)
    for _ in range(200):
        n = gen.randint(1, 8)
        slots = gen.sample(range(8), n)
        rows = [
            RowWork(s, [gen.randrange(100) for _ in range(gen.choice((1, 1, 2, 5)))], 3, True)
            for s in slots
        ]
        order, num_tokens = runner._order(rows)
        assert order == sorted(range(n), key=lambda i: len(rows[i].token_ids) > 1)
        assert num_tokens == sum(len(r.token_ids) for r in rows)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (RowWork(8, [1], 0, True), r"slot 8 outside \[0, 8\)"),
        (RowWork(-1, [1], 0, True), r"slot -1 outside"),
        (RowWork(0, [], 0, True), r"row feeds positions \[0, 0\)"),
        (RowWork(0, [1, 2], 63, True), r"row feeds positions \[63, 65\)"),
        (RowWork(0, [1], -1, True), r"row feeds positions \[-1, 0\)"),
        (RowWork(0, [-1], 0, True), r"token id outside"),
        (RowWork(0, [3, 10**6], 0, True), r"token id outside"),
        (RowWork(0, [10**6], 0, True), r"token id outside"),
    ],
)
def test_bad_rows_are_refused(runner: ModelRunner, row: RowWork, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runner._order([RowWork(5, [1], 0, True), row])


def test_rows_sharing_a_slot_are_refused(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="share a KV slot"):
        runner._order([RowWork(1, [1, 2], 0, True), RowWork(1, [3], 0, True)])


def test_results_land_on_their_rows_whatever_the_order() -> None:
    """A step of prefill and decode rows, seeded, gives each row the result it gets alone."""
    tiny: LoadedModel = load("tiny-random")
    prompts = [[5, 9, 2], [7], [11, 3, 8, 1], [4]]

    def rows_for(slots: list[int]) -> list[RowWork]:
        return [
            RowWork(
                s,
                prompts[s],
                0,
                True,
                SamplingParams(temperature=1.0, top_p=0.9, seed=40 + s),
                want_mask=s % 2 == 0,
                step=s,
            )
            for s in slots
        ]

    together, stats = ModelRunner(tiny, max_num_slots=4, max_model_len=32).run(
        rows_for([0, 1, 2, 3])
    )
    assert stats.num_rows == 4 and stats.num_tokens == sum(map(len, prompts))
    for s in range(4):
        (alone,), _ = ModelRunner(tiny, max_num_slots=4, max_model_len=32).run(rows_for([s]))
        got = together[s]
        assert got is not None and alone is not None
        assert got.token == alone.token
        assert (got.mask is None) == (alone.mask is None)
        assert got.mask is None or list(got.mask) == list(alone.mask)
        assert (got.mask is not None) == (s % 2 == 0)
