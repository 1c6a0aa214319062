"""The sort-all-rows baseline on CUDA answers what the Triton kernels answer.

Run with `pytest -m gpu tests/gpu/test_kernels_sort_all_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from maskgate import kernels
from maskgate.kernels import sample_sort_all_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("batch", [1, 16, 40])
def test_sort_all_matches_triton(batch: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(batch)
    vocab = 151936
    x = (torch.randn(batch, vocab, generator=gen, device="cuda") * 5).to(torch.bfloat16)
    dev = x.device
    temp = torch.full((batch,), 1.0, device=dev)
    temp[::5] = 0.7
    top_k = torch.full((batch,), -1, dtype=torch.int32, device=dev)
    top_k[1::4] = 40
    top_p = torch.full((batch,), 0.95, device=dev)
    min_p = torch.zeros(batch, device=dev)
    min_p[2::6] = 0.05
    want = torch.zeros(batch, dtype=torch.bool)
    want[::2] = True
    kw = {
        "max_mask_tokens": 4096,
        "seed": torch.arange(batch, dtype=torch.int64, device=dev) * 13 + 5,
        "step": torch.arange(batch, dtype=torch.int64, device=dev),
        "bounded": torch.zeros(batch, dtype=torch.bool, device=dev),
    }
    args = (x, temp, top_k, top_p, min_p, want)
    ref = kernels.sample(*args, **kw)
    got = sample_sort_all_rows(*args, **kw)
    assert got.tokens.tolist() == ref.tokens.tolist()
    torch.testing.assert_close(got.logprobs.cpu(), ref.logprobs.cpu(), atol=1e-4, rtol=1e-4)
    assert got.masks() == ref.masks()
    rows = want.nonzero().squeeze(1).tolist()
    assert [got.support_sizes.tolist()[r] for r in rows] == [
        ref.support_sizes.tolist()[r] for r in rows
    ]
