"""kernels_support.interpreter: kernels give under it what they give under the interpreter's
own code.

Every interpreted check runs with it (tests/unit/conftest.py), so this holds it to the code it
replaces: our tuple reductions on blocks of each shape along each axis (keep_dims too), a
combine function that is associative but not commutative (the order of operands must survive),
float sums to rounding, and @triton.jit helpers calling helpers (patched once per launch) with
triton.language left unpatched after the launch."""

from __future__ import annotations

from typing import Any

CODE = """
import json
import numpy as np
import torch
import triton
import triton.language as tl
import kernels_support.interpreter
from maskgate.kernels.triton.common import add3_max3_add3, argmax_key_add

@triton.jit
def first_nonzero(a, b):  # associative, not commutative: the leftmost non-zero value
    return tl.where(a != 0, a, b)

@triton.jit
def kernel(x_ptr, p_ptr, f_ptr, o_ptr, N: tl.constexpr, M: tl.constexpr):
    r = tl.arange(0, N)[:, None]
    c = tl.arange(0, M)[None, :]
    x = tl.load(x_ptr + r * M + c)
    p = tl.load(p_ptr + r * M + c)
    f = tl.load(f_ptr + r * M + c)
    a = tl.reduce((x, x * 2, x * 3, x, -x, x * 0.5, x, f, x), 1, add3_max3_add3)
    b = tl.reduce((x, p, p * 7, f), 0, argmax_key_add)
    k = tl.reduce(p, 1, first_nonzero)
    n = tl.reduce(p, 0, first_nonzero, keep_dims=True)
    o = o_ptr
    for v in tl.static_range(9):
        tl.store(o + tl.arange(0, N), a[v].to(tl.float32))
        o += N
    for v in tl.static_range(4):
        tl.store(o + tl.arange(0, M), b[v].to(tl.float32))
        o += M
    tl.store(o + tl.arange(0, N), k.to(tl.float32))
    tl.store(o + N + tl.arange(0, M)[None, :], n.to(tl.float32))

def launch_all():
    g = torch.Generator().manual_seed(0)
    exact, sums = {}, {}
    for n, m in [(4, 8), (8, 2), (1, 16), (16, 1), (2, 64)]:
        x = torch.randint(-3, 4, (n, m), generator=g).float()  # ties, and sums exact in float
        p = torch.randint(0, 3, (n, m), generator=g).int()  # zeros for first_nonzero
        f = torch.rand(n, m, generator=g)  # sums that round
        o = torch.zeros(10 * n + 5 * m)
        kernel[(1,)](x, p, f, o, N=n, M=m)
        o = o.tolist()
        key = f"{n}x{m}"
        sums[key] = o[7 * n : 8 * n] + o[9 * n + 3 * m : 9 * n + 4 * m]
        exact[key] = o[: 7 * n] + o[8 * n : 9 * n + 3 * m] + o[9 * n + 4 * m :]
    return exact, sums

before = launch_all()
installed = kernels_support.interpreter.install()
again = kernels_support.interpreter.install()  # a second call changes nothing
after = launch_all()
restored = tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.core.load)
sums_close = all(np.allclose(before[1][k], after[1][k], rtol=1e-6, atol=0) for k in before[1])
print(json.dumps({"installed": installed, "again": again, "exact": [before[0], after[0]],
                  "sums_close": sums_close, "restored": restored}))
"""


def test_patched_interpreter_matches_its_own_code(interpreted: Any) -> None:
    # The fixture installs the patch before CODE runs; CODE takes its "before" from the loop.
    out = interpreted("kernels_support.interpreter.uninstall()\n" + CODE)
    assert out["installed"] and out["again"]
    loop, pairwise = out["exact"]
    assert loop == pairwise
    assert out["sums_close"]
    assert out["restored"]


STRICT = """
import json
import torch
import triton
import triton.language as tl

@triton.jit
def double(x_ptr, o_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(o_ptr + r, tl.load(x_ptr + r) * 2)

x, o = torch.arange(8.0), torch.zeros(8)
double[(1,)](x, o, N=8, num_warps=4, maxnreg=40, launch_pdl=True)  # options a GPU takes
try:
    double[(1,)](x, o, N=8, HELP=True)
    refused = ""
except Exception as e:
    refused = str(e)
print(json.dumps({"out": o.tolist(), "refused": refused}))
"""


def test_patched_interpreter_refuses_unknown_launch_keywords(interpreted: Any) -> None:
    """The interpreter drops a keyword the kernel does not take; a compiled launch raises
    (Triton's KeyError). With the patch both fail, so a CPU run meets such a launch too."""
    out = interpreted(STRICT)
    assert out["out"] == [2.0 * i for i in range(8)]
    assert "double launched with unknown keywords: ['HELP']" in out["refused"]
