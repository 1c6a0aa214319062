"""The runner's CUDA paths (SDPA kernels, KV writes, decode CUDA graphs) against its CPU path,
which the unit tests hold to transformers' logits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from row_results import ListedSampler

from maskgate import kernels
from maskgate.worker.engine.batch import RowResult, RowWork, SamplingParams
from maskgate.worker.model import load
from maskgate.worker.runner.runner import ModelRunner

# The plain_sample fixture (tests/conftest.py): kernels.sample called the plain way.
PlainSample = Callable[..., list[RowResult]]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_cuda_eager_and_graph_decode_match_cpu(kv_bytes: int) -> None:
    # float32 everywhere; the tolerance allows for TF32 inside CUDA attention kernels, while
    # a wrong position, slot or mask moves logits (std ~3) by O(1).
    kw = {"max_num_slots": 6, "max_model_len": 320, "kv_cache_bytes": kv_bytes}
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


def test_cuda_sampling_masks_follow_the_semantics(kv_bytes: int) -> None:
    runner = ModelRunner(
        load("tiny-random", "cuda"), max_num_slots=4, max_model_len=64, kv_cache_bytes=kv_bytes
    )
    prompt = [5, 77, 301, 12, 9]
    logits = runner.logits([RowWork(3, prompt, 0, sample=True)])[0].cpu()
    rows = [
        RowWork(0, prompt, 0, True, SamplingParams(temperature=0.0), want_mask=True),
        RowWork(1, prompt, 0, True, SamplingParams(top_k=50, top_p=0.9), want_mask=True),
        RowWork(2, prompt, 0, True, SamplingParams(top_p=0.9, seed=3), want_mask=True),
    ]
    results, stats = runner.run(rows)
    greedy, topk, topp = results
    assert greedy is not None and greedy.mask is not None
    assert list(greedy.mask) == [int(logits.argmax())]
    for r in (topk, topp):
        assert r is not None and r.mask is not None and r.mask_status == 0
        assert r.token in r.mask and r.mask[0] == greedy.token and r.logprob <= 0
    assert stats.mask_seconds > 0
    # collect() waited for the copies back (results, then the mask ids): on CUDA, never 0.
    assert 0 < stats.device_wait_seconds < 10


def _seeded_rows(n: int, salt: int) -> list[RowWork]:
    kinds = [
        (SamplingParams(temperature=0.0), True, False),
        (SamplingParams(top_k=50, top_p=0.9), True, False),
        (SamplingParams(top_p=0.9), False, False),
        (SamplingParams(temperature=0.7, min_p=0.05), True, False),
        (SamplingParams(top_p=0.9999), True, False),
        (SamplingParams(top_p=0.9999), True, True),
    ]
    rows = []
    for i in range(n):
        p, want, bounded = kinds[(i + salt) % len(kinds)]
        p = SamplingParams(p.temperature, p.top_k, p.top_p, p.min_p, seed=17 * i + salt)
        rows.append(RowWork(i, [1], 0, True, p, want_mask=want, bounded=bounded, step=salt + i))
    return rows


def test_cuda_row_sampler_matches_a_plain_sampler_call(plain_sample: PlainSample) -> None:
    """One RowSampler over back-to-back steps of changing batches (its buffers reused, the
    parameter copy asynchronous) draws exactly what a plain kernels.sample call draws, with
    every argument on the device, in its dtype and 16-byte aligned."""
    cap = 256
    spied: dict[str, torch.Tensor] = {}

    def spy(*args: Any, **kw: Any) -> Any:
        names = ("logits", "temperature", "top_k", "top_p", "min_p", "want_mask")
        spied.clear()
        spied.update(zip(names[1:], args[1:], strict=True))
        spied.update((k, v) for k, v in kw.items() if isinstance(v, torch.Tensor))
        return kernels.sample(*args, **kw)

    sampler = ListedSampler(spy, torch.device("cuda"), cap)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for step, n in enumerate([1, 3, 16, 64, 128, 2, 128, 17, 1]):
        logits = torch.randn(n, 151936, device="cuda", generator=gen) * 3.0
        rows = _seeded_rows(n, step)
        got, seconds, _ = sampler.sample(logits, rows)
        assert got == plain_sample(logits, rows, cap, [r.params.seed for r in rows]), (step, n)
        assert seconds > 0
        assert len(spied) == 8  # temperature .. want_mask, seed, step, bounded
        for name, t in spied.items():
            assert t.shape == (n,) and t.data_ptr() % 16 == 0, name
            assert t.device.type == ("cpu" if name == "want_mask" else "cuda"), name


def test_cuda_graph_padding_rows_leave_real_slots_alone(kv_bytes: int) -> None:
    """A decode of 3 rows after one of 4 (both in the 4-row bucket): the padding row writes
    the scratch slot, not slot 3, which the previous step's inputs named."""
    runner = ModelRunner(
        load("tiny-random", "cuda", torch.float32),
        max_num_slots=6,
        max_model_len=64,
        kv_cache_bytes=kv_bytes,
    )
    assert runner.graphs is not None
    runner.run([RowWork(s, [5, 6, 7], 0, True) for s in range(4)])
    runner.run([RowWork(s, [9], 3, True) for s in range(4)])
    before = runner.kv.k[:, 3].clone(), runner.kv.v[:, 3].clone()
    runner.run([RowWork(s, [11], 4, True) for s in range(3)])
    torch.cuda.synchronize()
    assert torch.equal(runner.kv.k[:, 3], before[0]) and torch.equal(runner.kv.v[:, 3], before[1])
    assert runner.graphs.num_replays == 2
