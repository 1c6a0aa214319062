"""bench/search_reads.py under the interpreter: it counts the whole-row search's reads and
the bracket its listing read sorts, on a row only that search decides, and the row's support
is the oracle's."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

CODE = """
import json
import torch
import bench.search_reads as sr
from maskgate.kernels.triton_path import band_config
sr.count_reads()
g = torch.Generator().manual_seed(2)
row = torch.randn(8192, generator=g)
print(json.dumps(sr.run_row(row, 2.0, 0.5, band_config(8192, batch=128))))
"""


def test_counts_the_search_reads_of_a_flat_row(interpreted: Any) -> None:
    out = interpreted(CODE)
    assert out["fallback"] and out["oracle_ok"], out
    assert out["support"] > 1024  # past the tiers: only the whole-row search decides it
    assert 1 <= out["count_reads"] <= 5 + 16, out  # Z_READS + 16 at most
    assert out["listing_reads"] == 1 and 0 < out["bracket"] <= 1024, out
