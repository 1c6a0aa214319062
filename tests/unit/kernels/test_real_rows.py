"""bench/real_rows.py's row statistics against the float64 oracle (the rows themselves come
from SmolLM2, which the slow model tests load)."""

from __future__ import annotations

import torch

from bench.real_rows import describe, support_sizes
from maskgate.kernels.reference import reference
from maskgate.kernels.workloads import peaked_logits


def test_support_sizes_match_the_oracle_under_top_p() -> None:
    g = torch.Generator().manual_seed(4)
    z = torch.cat([peaked_logits(6, 3000, 1.2, g), torch.randn(6, 3000, generator=g) * 3])
    z[0, :40] = 5.0  # ties at the top
    rows = z.shape[0]
    ones = torch.ones(rows)
    for p in (0.5, 0.9, 0.95):
        ref = reference(z, ones, torch.full((rows,), -1, dtype=torch.int32), ones * p, ones * 0)
        assert support_sizes(z, p).tolist() == ref.support_sizes.tolist()


def test_describe_reports_quantiles_and_wide_rows() -> None:
    z = torch.full((4, 2048), -30.0)
    z[0, 0] = 0.0  # one token: |S| = 1
    z[1:, :1500] = 0.0  # 1500 equal tokens: |S| past 1024 at either top-p
    d = describe("t", z)
    # 1500 equal masses (and 548 of e^-30 each): a token is kept while the mass before it is
    # under top-p of the total, so 1426 at 0.95 (the 1426th has 1425/1500 minus a hair)
    assert d["n"] == 4 and d["support_p0.95_max"] == 1426 and d["support_p0.9_over_1024"] == 3
    assert abs(d["entropy_nats"][-1] - 7.31) < 0.01  # ln 1500
