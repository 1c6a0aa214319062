"""Sorting a block of packed keys in one program (triton/sort.py) through the Triton
interpreter: one tl.sort, or sorted runs and their merges.

The check runs in a fork of a process that imported Triton under TRITON_INTERPRET=1
(tests/unit/conftest.py) and reports JSON on stdout.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


SORT_DESC = """
import json
import torch, triton, triton.language as tl
from maskgate.kernels.triton.sort import sort_desc

@triton.jit
def sort_rows(src, n_ptr, buf, out, T: tl.constexpr, RUN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    n = tl.load(n_ptr + row)
    pos = tl.arange(0, T)
    tl.store(buf + row * T + pos, tl.load(src + row * T + pos), mask=pos < n)
    tl.store(out + row * T + pos, sort_desc(buf + row * T, n, T, RUN))

g = torch.Generator().manual_seed(1)
out = {}
for t, run in [(256, 256), (256, 32), (128, 8)]:
    keys = torch.randint(-2**62, 2**62, (5, t), generator=g)
    keys[0, : t // 2] = keys[0, 0]  # equal keys across runs
    n = torch.tensor([t, t - 1, 1, 0, t // 2 + 3])
    got = torch.full_like(keys, 7)
    sort_rows[(5,)](keys, n, torch.zeros_like(keys), got, T=t, RUN=run)
    valid = torch.arange(t)[None, :] < n[:, None]
    want = torch.where(valid, keys, -2**63).sort(dim=1, descending=True).values
    out[f"{t}/{run}"] = torch.equal(got, want)
print(json.dumps(out))
"""


def test_sort_desc_sorts_runs_then_merges_them(interpreted: Interpreted) -> None:
    """sort.sort_desc equals torch's descending sort, the unused slots last as
    EMPTY_KEY: one tl.sort (RUN == the block), or runs of 32 and 8 keys and 3 and 4 merge
    levels; with equal keys across runs, and with 0, 1, an odd number and all slots used."""
    out = interpreted(SORT_DESC)
    assert out == {"256/256": True, "256/32": True, "128/8": True}, out
