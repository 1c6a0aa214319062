"""Raw log-probs on CUDA: decode rows replayed from CUDA graphs and prefill rows scoring their
prompt, against a float64 log_softmax of the same runner's logits."""

from __future__ import annotations

import pytest
import torch

from maskgate.worker.engine.batch import RowWork, SamplingParams
from maskgate.worker.model import load
from maskgate.worker.runner.runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPT = [5, 77, 301, 12, 9, 140, 33]


def test_cuda_raw_logprobs_match_float64(kv_bytes: int) -> None:
    runner = ModelRunner(
        load("tiny-random", "cuda", torch.float32), max_num_slots=8, kv_cache_bytes=kv_bytes
    )
    assert runner.graphs is not None
    ref = runner.logits([RowWork(7, PROMPT, 0, sample=True)])[0].double().cpu()
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=1),
        SamplingParams(temperature=1.0, top_p=0.8, seed=2),
    ]
    rows = [
        RowWork(i, PROMPT, 0, True, p, want_mask=i == 1, want_logprob=i != 2, top_logprobs=3)
        for i, p in enumerate(params)
    ]
    rows[0].prompt_targets, rows[0].prompt_from = PROMPT[1:], 0
    ids = (3, 77, 3)  # token_ids_logprob, repeats allowed
    rows[0].logprob_ids = rows[1].logprob_ids = ids
    results, _ = runner.run(rows)
    greedy, masked, plain = results
    assert greedy is not None and masked is not None and plain is not None
    assert plain.raw_logprob is None and plain.top is None
    for res, t in ((greedy, 1.0), (masked, 0.7)):
        lp = torch.log_softmax((ref.float() / t).double(), 0)
        assert res.raw_logprob == pytest.approx(float(lp[res.token]), abs=1e-4)
        assert res.top is not None
        assert [i for _, i in res.top] == torch.topk(lp, 3).indices.tolist()
        assert res.ids_logprobs == pytest.approx([float(lp[i]) for i in ids], abs=1e-4)
    # Prompt log-probs: each prefix's last logits score the next prompt token.
    assert greedy.prompt_logprobs is not None and len(greedy.prompt_logprobs) == len(PROMPT) - 1
    for p in range(1, len(PROMPT)):
        x = runner.logits([RowWork(7, PROMPT[:p], 0, sample=True)])[0].double().cpu()
        lp = torch.log_softmax(x, 0)
        assert greedy.prompt_logprobs[p - 1] == pytest.approx(float(lp[PROMPT[p]]), abs=1e-3)
        assert greedy.prompt_ids_logprobs is not None
        got = greedy.prompt_ids_logprobs[p - 1]
        assert got == pytest.approx([float(lp[i]) for i in ids], abs=1e-3)
    # Decode steps replayed from CUDA graphs return the same values as eager ones would.
    tokens = {i: r.token for i, r in enumerate(results) if r is not None}
    for step in range(3):
        pos = len(PROMPT) + step
        dec = [
            RowWork(
                i,
                [tokens[i]],
                pos,
                True,
                params[i],
                want_logprob=True,
                step=step + 1,
                logprob_ids=ids,
            )
            for i in (0, 1)
        ]
        logits = runner.logits(dec).double().cpu()  # rewrites the same K/V: same logits
        before = runner.graphs.num_replays
        out, _ = runner.run(dec)
        assert runner.graphs.num_replays == before + 1
        for j, (r, t) in enumerate(zip(out, (1.0, 0.7), strict=True)):
            assert r is not None and r.raw_logprob is not None
            lp = torch.log_softmax((logits[j].float() / t).double(), 0)
            assert r.raw_logprob == pytest.approx(float(lp[r.token]), abs=1e-4)
            assert r.ids_logprobs == pytest.approx([float(lp[i]) for i in ids], abs=1e-4)
            tokens[j] = r.token
