"""The CSR packing (triton/emit.py: emit_kernel, and pack_row inside resolve) through the
Triton interpreter: zero, one and several mask rows, packed either way, equal to the torch
path's CSR.

Each check runs in a fork of a process that imported Triton under TRITON_INTERPRET=1
(tests/unit/conftest.py) and reports JSON on stdout.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from kernels_support.checks import PRELUDE

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


CSR_SHAPES = """
# No mask row (offsets [0], written by resolve's row 0), one mask row anywhere in the batch
# (its slot is the CSR itself, no emit launch) and two or more: packed by emit_kernel
# (pack=False), or by resolve's rows themselves (pack_row).
g = torch.Generator().manual_seed(3)
x = torch.randn(5, 200, generator=g) * 3
temp = torch.tensor([1.0, 0.0, 0.8, 1.0, 1.2])
k = torch.tensor([-1, -1, 20, -1, 5], dtype=torch.int32)
p = torch.tensor([0.9, 1.0, 0.95, 1.0, 0.8])
mp = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0])
seed = torch.arange(5, dtype=torch.int64)
out = []
for pattern, mode in itertools.product(
    ([], [0], [3], [4], [1, 2], [0, 2, 4], [0, 1, 2, 3, 4]), ("emit", "pack")
):
    want = torch.zeros(5, dtype=torch.bool)
    want[pattern] = True
    inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=16, seed=seed)
    cfg = band_config(200, chunk=64, kc=8, lanes=16, pack=mode == "pack")
    tri, cpu = sample_triton(inp, cfg), sample_torch(inp)
    n = int(tri.mask_offsets[-1])
    out.append({
        "mode": mode,
        "offsets": [tri.mask_offsets.tolist(), cpu.mask_offsets.tolist()],
        "rows": [tri.mask_rows.tolist(), cpu.mask_rows.tolist()],
        "masks": [tri.masks(), cpu.masks()],
        "ids": [tri.mask_ids[:n].tolist(), cpu.mask_ids.tolist()],
        "tokens": [tri.tokens.tolist(), cpu.tokens.tolist()],
    })
print(json.dumps({"cases": out}))
"""


def test_csr_with_zero_one_and_several_mask_rows(interpreted: Interpreted) -> None:
    out = interpreted(PRELUDE + CSR_SHAPES)
    assert len(out["cases"]) == 14
    for case in out["cases"]:
        mode = case.pop("mode")
        for name, (tri, cpu) in case.items():
            assert tri == cpu, (mode, name, tri, cpu)
        assert case["offsets"][0][0] == 0
