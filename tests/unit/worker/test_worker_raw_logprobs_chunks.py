"""Raw log-probs from the CUDA sampler's pass-1 statistics (SampleResult.chunk_max /
chunk_sumexp): checked on the CPU, by hand-made statistics and through the Triton path under
the Triton interpreter, against a float64 log_softmax of the same logits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from maskgate.worker.runner.raw_logprobs import chunk_lse, token_logprobs

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


def stats(z: torch.Tensor, seg: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment max and sum exp(z - max) of z [R, V], as pass 1 writes them."""
    parts = z.split(seg, dim=1)
    m = torch.stack([p.amax(dim=1) for p in parts], dim=1)
    s = torch.stack(
        [torch.exp(p - p.amax(dim=1, keepdim=True)).nan_to_num(0.0).sum(dim=1) for p in parts],
        dim=1,
    )
    return m, s


def test_chunk_lse_matches_logsumexp_with_empty_segments() -> None:
    z = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 4
    z[1, :100] = float("-inf")  # a segment with no finite z adds nothing
    z[2, 5] = float("-inf")
    m, s = stats(z, 64)
    assert chunk_lse(m, s)[:, 0].tolist() == pytest.approx(
        torch.logsumexp(z.double(), 1).tolist(), abs=1e-5
    )


def test_token_logprobs_with_chunks_equals_the_full_read() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 256, generator=g) * 3
    temp = torch.tensor([1.0, 0.7, 0.0, 2.0, 0.7])
    tokens = torch.randint(0, 256, (5,), generator=g)
    z = x / torch.where(temp < 1e-6, 1.0, temp)[:, None]
    chunks = stats(z, 64)
    rows = torch.tensor([1, 2, 4])
    for idx in (None, rows):
        for top in (0, 3):
            full = token_logprobs(x, idx, temp, tokens, top)
            fast = token_logprobs(x, idx, temp, tokens, top, chunks=chunks)
            torch.testing.assert_close(fast, full, atol=1e-5, rtol=0)
    want = torch.log_softmax(z.double(), 1).gather(1, tokens[:, None])[:, 0]
    got = token_logprobs(x, None, temp, tokens, 0, chunks=chunks)[:, 0]
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-5)


SCRIPT = """
import json, torch
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton.config import band_config
from maskgate.kernels.triton.launch import sample_triton
from maskgate.worker.runner.raw_logprobs import token_logprobs

vocab = 320
g = torch.Generator().manual_seed(3)
x = torch.randn(8, vocab, generator=g) * 3
x[3, :128] = float("-inf")  # whole segments without a finite logit
temp = torch.tensor([1.0, 0.7, 0.0, 1.0, 2.0, 0.7, 1.0, 0.5])
k = torch.tensor([50, -1, -1, 5, -1, 20, -1, -1], dtype=torch.int32)
p = torch.tensor([0.9, 0.8, 1.0, 1.0, 0.95, 1.0, 1.0, 1.0])
mp = torch.zeros(8)
want = torch.tensor([True, True, False, True, False, True, False, False])  # 6, 7: raced
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=64,
                   seed=torch.arange(8) * 7, step=torch.zeros(8, dtype=torch.int64))
cfg = band_config(vocab, 8, chunk=64, kc=8, lanes=LANES)
res = sample_triton(inp, cfg)
lp = token_logprobs(x, None, temp, res.tokens, 0, chunks=(res.chunk_max, res.chunk_sumexp))
z = (x / torch.where(temp < 1e-6, 1.0, temp)[:, None]).double()
want_lp = torch.log_softmax(z, 1).gather(1, res.tokens[:, None])[:, 0]
print(json.dumps({"got": lp[:, 0].tolist(), "want": want_lp.tolist(),
                  "shape": list(res.chunk_max.shape)}))
"""


@pytest.mark.parametrize("lanes", [4, 16])
def test_triton_pass_one_statistics_give_the_raw_logprob(
    lanes: int, interpreted: Interpreted
) -> None:
    pytest.importorskip("triton")
    out = interpreted(f"LANES = {lanes}\n" + SCRIPT)
    assert out["shape"][0] == 8 and out["shape"][1] >= 2
    assert out["got"] == pytest.approx(out["want"], abs=1e-5)
