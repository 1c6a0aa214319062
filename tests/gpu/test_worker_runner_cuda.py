"""The runner's CUDA paths (SDPA kernels, KV writes, decode CUDA graphs) against its CPU path,
which the unit tests hold to transformers' logits."""

from __future__ import annotations

import pytest
import torch

from worker.batch import RowWork, SamplingParams
from worker.model import load
from worker.runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_cuda_eager_and_graph_decode_match_cpu() -> None:
    # float32 everywhere; the tolerance allows for TF32 inside CUDA attention kernels, while
    # a wrong position, slot or mask moves logits (std ~3) by O(1).
    kw = {"max_num_slots": 6, "max_model_len": 320}
    cpu = ModelRunner("tiny-random", **kw)
    graphs = ModelRunner(load("tiny-random", "cuda", torch.float32), **kw)
    eager = ModelRunner(load("tiny-random", "cuda", torch.float32), cuda_graphs=False, **kw)
    assert graphs.graphs is not None and eager.graphs is None
    gen = torch.Generator().manual_seed(1)
    # Prompts near 256 so decoding crosses from the 256-key graphs to the 320-key ones.
    seqs = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (250, 7, 120, 1, 64)]
    prefill = [RowWork(i, s, 0, sample=True) for i, s in enumerate(seqs)]
    outs = [r.logits(prefill).cpu() for r in (cpu, graphs, eager)]
    torch.testing.assert_close(outs[1], outs[0], atol=2e-2, rtol=0)
    torch.testing.assert_close(outs[2], outs[0], atol=2e-2, rtol=0)
    pos = [len(s) for s in seqs]
    for step in range(12):
        # Vary the batch: all five rows, then three, so several batch buckets are captured.
        live = range(5) if step % 2 == 0 else (0, 2, 4)
        rows = [RowWork(i, [(step * 31 + i) % 500 + 3], pos[i], sample=True) for i in live]
        outs = [r.logits(rows).cpu() for r in (cpu, graphs, eager)]
        torch.testing.assert_close(outs[1], outs[0], atol=2e-2, rtol=0)
        torch.testing.assert_close(outs[2], outs[0], atol=2e-2, rtol=0)
        for i in live:
            pos[i] += 1
    assert graphs.graphs is not None and graphs.graphs.num_replays == 12
    assert {k for _, k in graphs.graphs.graphs} == {256, 320}


def test_cuda_sampling_masks_follow_the_semantics() -> None:
    runner = ModelRunner(load("tiny-random", "cuda"), max_num_slots=4, max_model_len=64)
    prompt = [5, 77, 301, 12, 9]
    logits = runner.logits([RowWork(3, prompt, 0, sample=True)])[0].cpu()
    rows = [
        RowWork(0, prompt, 0, True, SamplingParams(temperature=0.0), want_mask=True),
        RowWork(1, prompt, 0, True, SamplingParams(top_k=50, top_p=0.9), want_mask=True),
        RowWork(2, prompt, 0, True, SamplingParams(top_p=0.9, seed=3), want_mask=True),
    ]
    results, stats = runner.run(rows)
    greedy, topk, topp = results
    assert greedy is not None and greedy.mask == [int(logits.argmax())]
    for r in (topk, topp):
        assert r is not None and r.mask is not None and r.mask_status == 0
        assert r.token in r.mask and r.mask[0] == greedy.token and r.logprob <= 0
    assert stats.mask_seconds > 0
