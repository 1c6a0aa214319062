"""bench/pass1_sums.py under the interpreter: pass 1's segment sums and the normaliser they
combine into stay within float32 rounding of float64 sums over the same z."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

CODE = """
import json
import torch
from bench.pass1_sums import sum_errors
from maskgate.kernels.workloads import peaked_logits
g = torch.Generator().manual_seed(1)
x = torch.cat([torch.randn(1, 20000, generator=g) * 3, peaked_logits(1, 20000, 1.2, g)])
print(json.dumps({str(t): sum_errors(x, t, launch_rows=128) for t in (0.7, 1.0)}))
"""


def test_segment_sums_and_normaliser_match_float64(interpreted: Any) -> None:
    out = interpreted(CODE)
    for errors in out.values():
        assert set(errors) == {"seg_z", "row_z", "row_logit"}
        for summary in errors.values():
            assert 0.0 <= summary["mean"] <= summary["max"] < 1e-5
            assert summary["p99"] <= summary["max"]
    # at T = 1, z = x: both forms of the normaliser are the same sum
    assert out["1.0"]["row_z"] == out["1.0"]["row_logit"]
