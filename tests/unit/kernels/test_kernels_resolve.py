"""Pass 2's tiers (resolve_kernel, triton/resolve.py and decide.py) through the Triton
interpreter: the first tier's search stopping once its pick holds the support, wide bands
narrowed before each tier's sort, confident rows decided by top-k and top-p bounds.

Each check runs in a fork of a process that imported Triton under TRITON_INTERPRET=1
(tests/unit/conftest.py) and reports JSON on stdout.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from kernels_support.checks import PRELUDE

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


PEAKED = """
# Confident rows: one or two tokens far above the rest, so fewer than k = 50 tokens lie in
# the band. top-k + top-p decides from bounds on the top-k mass instead of falling back.
vocab = 1000
g = torch.Generator().manual_seed(5)
x = torch.randn(6, vocab, generator=g)
x[0, 17] = 30.0
x[1, 3] = 30.0; x[1, 900] = 29.0
x[2, 500] = 25.0; x[2, 501] = 25.0
x[3, 40] = 30.0; x[3, 41] = 27.0
x[4, 999] = 40.0
x[5, 0] = 18.0
b = x.shape[0]
temp = torch.ones(b)
k = torch.full((b,), 50, dtype=torch.int32)
p = torch.tensor([0.9, 0.9, 0.6, 0.99, 0.5, 0.95])
mp = torch.zeros(b)
want = torch.ones(b, dtype=torch.bool)
tri, cpu = both(x, temp, k, p, mp, want, 64, lanes=LANES)
ref = reference(x, temp, k, p, mp)
rep = check_result(tri, ref, want, None, 64)
print(json.dumps({"ok": rep.ok, "errors": rep.errors, "fallback": tri.fallback_rows.tolist(),
                  "sizes": tri.support_sizes.tolist(), "cpu_sizes": cpu.support_sizes.tolist()}))
"""


@pytest.mark.parametrize("lanes", [16, 4], ids=["unrolled", "loop"])
def test_confident_rows_decide_top_k_top_p_without_fallback(
    lanes: int, interpreted: Interpreted
) -> None:
    out = interpreted(PRELUDE + f"LANES = {lanes}\n" + PEAKED)
    assert out["ok"], out["errors"]
    assert out["fallback"] == [False] * 6
    assert out["sizes"] == out["cpu_sizes"]


WIDE_BAND = """
# Wide bands (256 candidates per 512-token chunk of 256 lanes, two tiles: every token is a
# lane top; over 1500 listed per row): each tier first narrows its candidates with the
# quartered threshold search, then sorts the best 256 / 1024.
# The last row ties 300 tokens at its max, more than the first tier holds: that search
# never moves below the max, and the tier takes the 256 lowest ids of the tie.
g = torch.Generator().manual_seed(1)
b, v = 5, 4096
x = torch.randn(b, v, generator=g) * torch.tensor([1.0, 1.5, 2.0, 3.0, 0.3])[:, None]
x[4] -= 10.0
x[4, torch.randperm(v, generator=g)[:300]] = 5.0
temp = torch.ones(b)
k = torch.tensor([-1, 300, -1, 50, -1], dtype=torch.int32)
p = torch.tensor([0.3, 0.9, 0.95, 0.9, 0.999])
mp = torch.zeros(b)
want = torch.ones(b, dtype=torch.bool)
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=v, seed=torch.arange(b))
band = torch.empty(b, dtype=torch.int64)
tri = sample_triton(inp, band_config(v, chunk=512, kc=256, lanes=256), band_sizes=band)
rep = check_result(tri, reference(x, temp, k, p, mp), want, None, v)
cpu = sample_torch(inp)
print(json.dumps({"ok": rep.ok, "errors": rep.errors, "band": band.tolist(),
                  "sizes": tri.support_sizes.tolist(), "cpu_sizes": cpu.support_sizes.tolist(),
                  "same": tri.masks() == cpu.masks() and torch.equal(tri.tokens, cpu.tokens)}))
"""


def test_wide_band_narrows_then_sorts_each_tier(interpreted: Interpreted) -> None:
    out = interpreted(PRELUDE + WIDE_BAND)
    assert out["ok"], out["errors"]
    assert min(out["band"][:4]) > 1024  # every tier had to narrow its candidates first
    assert out["sizes"] == out["cpu_sizes"] and out["same"]
    assert max(out["sizes"][:4]) > 256  # a support reaching into the second tier
    assert out["sizes"][4] == 300  # the tie, decided on the second tier


EARLY_STOP = """
# Wide bands (over 1000 listed a row) whose supports are a few dozen tokens: 20 tokens lie
# about 10 nats above the rest. The first tier's threshold search stops as soon as its pick
# holds the support: by mass (top-p alone), by count (top-k), by the min-p bound, at once for
# a greedy row. The last row has no such bound in the first tier (top-k 1000, past it).
import maskgate.kernels.triton.decide as decide_mod
STEPS = []  # one entry per step of a threshold search, in any tier

def counting(*args):  # the interpreter runs best_sorted as Python
    STEPS.append(1)
    return _counts(*args)

def counting_mass(*args):
    STEPS.append(1)
    return _counts_mass(*args)

_counts = patch(decide_mod, "counts_below", counting)
_counts_mass = patch(decide_mod, "counts_mass_below", counting_mass)
import maskgate.kernels.triton.resolve as resolve_mod
EARLY = [True]  # False: the first tier's search runs in full, as the second tier's does

def full_or_early(*args):  # the interpreter runs resolve_row as Python
    if len(args) == 7 and not EARLY[0]:  # the first tier's call: (..., goal, EARLY)
        args = args[:6] + (False,)
    return _best_sorted(*args)

_best_sorted = patch(resolve_mod, "best_sorted", full_or_early)  # the first tier's call
g = torch.Generator().manual_seed(3)
b, v = 6, 4096
x = torch.randn(b, v, generator=g)
for r in range(5):
    x[r, torch.randperm(v, generator=g)[:20]] += 10.0
temp = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.5, 1.0])
k = torch.tensor([-1, 30, -1, -1, -1, 1000], dtype=torch.int32)
p = torch.tensor([0.9, 0.95, 1.0, 1.0, 0.5, 1.0])
mp = torch.tensor([0.0, 0.0, 0.01, 0.0, 0.0, 0.0])
want = torch.ones(b, dtype=torch.bool)
seed = torch.arange(b)
ref = reference(x, temp, k, p, mp)
out = {}
cfg = band_config(v, chunk=512, kc=256, lanes=256)
for early in (True, False):
    EARLY[0] = early
    steps = []
    for r in range(b):  # a row at a time: the steps of each row's searches
        one = check_inputs(x[r:r + 1], temp[r:r + 1], k[r:r + 1], p[r:r + 1], mp[r:r + 1],
                           want[r:r + 1], max_mask_tokens=v, seed=seed[r:r + 1])
        n0 = len(STEPS)
        sample_triton(one, cfg)
        steps.append(len(STEPS) - n0)
    inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=v, seed=seed)
    band = torch.empty(b, dtype=torch.int64)
    tri = sample_triton(inp, cfg, band_sizes=band)
    rep = check_result(tri, ref, want, None, v)
    out[str(early)] = {"ok": rep.ok, "errors": rep.errors, "steps": steps,
                       "band": band.tolist(), "sizes": tri.support_sizes.tolist(),
                       "tokens": tri.tokens.tolist(), "masks": tri.masks(),
                       "fallback": tri.fallback_rows.tolist()}
print(json.dumps(out))
"""


def test_first_tier_search_stops_once_its_pick_holds_the_support(
    interpreted: Interpreted,
) -> None:
    """best_sorted with EARLY (the default): the first tier's threshold search stops after the
    step whose pick covers the support (top-p mass, top-k count, min-p bound; a greedy row
    needs no step), instead of narrowing until it holds 192 candidates. Supports, masks and
    seeded tokens equal the oracle and the full search's."""
    out = interpreted(PRELUDE + EARLY_STOP)
    early, full = out["True"], out["False"]
    assert early["ok"], early["errors"]
    assert full["ok"], full["errors"]
    assert min(early["band"]) > 256, early["band"]  # every first tier narrows its candidates
    assert early["sizes"] == full["sizes"] and early["tokens"] == full["tokens"]
    assert early["masks"] == full["masks"]
    assert early["fallback"] == full["fallback"] == [False] * 6
    assert early["steps"][3] == 0 < full["steps"][3]  # greedy: the max's ties, no search
    for e, f in zip(early["steps"][:5], full["steps"][:5], strict=True):
        assert 1 <= e < f or e == 0, (early["steps"], full["steps"])
    assert early["steps"][5] == full["steps"][5]  # no bound: both tiers search in full
