"""The overlap schedule and the prefix cache on CUDA: the engine over the real runner (decode
graphs, the Triton sampler, results copied to pinned memory, mask ids on the side stream,
PENDING tokens filled into the graphs' inputs) gives the same tokens and masks with overlap
off and on, and with the cache off and on."""

from __future__ import annotations

import pytest
import torch

from maskgate.worker.engine.sequence import Sequence
from maskgate.worker.model import load
from tests.unit.worker.test_worker_engine_overlap import run_engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def run(kv_bytes: int, *, overlap: bool, cache: bool, graphs: bool) -> list[Sequence]:
    loaded = load("tiny-random", "cuda", torch.float32)
    return run_engine(
        loaded, overlap=overlap, cache=cache, kv_cache_bytes=kv_bytes, cuda_graphs=graphs
    )


@pytest.mark.parametrize("graphs", [True, False])
def test_overlap_and_cache_keep_tokens_and_masks(kv_bytes: int, graphs: bool) -> None:
    base = run(kv_bytes, overlap=False, cache=False, graphs=graphs)
    for overlap, cache in ((True, False), (False, True), (True, True)):
        other = run(kv_bytes, overlap=overlap, cache=cache, graphs=graphs)
        for a, b in zip(base, other, strict=True):
            assert a.finish_reason == b.finish_reason, (overlap, cache, a.rid)
            assert a.output_ids == b.output_ids, (overlap, cache, a.rid)
            assert [list(m) for m in a.masks] == [list(m) for m in b.masks], (overlap, cache, a.rid)
            assert a.raw_logprobs == pytest.approx(b.raw_logprobs, abs=1e-3)
