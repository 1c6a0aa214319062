"""The Triton path on the CPU through the Triton interpreter (TRITON_INTERPRET=1).

The variable must be set before triton is imported, so each check runs in a fresh Python
process and reports JSON on stdout. Sizes are small (the interpreter runs every program in
numpy), with a shrunken band (chunks of 64, 8 candidates each) so that several chunks, the
tiered sort and the bisection fallback are all exercised.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)

PRELUDE = """
import itertools, json, sys
import torch
from kernels_support.conformance import check_result
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.reference import reference
from maskgate.kernels.cpu.torch_path import sample_torch
from maskgate.kernels.triton.config import band_config
from maskgate.kernels.triton.launch import sample_triton
from kernels_support.workloads import ADVERSARIAL_KINDS, adversarial_logits

REREAD = False  # lanes with three tokens in the band read their column again

def both(logits, temp, k, p, mp, want, cap, seed=None, step=None, bounded=None, lanes=16):
    inp = check_inputs(logits, temp, k, p, mp, want, max_mask_tokens=cap, seed=seed,
                       step=step, bounded=bounded)
    cfg = band_config(logits.shape[1], chunk=64, kc=8, lanes=lanes, reread=REREAD)
    return sample_triton(inp, cfg), sample_torch(inp)
"""

GRID = """
vocab = 240
ks = [1, 2, 50, vocab - 1, vocab, -1]
ps = [1e-6, 0.5, 0.9, 0.999, 1.0]
mps = [0.0, 0.05, 0.5, 1.0]
combos = list(itertools.product(ADVERSARIAL_KINDS, ks, ps, mps))
g = torch.Generator().manual_seed(0)
pick = torch.randperm(len(combos), generator=g)[:24].tolist()
combos = [combos[i] for i in pick]
b = len(combos)
logits = adversarial_logits([c[0] for c in combos], vocab, g)
temp = torch.tensor([1.0, 0.7, 2.0, 0.0])[torch.arange(b) % 4]
k = torch.tensor([c[1] for c in combos], dtype=torch.int32)
p = torch.tensor([c[2] for c in combos])
mp = torch.tensor([c[3] for c in combos])
want = torch.arange(b) % 5 != 2
bounded = torch.arange(b) % 2 == 0
seed = torch.arange(b, dtype=torch.int64) * 31
step = torch.full((b,), 2, dtype=torch.int64)
cap = 24
tri, cpu = both(logits, temp, k, p, mp, want, cap, seed, step, bounded, LANES)
ref = reference(logits, temp, k, p, mp)
rep = check_result(tri, ref, want, bounded, cap)
clear = ~ref.ambiguous
print(json.dumps({
    "ok": rep.ok, "errors": rep.errors, "rows": rep.rows, "ambiguous": rep.ambiguous,
    "fallback": int(tri.fallback_rows.sum()),
    "same_tokens": bool(torch.equal(tri.tokens[clear], cpu.tokens[clear])),
    "same_sizes": bool(torch.equal(tri.support_sizes[clear], cpu.support_sizes[clear])),
}))
"""

EDGES = """
vocab = 200
x = torch.randn(7, vocab, generator=torch.Generator().manual_seed(1))
x[0] = 0.0                      # flat, greedy: lowest id
x[1, 3] = float("nan")          # NaN row
x[2, 5] = float("inf")          # +inf row
x[3] = float("-inf"); x[3, 150] = 1.0   # one finite token
x[4] = 0.0                      # flat, top-p 0.999: |S| > cap, bounded
x[5] = 0.0                      # flat, top-p 0.999: |S| > cap, exact -> overflow
temp = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8])
k = torch.tensor([-1, -1, -1, 5, -1, -1, 7], dtype=torch.int32)
p = torch.tensor([1.0, 0.9, 0.9, 0.5, 0.999, 0.999, 0.95])
mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.02])
want = torch.ones(7, dtype=torch.bool)
bounded = torch.tensor([False, False, False, False, True, False, False])
seed = torch.arange(7, dtype=torch.int64) + 5
tri, cpu = both(x, temp, k, p, mp, want, 10, seed, None, bounded, lanes=LANES)
out = {}
for name in ("tokens", "support_sizes", "nan_rows", "mask_status", "mask_offsets"):
    out[name] = [getattr(tri, name).tolist(), getattr(cpu, name).tolist()]
out["masks"] = [tri.masks(), cpu.masks()]
lp_t, lp_c = tri.logprobs, cpu.logprobs
out["logprob_close"] = bool(torch.allclose(lp_t, lp_c, atol=1e-5, equal_nan=True))
# Batch invariance on the Triton path: row 6 alone draws the same token.
alone, _ = both(x[6:], temp[6:], k[6:], p[6:], mp[6:], want[6:], 10, seed[6:], None,
                bounded[6:], lanes=LANES)
out["alone"] = [alone.tokens.item(), tri.tokens[6].item()]
print(json.dumps(out))
"""


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

NO_BISECTION = """
import maskgate.kernels.triton.resolve
from maskgate import kernels
def no_bisection(*args, **kwargs):  # the interpreter runs resolve_row as Python
    raise AssertionError("the bisection fallback ran")

kernels.triton.resolve.fallback_support = no_bisection
"""

COUNT_SORTS = """
import maskgate.kernels.triton.resolve
from maskgate import kernels
SORTS = []  # one entry per best_sorted call: the tiers and the rescue's picks
_best_sorted = kernels.triton.resolve.best_sorted

def counting_best_sorted(*args):  # the interpreter runs resolve_row as Python
    SORTS.append(1)
    return _best_sorted(*args)

kernels.triton.resolve.best_sorted = counting_best_sorted
"""

# The rescue scripts' common end: the Triton path (segments of 64, KC candidates each)
# against the oracle and the torch path. Each script sets x, temp, k, p, mp, want, seed, KC.
RESCUE_CHECK = """
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=64, seed=seed)
band = torch.empty(b, dtype=torch.int64)
tri = sample_triton(inp, band_config(vocab, chunk=64, kc=KC, lanes=LANES), band_sizes=band)
cpu = sample_torch(inp)
ref = reference(x, temp, k, p, mp)
rep = check_result(tri, ref, want, None, 64)
print(json.dumps({"ok": rep.ok, "errors": rep.errors, "fallback": tri.fallback_rows.tolist(),
                  "band": band.tolist(), "sizes": tri.support_sizes.tolist(),
                  "ref_sizes": ref.support_sizes.tolist(),
                  "cpu_sizes": cpu.support_sizes.tolist(), "masks": tri.masks() == cpu.masks(),
                  "tokens": torch.equal(tri.tokens, cpu.tokens),
                  "sorts": len(globals().get("SORTS", []))}))
"""

RESCUE = (
    """
# Rows whose band floor one segment pushes deep into S. Pass 1 keeps two tokens per lane and
# KC = 8 per chunk, so a segment holding ten of S's 24 tokens, three of them in its lane 0
# (offsets 0, 16, 32: the 1st, 4th and 7th largest), leaves its d_c at a token of S: the band
# lists 6 tokens above the row floor, fewer than S needs. The
# other segments are complete far lower, so resolve lists every token above the
# second-largest d_c from their candidates and one read of the bad segment, and decides these
# rows without the bisection fallback. The bad segment differs per row, the last one (40
# tokens, V not a multiple of the segment) included. (On the model-shaped rows this
# reproduces, 3 of a row's top ~100-300 tokens share one of 8 x 512 lanes.)
vocab = 1000
g = torch.Generator().manual_seed(11)
b = 6
x = torch.randn(b, vocab, generator=g)
vals = 10.0 - 0.1 * torch.arange(24)
for r, bad in enumerate([0, 15, 7, 15, 3, 9]):
    hot = [bad * 64 + o for o in (0, 1, 2, 16, 3, 4, 32, 5, 6, 7)]  # in rank order
    spread = [c * 64 + (5 * c) % 16 for c in range(16) if c != bad]  # one per other segment
    rest = torch.tensor(spread)[torch.randperm(15, generator=g)[:14]]
    x[r, torch.tensor(hot + rest.tolist())] = vals
temp = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.7])
k = torch.tensor([-1, -1, -1, 20, -1, -1], dtype=torch.int32)
p = torch.tensor([0.9, 0.7, 0.99, 0.9, 1.0, 0.95])
mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.0])
want = torch.ones(b, dtype=torch.bool)
seed = torch.arange(b, dtype=torch.int64) + 3
KC = 8
"""
    + RESCUE_CHECK
)

RESCUE_WIDE = (
    """
# More tokens above the rescue's floor than the second tier holds. With KC = 4, 16 segments
# of 64 make 64 candidate slots, so both tiers hold 64 keys and the rescue gathers up to 256.
# A segment whose 64 tokens are the row's best writes 4 of them and sets the row floor
# inside S (30-50 tokens); the rescue then finds its 64 tokens and the other segments'
# few above t, more than 64, and picks the best 64 of them to decide.
vocab = 1000
g = torch.Generator().manual_seed(5)
bads = [0, 6, 11, 14, 3]
b = len(bads)
x = torch.randn(b, vocab, generator=g) * 0.5
for r, bad in enumerate(bads):
    x[r, bad * 64 + torch.randperm(64, generator=g)] = 10.0 - 0.05 * torch.arange(64.0)
temp = torch.ones(b)
k = torch.tensor([-1, -1, 60, -1, -1], dtype=torch.int32)
p = torch.tensor([0.9, 0.8, 0.9, 1.0, 0.95])
mp = torch.tensor([0.0, 0.0, 0.0, 0.2, 0.0])
want = torch.ones(b, dtype=torch.bool)
seed = torch.arange(b)
KC = 4
"""
    + RESCUE_CHECK
)

CONTRACT = """
from maskgate.kernels.order import key_ids, key_z
EMPTY_KEY = -(2**63)
from maskgate.kernels.triton.launch import launch_band
vocab = 700
g = torch.Generator().manual_seed(3)
x = adversarial_logits(list(ADVERSARIAL_KINDS) * 2, vocab, g)
x[0, 5] = float("nan")
x[1, 9] = float("inf")
x[2, 64:128] = 1.5  # chunk 1 of row 2: 59 tokens tie at its max (more than KC),
x[2, 64:69] = 1.0   # the lowest of them (id 69) in lane 5 of a 16-lane tile
b = x.shape[0]
temp = torch.tensor([1.0, 0.0, 0.5, 2.0] * 3)
t = torch.where(temp < 1e-6, 1.0, temp)
z = x / t[:, None]
outs = {}
for name, kw in TRIED:
    cfg = band_config(vocab, chunk=64, kc=8, **kw)
    keys = torch.full((b, cfg.ncand), 12345, dtype=torch.int64)  # poison: no valid key
    stats = [torch.full((b, cfg.n_chunks), 3.0) for _ in range(3)]
    launch_band(x, temp, keys, *stats, cfg)
    outs[name] = (keys, *stats)
n_ch, kc = cfg.n_chunks, cfg.kc
# Each segment's max and sum of exp(z - max), in float64 (padded past V with -inf)
zp = torch.cat([z, torch.full((b, n_ch * 64 - vocab), float("-inf"))], dim=1).view(b, n_ch, 64)
m_ref = zp.max(dim=2).values
s_ref = torch.exp(zp.double() - m_ref.double()[..., None]).sum(dim=2)
s_ref = torch.where(m_ref == float("-inf"), 0.0, s_ref)  # an all -inf segment sums to 0
res = {"stats_equal": [], "contract": [], "ties": [], "written": []}
for name, _ in TRIED:
    keys, m, s, d = outs[name]
    good = ~torch.isnan(s).any(dim=1)  # rows flagged bad have no band contract
    res["stats_equal"].append(torch.equal(m[good], m_ref[good])
                              and torch.allclose(s[good].double(), s_ref[good], rtol=1e-5))
    used = keys != EMPTY_KEY
    cz = key_z(keys)
    ci = key_ids(keys)
    res["written"].append(int(used[good].sum()))
    ok = bool((keys[used.logical_not()] == EMPTY_KEY).all())  # unused slots marked empty
    for r in good.nonzero().squeeze(1).tolist():
        for c in range(n_ch):
            sl = slice(c * kc, (c + 1) * kc)
            u = used[r, sl]
            ids = ci[r, sl][u].long()
            lo, hi = c * 64, min((c + 1) * 64, vocab)
            ok &= bool(((ids >= lo) & (ids < hi)).all()) and len(set(ids.tolist())) == len(ids)
            ok &= torch.equal(cz[r, sl][u], z[r, ids])  # real (z, id) pairs, z exact
            rest = torch.ones(hi - lo, dtype=torch.bool)
            rest[ids - lo] = False
            left = z[r, lo:hi][rest]
            d_exact = left.max().item() if left.numel() else float("-inf")
            ok &= d_exact == d[r, c].item()  # the largest unwritten z, exactly
    res["contract"].append(ok)
    tie = ci[2, kc : 2 * kc].tolist()  # KC of the tied tokens, the lowest id among them
    res["ties"].append(len(tie) == kc and 69 in tie and all(69 <= i < 128 for i in tie))
print(json.dumps(res))
"""


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


EARLY_STOP = """
# Wide bands (over 1000 listed a row) whose supports are a few dozen tokens: 20 tokens lie
# about 10 nats above the rest. The first tier's threshold search stops as soon as its pick
# holds the support: by mass (top-p alone), by count (top-k), by the min-p bound, at once for
# a greedy row. The last row has no such bound in the first tier (top-k 1000, past it).
import maskgate.kernels.triton.decide
from maskgate import kernels
STEPS = []  # one entry per step of a threshold search, in any tier
_counts = kernels.triton.decide.counts_below
_counts_mass = kernels.triton.decide.counts_mass_below

def counting(*args):  # the interpreter runs best_sorted as Python
    STEPS.append(1)
    return _counts(*args)

def counting_mass(*args):
    STEPS.append(1)
    return _counts_mass(*args)

kernels.triton.decide.counts_below = counting
kernels.triton.decide.counts_mass_below = counting_mass
import maskgate.kernels.triton.resolve
EARLY = [True]  # False: the first tier's search runs in full, as the second tier's does
_best_sorted = kernels.triton.resolve.best_sorted

def full_or_early(*args):  # the interpreter runs resolve_row as Python
    if len(args) == 7 and not EARLY[0]:  # the first tier's call: (..., goal, EARLY)
        args = args[:6] + (False,)
    return _best_sorted(*args)

kernels.triton.resolve.best_sorted = full_or_early
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


def test_wide_band_narrows_then_sorts_each_tier(interpreted: Interpreted) -> None:
    out = interpreted(PRELUDE + WIDE_BAND)
    assert out["ok"], out["errors"]
    assert min(out["band"][:4]) > 1024  # every tier had to narrow its candidates first
    assert out["sizes"] == out["cpu_sizes"] and out["same"]
    assert max(out["sizes"][:4]) > 256  # a support reaching into the second tier
    assert out["sizes"][4] == 300  # the tie, decided on the second tier


def test_csr_with_zero_one_and_several_mask_rows(interpreted: Interpreted) -> None:
    out = interpreted(PRELUDE + CSR_SHAPES)
    assert len(out["cases"]) == 14
    for case in out["cases"]:
        mode = case.pop("mode")
        for name, (tri, cpu) in case.items():
            assert tri == cpu, (mode, name, tri, cpu)
        assert case["offsets"][0][0] == 0


# 16 lanes make 4-tile segments of 64 tokens, read unrolled (pass 1's short-segment path);
# 4 lanes make 16-tile segments, read by its loop (the path of large batches).
LANE_MODES = pytest.mark.parametrize(
    ("lanes", "reread"),
    [(16, False), (4, False), (4, True)],
    ids=["lanes_unrolled", "lanes_loop", "lanes_reread"],
)


def lane_mode(lanes: int, reread: bool) -> str:
    """The interpreted script's pass-1 settings for a LANE_MODES case."""
    return f"LANES = {lanes}\nREREAD = {reread}\n"


@LANE_MODES
def test_interpreted_grid_matches_oracle_and_torch_path(
    lanes: int, reread: bool, interpreted: Interpreted
) -> None:
    out = interpreted(PRELUDE + lane_mode(lanes, reread) + GRID)
    assert out["ok"], out["errors"]
    assert out["rows"] == 24
    assert out["fallback"] > 0  # the shrunken band sends some rows down the bisection path
    assert out["same_tokens"] and out["same_sizes"]


def test_lanes_pass_one_keeps_the_band_contract(interpreted: Interpreted) -> None:
    """band_lanes_kernel (64-token segments of 16, 4 or 64 lanes): each segment's max
    exact and its sum to rounding, candidates are real (z, id) keys with z exact, d_c is
    exactly the largest z left out, and more than KC ties at a segment max keep the lowest
    id among those written. The lane count changes which lane tops compete, so the lane
    counts may write different (equally valid) candidates. 64 lanes: a segment of one tile,
    the last one partial (60 tokens), so its reads are all masked. reread: lanes that let a
    band token go read their column again."""
    tried = [
        ("w16", {"lanes": 16}),
        ("w4", {"lanes": 4}),
        ("w64", {"lanes": 64}),
        ("w16r", {"lanes": 16, "reread": True}),
        ("w4r", {"lanes": 4, "reread": True}),
    ]
    out = interpreted(PRELUDE + f"TRIED = {tried!r}\n" + CONTRACT)
    assert out["stats_equal"] == [True] * len(tried)
    assert out["contract"] == [True] * len(tried)
    assert out["ties"] == [True] * len(tried)
    assert min(out["written"]) > 0


LOOK_AHEAD = """
from maskgate.kernels.triton.launch import launch_band
vocab = 700
g = torch.Generator().manual_seed(5)
x = adversarial_logits(list(ADVERSARIAL_KINDS), vocab, g)
x[0, 5] = float("nan")
x[1, 600:700] = float("-inf")  # the last segment's reads meet only -inf
b = x.shape[0]
temp = torch.tensor([1.0, 0.0, 0.5, 2.0] * 3)[:b]
same = []
# 16 tiles a segment (the last one, 60 tokens, partial: fewer than LOOK full tiles) and 8
for lanes, chunk, kw in [(4, 64, {}), (4, 64, {"reread": True}), (16, 128, {})]:
    outs = []
    for look in (1, 2, 3):
        cfg = band_config(vocab, chunk=chunk, kc=8, lanes=lanes, look=look, **kw)
        keys = torch.full((b, cfg.ncand), 12345, dtype=torch.int64)
        stats = [torch.full((b, cfg.n_chunks), 3.0) for _ in range(3)]
        launch_band(x, temp, keys, *stats, cfg)
        outs.append((keys, *stats))
    # bit for bit, NaN (the bad row's sums) included
    same.append([all(torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                                 c.view(torch.int32) if c.is_floating_point() else c)
                     for a, c in zip(outs[0], o)) for o in outs[1:]])
print(json.dumps({"same": same, "default_look": band_config(vocab, chunk=64, lanes=4).look}))
"""


def test_pass_one_reads_ahead_without_changing_its_outputs(interpreted: Interpreted) -> None:
    """Pass 1's loop reads 1, 2 or 3 tiles ahead of its work (band_config(look=...); 2 by
    default where a segment is longer than the tiles read whole): the same steps in the same
    order, so every output (candidate keys, segment max, sum, floor) is bit for bit the same,
    with the reread too, and on segments shorter than the look-ahead."""
    out = interpreted(PRELUDE + LOOK_AHEAD)
    assert out["same"] == [[True, True]] * 3
    assert out["default_look"] == 2


@LANE_MODES
def test_interpreted_edge_rows_match_torch_path(
    lanes: int, reread: bool, interpreted: Interpreted
) -> None:
    out = interpreted(PRELUDE + lane_mode(lanes, reread) + EDGES)
    for name in ("tokens", "support_sizes", "nan_rows", "mask_status", "mask_offsets", "masks"):
        tri, cpu = out[name]
        assert tri == cpu, (name, tri, cpu)
    assert out["nan_rows"][0] == [False, True, True, False, False, False, False]
    assert out["mask_status"][0][4:6] == [2, 1]
    assert out["masks"][0][0] == [0]
    assert out["logprob_close"]
    assert out["alone"][0] == out["alone"][1]


@pytest.mark.parametrize("lanes", [16, 4], ids=["unrolled", "loop"])
def test_confident_rows_decide_top_k_top_p_without_fallback(
    lanes: int, interpreted: Interpreted
) -> None:
    out = interpreted(PRELUDE + f"LANES = {lanes}\n" + PEAKED)
    assert out["ok"], out["errors"]
    assert out["fallback"] == [False] * 6
    assert out["sizes"] == out["cpu_sizes"]


RESCUE_TWO = (
    """
# Two bad segments in one row: segments a and b each hold ten of S's tokens in alternating
# ranks (a the even ranks 0-18, b the odd ranks 1-19) and write KC = 8 of them, so both
# floors lie in S: a's at rank 16, b's at rank 17. A rescue that reads only the segment with
# the highest floor lists every token above b's floor, not enough for an S of 20-24 tokens;
# the second round takes the third floor (far lower, an ordinary segment's) and reads both.
vocab = 1000
g = torch.Generator().manual_seed(13)
pairs = [(0, 9), (4, 15), (12, 2), (7, 8)]
b = len(pairs)
x = torch.randn(b, vocab, generator=g)
vals = 10.0 - 0.1 * torch.arange(24)
for r, (sa, sb) in enumerate(pairs):
    hot = []
    for i in range(10):  # rank 2i in a, 2i + 1 in b; lanes 0-9 (one token a lane)
        hot += [sa * 64 + i, sb * 64 + i]
    rest = [c * 64 + 20 + c for c in range(16) if c not in (sa, sb)][:4]
    x[r, torch.tensor(hot + rest)] = vals
temp = torch.ones(b)
k = torch.tensor([-1, 30, -1, -1], dtype=torch.int32)
p = torch.tensor([0.9, 0.95, 0.99, 0.93])
mp = torch.tensor([0.0, 0.0, 0.0, 0.01])
want = torch.ones(b, dtype=torch.bool)
seed = torch.arange(b) + 7
KC = 8
"""
    + RESCUE_CHECK
)

THREE_IN_A_LANE = """
# Three of S's tokens in lane 0 of segment 0 (ids 0, 16 and 32: the 1st, 4th and 7th
# largest), the rest of S one per later segment, so no segment holds more than KC = 8 of S.
# A lane keeps two tokens, lets id 32 go and the row floor lands inside S (the rescue
# decides); a lane that reads its column again once it has let a band token go lists all
# three, and the band decides alone.
vocab = 1024
g = torch.Generator().manual_seed(5)
b = 4
x = torch.randn(b, vocab, generator=g)
hot = [0, 100, 200, 16, 300, 400, 32, 500, 600, 700, 800, 900]
x[:, torch.tensor(hot)] = 10.0 - 0.1 * torch.arange(len(hot), dtype=torch.float32)
temp = torch.tensor([1.0, 1.0, 0.8, 1.0])
k = torch.tensor([-1, 50, -1, -1], dtype=torch.int32)
p = torch.tensor([0.9, 0.9, 0.95, 0.8])
mp = torch.zeros(b)
want = torch.ones(b, dtype=torch.bool)
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=64, seed=torch.arange(b) + 1)
ref = reference(x, temp, k, p, mp)
out = {}
for reread in (False, True):
    tri = sample_triton(inp, band_config(vocab, chunk=64, kc=8, lanes=16, reread=reread))
    rep = check_result(tri, ref, want, None, 64)
    out["reread" if reread else "plain"] = {"ok": rep.ok, "errors": rep.errors,
                                         "fallback": tri.fallback_rows.tolist(),
                                         "tokens": tri.tokens.tolist()}
print(json.dumps(out))
"""


def test_lanes_reading_again_decide_without_the_rescue(interpreted: Interpreted) -> None:
    """With the reread, three of S's tokens in one lane no longer push the band floor into
    S, so rows the plain lanes send to the rescue decide from the band, equal to the oracle,
    with the same seeded tokens."""
    out = interpreted(PRELUDE + THREE_IN_A_LANE)
    plain, reread = out["plain"], out["reread"]
    for case in (plain, reread):
        assert case["ok"], case["errors"]
    assert plain["fallback"] == [True] * 4
    assert reread["fallback"] == [False] * 4
    assert plain["tokens"] == reread["tokens"]


MANY_COLLIDED = """
# Every lane of segment 0 holds three tokens within DELTA of its max, and lane 9 holds three
# of S (ids 9, 25 and 41), the rest of S lying in later segments. A reread has to pick lane 9
# among sixteen collided lanes (more than a segment reads again) to drop the floor out of S.
vocab = 1024
g = torch.Generator().manual_seed(11)
b = 3
x = torch.randn(b, vocab, generator=g) * 0.5
for lane in range(16):
    x[:, torch.tensor([lane, 16 + lane, 32 + lane])] = 4.0 + 0.01 * lane
x[:, torch.tensor([9, 25, 41, 100, 200, 300])] = torch.tensor([10.0, 9.8, 9.6, 9.9, 9.7, 9.5])
temp = torch.ones(b)
k = torch.tensor([-1, 20, -1], dtype=torch.int32)
p = torch.tensor([0.9, 0.95, 0.8])
mp = torch.zeros(b)
want = torch.ones(b, dtype=torch.bool)
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=64, seed=torch.arange(b) + 3)
ref = reference(x, temp, k, p, mp)
out = {}
for name, reread in (("False", False), ("True", True)):
    tri = sample_triton(inp, band_config(vocab, chunk=64, kc=8, lanes=16, reread=reread))
    rep = check_result(tri, ref, want, None, 64)
    out[name] = {"ok": rep.ok, "errors": rep.errors, "fallback": tri.fallback_rows.tolist(),
                 "tokens": tri.tokens.tolist()}
print(json.dumps(out))
"""


def test_reread_picks_the_collided_lanes_that_matter(interpreted: Interpreted) -> None:
    """With more collided lanes than a segment reads again, the reread takes the ones that
    let the largest tokens go: the rows decide from the band, equal to the oracle."""
    out = interpreted(PRELUDE + MANY_COLLIDED)
    plain, reread = out["False"], out["True"]
    for case in (plain, reread):
        assert case["ok"], case["errors"]
    assert plain["fallback"] == [True] * 3
    assert reread["fallback"] == [False] * 3
    assert plain["tokens"] == reread["tokens"]


LOGIT_FLOOR = """
import json, sys, torch
from maskgate.kernels.order import ordered_bits, scaled_logits
from kernels_support.probes import floor_probe

g = torch.Generator().manual_seed(5)
fmax = torch.finfo(torch.float32).max
tiny = torch.finfo(torch.float32).tiny
ts = [0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 3e38, -3e38, fmax, -fmax, float("-inf"), 1e-30,
      -7.25, 123.456]
ts += (20 * torch.randn(34, generator=g)).tolist()
temps = [1.0, 0.7, 2.0, 1e-6, 1e-7, 0.0, 1e-5, 100.0]
pairs = [(t, T) for t in ts for T in temps][:512]
n = 512
t = torch.tensor([p[0] for p in pairs] + [0.0] * (n - len(pairs)))
temp = torch.tensor([p[1] for p in pairs] + [1.0] * (n - len(pairs)))
x_t = torch.empty(n)
ok = torch.empty(n, dtype=torch.int8)
floor_probe[(1,)](t, temp, x_t, ok, N=n)
# Every x within 64 floats of x_t, and of t * T, plus a spread of values and the specials.
near = torch.arange(-64, 65, dtype=torch.int32)
spread = torch.cat([300 * torch.randn(200, generator=g), torch.tensor(
    [0.0, -0.0, tiny, -tiny, 1e-45, -1e-45, fmax, -fmax, float("inf"), float("-inf"),
     float("nan")])])
bad = []
for i, (tv, T) in enumerate(pairs):
    if not ok[i]:
        continue
    centre = torch.tensor([float(x_t[i]), max(min(tv * T, fmax), -fmax)])
    o = ordered_bits(centre)[:, None] + near[None, :]
    o = o[(o >= int(ordered_bits(torch.tensor([float("-inf")])))) &
          (o <= int(ordered_bits(torch.tensor([float("inf")]))))]
    x = torch.cat([ordered_bits(o.flatten()).view(torch.float32), spread])
    z = scaled_logits(x[None], torch.tensor([T]))[0]
    if not torch.equal(x >= x_t[i], z > tv):
        bad.append([tv, T, float(x_t[i])])
print(json.dumps({"pairs": len(pairs), "ok": int(ok[: len(pairs)].sum()), "bad": bad[:5],
                  "n_bad": len(bad),
                  "not_ok": [pairs[i] for i in range(len(pairs)) if not ok[i]][:8]}))
"""


def test_logit_floor_is_the_exact_logit_threshold(interpreted: Interpreted) -> None:
    """logit_floor(t, T): x >= x_t exactly when RN(x / T) > t (greedy rows: x > t), checked
    for every float within 64 of x_t and of t * T, and a spread of values with the specials
    (+-0, denormals, +-FLT_MAX, +-inf, NaN), over 512 pairs of floors (-inf and the ends of
    the float range among them) and temperatures (greedy ones too). Only t near the ends of
    the range may come back without an x_t."""
    out = interpreted(LOGIT_FLOOR)
    assert out["n_bad"] == 0, out["bad"]
    assert out["ok"] >= out["pairs"] - 40, out["not_ok"]
    assert all(abs(t) > 1e37 for t, _ in out["not_ok"]), out["not_ok"]


GATHER = """
import json, sys, torch
from maskgate.kernels.order import pack_keys, scaled_logits
from kernels_support.probes import gather_probe

vocab, seg, temp = 1000, 256, 0.7  # 4 segments, the last one partial
g = torch.Generator().manual_seed(3)
x = 3 * torch.randn(vocab, generator=g)
x[5], x[300], x[777], x[778] = float("nan"), float("-inf"), float("inf"), x[779]
z = scaled_logits(x[None], torch.tensor([temp]))[0]
keys = pack_keys(z, torch.arange(vocab))
t = float(torch.sort(torch.nan_to_num(z, nan=-1e30), descending=True).values[60])
above = (z > t).nonzero().flatten()
want = sorted(keys[above].tolist())
# Segments 0 and 2 are complete above t (floors at or below it): their keys above t come
# from the candidates block. Segments 1 and 3 are read. The block also holds keys at or
# below t marked known and keys above t of a read segment marked unknown: neither may be
# written.
floors = torch.tensor([t - 1.0, t + 0.5, t, t + 2.0])
seg_of = torch.arange(vocab) // seg
cands = torch.cat([above[(seg_of[above] == 0) | (seg_of[above] == 2)],
                   torch.tensor([int((z <= t).nonzero()[0])]),
                   above[seg_of[above] == 1][:3]])
known = torch.ones(64, dtype=torch.int8)
known[len(cands) - 3:] = 0
block = torch.full((64,), -2**63, dtype=torch.int64)
block[:len(cands)] = keys[cands]
bz = torch.full((64,), float("-inf"))
bz[:len(cands)] = z[cands]
out = {"want": len(want)}
for limit in (256, 16):
    got = torch.zeros(1, dtype=torch.int32)
    scratch = torch.full((512,), 7, dtype=torch.int64)
    gather_probe[(1,)](x, torch.tensor([temp]), torch.tensor([t]), floors, block, bz, known,
                       got, scratch, vocab, 4, seg,
                       NCH=4, CB=64, LIMIT=limit, BLOCK=128)
    n = int(got)
    out[str(limit)] = {"count": n, "keys": sorted(scratch[:min(n, limit)].tolist()),
                       "untouched": int((scratch[limit:] == 7).sum())}
print(json.dumps({**out, "want_keys": want, "known_above": int(((z[cands] > t) & (known[:len(cands)] > 0)).sum())}))
"""


def test_gather_above_lists_every_token_above_its_floor(interpreted: Interpreted) -> None:
    """The rescue's gather, alone: every token with z > t, each once, from the candidates of
    the segments complete above t and from two reads of the others (NaN, -inf, +inf and tied
    logits among them, a partial last segment, two blocks a segment). Past LIMIT it returns
    the full count and writes nothing past LIMIT."""
    out = interpreted(GATHER)
    assert out["known_above"] > 0  # the candidates block supplied some of the keys
    full = out["256"]
    assert full["count"] == out["want"] == len(out["want_keys"]) > 16
    assert full["keys"] == out["want_keys"]
    short = out["16"]
    assert short["count"] == out["want"]
    assert short["untouched"] == 512 - 16
    assert set(short["keys"]) <= set(out["want_keys"])


@pytest.mark.parametrize("lanes", [16, 4], ids=["unrolled", "loop"])
def test_one_bad_segment_decides_from_one_read_of_that_segment(
    lanes: int, interpreted: Interpreted
) -> None:
    """A segment whose pass-1 floor lies inside S (three of S's tokens in one lane, or more
    than KC in one chunk): resolve_kernel lists every token above the second-largest segment
    floor (the other segments' candidates and one read of the bad segment) and decides,
    equal to the oracle, instead of bisecting over the row. The band was not enough, so the
    rows are counted as fallback rows."""
    out = interpreted(PRELUDE + NO_BISECTION + COUNT_SORTS + f"LANES = {lanes}\n" + RESCUE)
    assert out["ok"], out["errors"]
    assert all(s > n for s, n in zip(out["sizes"], out["band"], strict=True)), out
    assert out["fallback"] == [True] * 6
    # Per row, one threshold-search pick: the first tier's. It held every candidate above
    # the band floor, so the second tier (it would sort the same ones) is skipped, and the
    # rescue's keys fit a second tier, so they are sorted as gathered, with no search.
    assert out["sorts"] == 6
    assert out["sizes"] == out["cpu_sizes"]
    assert out["masks"] and out["tokens"]


@pytest.mark.parametrize("lanes", [16], ids=["lanes"])  # 16 a segment of 64: 32 tops, KC = 4
def test_rescue_picks_the_best_of_more_tokens_than_a_tier_holds(
    lanes: int, interpreted: Interpreted
) -> None:
    """A bad segment with more tokens above the second-largest floor than the second tier
    holds: the rescue gathers them all (up to four tiers), picks the best tier and decides,
    equal to the oracle, without the bisection (which the check replaces with an error)."""
    out = interpreted(PRELUDE + NO_BISECTION + f"LANES = {lanes}\n" + RESCUE_WIDE)
    assert out["ok"], out["errors"]
    assert out["band"] == [4] * 5 and min(out["sizes"]) > 4  # the floor inside S
    assert out["fallback"] == [True] * 5
    assert out["sizes"] == out["cpu_sizes"] and out["masks"] and out["tokens"]


@pytest.mark.parametrize("lanes", [16, 4], ids=["unrolled", "loop"])
def test_rescue_reads_two_bad_segments_in_a_second_round(
    lanes: int, interpreted: Interpreted
) -> None:
    """Two segments whose floors both lie in S: the rescue's first round (the segment with
    the highest floor) cannot decide, the second reads both and does, equal to the oracle,
    without the bisection (which the check replaces with an error)."""
    out = interpreted(PRELUDE + NO_BISECTION + f"LANES = {lanes}\n" + RESCUE_TWO)
    assert out["ok"], out["errors"]
    assert out["fallback"] == [True] * 4
    assert all(s > 17 for s in out["ref_sizes"]), out  # S reaches below both floors
    assert out["sizes"] == out["cpu_sizes"] and out["masks"] and out["tokens"]


PAST_TIER = """
# Top-p rows whose supports (about 140 tokens) outgrow the tiers' 64 keys, 160 high tokens
# z = 10 - 0.01 * rank over the 16 segments of 64, four written by each (KC = 4), so every
# floor lies in S. Row 0 spreads them evenly: the rescue's first round gathers more than 64
# tokens, keeps its best 64 and decides that the support runs past them. Row 1 puts ranks
# 0-9 in segments 0 and 1 (five each) and the rest in the other 14: the first round gathers
# the few tokens above the second floor (3), all kept, and the tier's 61 slots left can only
# hold tokens of z <= that floor, too little mass for top-p either way (before, a second
# round read two segments to fill the tier). Both are exact with
# top-p alone, so no later round can decide them; and pass 1's lists and segment sums
# already prove it (band_past_tier), so with it on they take no round at all. Row 0 with
# top-k on (k = 150 may cut right after the tier) runs the rescue's rounds as before.
import maskgate.kernels.triton.resolve
from maskgate import kernels
GATHERS = []
_gather_above = kernels.triton.resolve.gather_above
_band_past_tier = kernels.triton.resolve.band_past_tier

def counting_gather_above(*args):  # the interpreter runs resolve_row as Python
    GATHERS.append(1)
    return _gather_above(*args)

def no_band_past_tier(*args):  # pass 1's proof off: the rescue's rounds must stop the row
    return args[9] != args[9]  # False, as a Triton value (z_max is not NaN)

kernels.triton.resolve.gather_above = counting_gather_above
vocab = 1000
g = torch.Generator().manual_seed(23)
x = torch.randn(2, vocab, generator=g) * 0.5
rank = torch.arange(160)
x[0, (rank % 16) * 64 + (rank // 16) * 4 + (rank % 3)] = 10.0 - 0.01 * rank
top, rest = rank[:10], rank[10:] - 10
x[1, (top % 2) * 64 + top // 2] = 10.0 - 0.01 * top
x[1, (2 + rest % 14) * 64 + rest // 14] = 10.0 - 0.01 * (rest + 10)
temp = torch.ones(1)
p = torch.tensor([0.95])
mp = torch.zeros(1)
want = torch.ones(1, dtype=torch.bool)
out = {"ok": True, "errors": [], "gathers": [], "fallback": [], "sizes": []}
for r, k, proof in ((0, -1, True), (0, 150, True), (0, -1, False), (1, -1, True), (1, -1, False)):
    kernels.triton.resolve.band_past_tier = _band_past_tier if proof else no_band_past_tier
    kk = torch.tensor([k], dtype=torch.int32)
    xr = x[r : r + 1]
    inp = check_inputs(xr, temp, kk, p, mp, want, max_mask_tokens=256, seed=torch.arange(1))
    GATHERS.clear()
    tri = sample_triton(inp, band_config(vocab, chunk=64, kc=4, lanes=16))
    rep = check_result(tri, reference(xr, temp, kk, p, mp), want, None, 256)
    out["ok"] &= rep.ok
    out["errors"] += rep.errors
    out["gathers"].append(len(GATHERS))
    out["fallback"] += tri.fallback_rows.tolist()
    out["sizes"] += tri.support_sizes.tolist()
print(json.dumps(out))
"""


def test_rescue_stops_once_a_top_p_support_outgrows_the_tier(interpreted: Interpreted) -> None:
    out = interpreted(PRELUDE + PAST_TIER)
    assert out["ok"], out["errors"]
    assert out["fallback"] == [True] * 5
    assert min(out["sizes"]) > 64  # longer than the tiers' 64 keys
    # top-p alone: pass 1 proves it, no round; with top-k on: the rounds still run
    assert out["gathers"][0] == 0 and out["gathers"][1] > 1
    # without that proof, one round each: a full tier kept (row 0), or too little mass in
    # a tier that holds every token above the floor and the floor's z after them (row 1)
    assert out["gathers"][2] == 1 and out["gathers"][4] == 1
    assert out["gathers"][3] == 0


COUNT_READS = """
import maskgate.kernels.triton.fallback
from maskgate import kernels
READS = []  # one entry per read of a row by the fallback's threshold searches
for _name in ("_above3", "_level_ids3", "_cut_listed"):
    def _counted(*args, _f=getattr(kernels.triton.fallback, _name), _n=_name):
        READS.append(_n)
        return _f(*args)
    setattr(kernels.triton.fallback, _name, _counted)
"""

WHOLE_ROW = """
import maskgate.kernels.triton.resolve
from maskgate import kernels
DRAWS = []  # draws that read the whole row (the other fallback rows draw from their list)
_draw = kernels.triton.resolve.fallback_draw
def _drawn(*args):
    DRAWS.append(1)
    return _draw(*args)
kernels.triton.resolve.fallback_draw = _drawn
GATHERS = []  # reads that list S after the search (the search's last read lists it when it can)
_gather = kernels.triton.resolve.fallback_gather
def _gathered(*args):
    GATHERS.append(1)
    return _gather(*args)
kernels.triton.resolve.fallback_gather = _gathered

# Rows that only the fallback decides (the band of 64-token chunks with 8 candidates each
# lists too few), chosen so that its cut lands inside a run of tied z: top-k and top-p
# splitting a tie, a dyadic top-p boundary exactly on a token, min-p alone, nothing at all.
vocab = 300
g = torch.Generator().manual_seed(11)
x = torch.randn(9, vocab, generator=g)
x[0] = 0.0                                   # all tied: top-k 100 keeps ids 0..99
x[1] = torch.round(x[1] * 2) / 2             # a few levels of ties, top-p 0.5
x[2, :256] = 0.0; x[2, 256:] = float("-inf")  # 256 tied: top-p 0.5 keeps exactly 128
x[3, 7] = float("-inf")                      # nothing truncates: every finite token
x[4, 7] = float("-inf")                      # nothing truncates, bounded: the best cap
x[6] = torch.round(x[6] * 4) / 4             # ties, top-k 150 + top-p 0.9
temp = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0, 0.7, 1.3])
k = torch.tensor([100, -1, -1, -1, -1, -1, 150, 40, -1], dtype=torch.int32)
p = torch.tensor([1.0, 0.5, 0.5, 1.0, 1.0, 1.0, 0.9, 1.0, 0.97])
mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0])
want = torch.ones(9, dtype=torch.bool)
bounded = torch.tensor([False, True, False, False, True, False, True, False, True])
seed = torch.arange(9, dtype=torch.int64) * 7 + 1
cap = 128
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=cap, seed=seed, bounded=bounded)
cfg = band_config(vocab, chunk=64, kc=8, lanes=16)
out = {}
for r in range(9):  # one row a call, so each row's reads are counted alone
    READS.clear()
    DRAWS.clear()
    GATHERS.clear()
    one = check_inputs(x[r:r+1], temp[r:r+1], k[r:r+1], p[r:r+1], mp[r:r+1], want[r:r+1],
                       max_mask_tokens=cap, seed=seed[r:r+1], bounded=bounded[r:r+1])
    tri = sample_triton(one, cfg)
    out[r] = {"reads": len(READS), "draws": len(DRAWS), "fallback": bool(tri.fallback_rows[0]),
              "gathers": len(GATHERS), "listing_reads": READS.count("_cut_listed"),
              "alone": [int(tri.tokens[0]), float(tri.logprobs[0]), tri.masks()[0]]}
tri = sample_triton(inp, cfg)
for r in range(9):  # the batch's rows against the same rows alone (batch invariance)
    out[r]["same_alone"] = out[r].pop("alone") == [int(tri.tokens[r]), float(tri.logprobs[r]),
                                                   tri.masks()[r]]
cpu = sample_torch(inp)
ref = reference(x, temp, k, p, mp)
rep = check_result(tri, ref, want, bounded, cap)
print(json.dumps({"ok": rep.ok, "errors": rep.errors, "ambiguous": ref.ambiguous.tolist(),
                  "rows": out, "sizes": tri.support_sizes.tolist(),
                  "ref_sizes": ref.support_sizes.tolist(), "status": tri.mask_status.tolist(),
                  "tokens": torch.equal(tri.tokens, cpu.tokens), "masks": tri.masks() == cpu.masks(),
                  "logprob": bool(torch.allclose(tri.logprobs, cpu.logprobs, atol=1e-5))}))
"""


def test_fallback_cuts_inside_ties_and_reads_the_row_a_few_times(
    interpreted: Interpreted,
) -> None:
    """The fallback (rows the band cannot decide) equals the oracle and the torch path where
    its cut splits a run of tied z (top-k through a tie, top-p through ties, a dyadic top-p
    boundary that lands exactly on a token), on min-p alone and on rows nothing truncates
    (exact mode overflows the cap, bounded mode gets the best cap). Its cost is in reads of
    the row: at most 16 for the cut's z (three thresholds a read over 2^32 values), ending
    early with one read that lists the tokens left between the bracket's ends once they fit
    a tier, a few more to place a cut inside a long tie, one when only min-p or nothing
    cuts (the old bisection: 64 to 128). A mask row whose support fits the mask's block
    then reads the row once more, to list S, and draws from that list, unless the search's
    last read (the one that lists the bracket) had room to list S as well; a longer support
    draws over the row."""
    out = interpreted(PRELUDE + COUNT_READS + WHOLE_ROW)
    assert out["ok"], out["errors"]
    assert not any(out["ambiguous"])
    assert out["tokens"] and out["masks"] and out["logprob"]
    assert out["ref_sizes"][0] == 100 and out["ref_sizes"][2] == 128
    assert out["ref_sizes"][3] == 299 and out["status"][3] == 1  # exact mode: overflow
    rows = out["rows"]
    assert all(rows[str(r)]["fallback"] for r in range(9)), rows
    # each row alone (one mask row, no packing) gives its token, log-prob and mask in the batch
    assert all(rows[str(r)]["same_alone"] for r in range(9)), rows
    reads = [rows[str(r)]["reads"] for r in range(9)]
    assert reads[3] == reads[5] == 1, reads  # nothing or min-p alone: one read counts the cut
    assert 1 < reads[4] <= 1 + 16 + 9, reads  # bounded: then a search for the best cap
    assert reads[1] < 10, reads  # few tokens per tie: the bracket is listed early
    assert reads[0] > 16, reads  # top-k 100 through 300 tied: the ids are searched
    assert max(reads) <= 2 * 16 + 9, reads  # top-k + top-p: two z searches, one id search
    # A mask row whose support fits the mask's block (128 tokens) draws from the list it
    # gathers; a longer one (rows 3 to 5: 299 tokens) reads the row to draw.
    draws = [rows[str(r)]["draws"] for r in range(9)]
    assert draws == [int(n > 128) for n in out["sizes"]], (draws, out["sizes"])
    assert draws.count(0) >= 5, (draws, out["sizes"])
    # Rows 1 and 6 end on a listed bracket with all of S in the block: that read listed S,
    # and no read follows. Rows 0 and 2 cut inside a tie (no bracket list): one read lists S.
    gathers = [rows[str(r)]["gathers"] for r in range(9)]
    assert gathers[1] == gathers[6] == 0, gathers
    assert rows["1"]["listing_reads"] >= 1 and rows["6"]["listing_reads"] >= 1, rows
    assert gathers[0] == gathers[2] == 1, gathers


HALF_SORT = """
import triton.language as tl
import maskgate.kernels.triton.resolve
from maskgate import kernels
kernels.triton.resolve.HALF_SORT_MIN = tl.constexpr(64)  # cap 128: halves of 64 keys
import maskgate.kernels.triton.sort
from maskgate import kernels
kernels.triton.sort.SORT_RUN = tl.constexpr(16)  # sorts in runs of 16, then merges
kernels.triton.sort.MERGE_MIN = tl.constexpr(32)
BLOCKS = []  # (|S|, the block its listed draw sorts in), one a call
_sized_fn = kernels.triton.resolve.sort_and_store
def _sized(*args):
    BLOCKS.append((int(args[2]), int(args[-1])))
    return _sized_fn(*args)
kernels.triton.resolve.sort_and_store = _sized
"""

HALF_SORT_OUT = """
print(json.dumps({"ok": rep.ok, "errors": rep.errors, "blocks": BLOCKS,
                  "tokens": torch.equal(tri.tokens, cpu.tokens), "masks": tri.masks() == cpu.masks(),
                  "logprob": bool(torch.allclose(tri.logprobs, cpu.logprobs, atol=1e-5))}))
"""


def test_fallback_sorts_a_short_support_in_half_the_block(interpreted: Interpreted) -> None:
    """With mask blocks past HALF_SORT_MIN, a fallback row whose S fits half the block is
    sorted, drawn and written in half a block, and the rest in the whole block: the
    oracle's supports and the torch path's tokens, masks and log-probs either way. The
    sorts go through runs of 16 keys and their merges (SORT_RUN)."""
    out = interpreted(PRELUDE + COUNT_READS + HALF_SORT + WHOLE_ROW + HALF_SORT_OUT)
    assert out["ok"], out["errors"]
    assert out["tokens"] and out["masks"] and out["logprob"]
    assert all(block == (64 if n <= 64 else 128) for n, block in out["blocks"]), out["blocks"]
    assert {block for _, block in out["blocks"]} == {64, 128}, out["blocks"]


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
    """triton_sort.sort_desc equals torch's descending sort, the unused slots last as
    EMPTY_KEY: one tl.sort (RUN == the block), or runs of 32 and 8 keys and 3 and 4 merge
    levels; with equal keys across runs, and with 0, 1, an odd number and all slots used."""
    out = interpreted(SORT_DESC)
    assert out == {"256/256": True, "256/32": True, "128/8": True}, out


THRESHOLDS = """
import json, math
import numpy as np
import torch, triton, triton.language as tl
from maskgate.kernels.triton.common import ordered32
from maskgate.kernels.triton.fallback import _thresholds

@triton.jit
def thresholds(f_ptr, i_ptr, out, G: tl.constexpr):
    v_lo, v_hi, v_top = tl.load(f_ptr), tl.load(f_ptr + 1), tl.load(f_ptr + 2)
    m_lo, m_hi, z_norm = tl.load(f_ptr + 3), tl.load(f_ptr + 4), tl.load(f_ptr + 5)
    top_p, min_p, z_max = tl.load(f_ptr + 6), tl.load(f_ptr + 7), tl.load(f_ptr + 8)
    c_lo, c_hi = tl.load(i_ptr).to(tl.int32), tl.load(i_ptr + 1).to(tl.int32)
    k, reads = tl.load(i_ptr + 2), tl.load(i_ptr + 3).to(tl.int32)
    lo = ordered32(v_lo).to(tl.int64)
    hi = ordered32(v_hi).to(tl.int64)
    top = ordered32(v_top).to(tl.int64)
    q1, q2, q3 = _thresholds(
        lo, hi, top, reads, (c_lo, m_lo, c_hi, m_hi), (k, z_norm, top_p, min_p, z_max), G
    )
    tl.store(out, q1)
    tl.store(out + 1, q2)
    tl.store(out + 2, q3)

def as_float(o):
    o = int(o)
    return float(np.array([o ^ (0x7FFFFFFF if o < 0 else 0)], np.int64).astype(np.int32).view(np.float32)[0])

inf, OFF = float("inf"), 2**40
cases = {  # v_lo, v_hi, top, m_lo, m_hi, z_norm, top_p, min_p, z_max; c_lo, c_hi, k, reads
    "first": ([-inf, 3.0, 3.0, 0, 0, 10, 0.95, 0, 3.0], [-1, 0, OFF, 0]),
    "open": ([-inf, -13.0, 3.0, 0, 9.9, 10, 0.95, 0, 3.0], [-1, 40000, OFF, 1]),
    "top_p": ([-16.0, -8.0, 0.0, 9.99, 9.0, 10, 0.95, 0, 0.0], [20000, 1000, OFF, 1]),
    "top_k": ([-16.0, -8.0, 0.0, 9.99, 9.0, 10, 2.0, 0, 0.0], [20000, 1000, 5000, 1]),
    "min_p": ([-16.0, -8.0, 0.0, 9.99, 9.0, 10, 2.0, math.exp(-10.0), 0.0], [20000, 1000, OFF, 1]),
    "missed": ([-16.0, -8.0, 0.0, 9.99, 9.0, 10, 0.9995, 0, 0.0], [20000, 1000, OFF, 1]),
    "late": ([-16.0, -1.0, 0.0, 9.99, 9.0, 10, 0.95, 0, 0.0], [20000, 1000, OFF, 5]),
    # more than AIM_SPAN * G tokens between the ends: a row's bulk, not its tail
    "bulk": ([-1.75, 2.25, 2.25, 9.999, 0.0, 10, 0.95, 0, 2.25], [151884, 0, OFF, 1]),
    "bulk_aimed": ([-1.75, 2.25, 2.25, 9.999, 0.0, 10, 0.95, 0, 2.25], [65536, 0, OFF, 1]),
}
out = {}
for name, (f, i) in cases.items():
    q = torch.zeros(3, dtype=torch.int64)
    thresholds[(1,)](torch.tensor(f, dtype=torch.float32), torch.tensor(i, dtype=torch.int64), q, G=1024)
    out[name] = {"z": [as_float(v) for v in q.tolist()], "o": q.tolist()}
print(json.dumps(out))
"""


def test_search_thresholds_first_open_aimed_and_quartered(interpreted: Interpreted) -> None:
    """cut_key's thresholds (_thresholds): 16, 8 and 4 nats under the max first, 48, 32 and
    16 under the upper end while the lower one is open; once both ends are counted, aimed
    at the cut that models fitted to the ends give (the mass below v and the count above v
    exponential in v): top-p, top-k and min-p (exact), the outer ones AIM * G = 256
    modelled tokens either side; quarters in z when the estimate falls outside the bracket
    or more than AIM_SPAN * G = 65536 tokens lie between the ends, and in ordered32 space
    after Z_READS reads."""
    out = interpreted(THRESHOLDS)
    assert out["first"]["z"] == [-13.0, -5.0, -1.0], out["first"]
    assert out["open"]["z"] == [-61.0, -45.0, -29.0], out["open"]
    rate = math.log(20000 / 1000) / 8  # the count model between the ends
    count = lambda v: 1000 * math.exp(rate * (-8.0 - v))  # noqa: E731
    cuts = {
        "top_p": -8.0 - 8.0 * math.log(1.0 / 0.5) / math.log(1.0 / 0.01),  # the tail model
        "top_k": -8.0 - math.log(5000 / 1000) / rate,
        "min_p": -10.0,
    }
    for name, cut in cuts.items():
        z1, z2, z3 = out[name]["z"]
        assert -16.0 < z1 < z2 < z3 < -8.0, (name, out[name])
        assert z2 == pytest.approx(cut, abs=1e-4), (name, out[name], cut)
        assert count(z1) == pytest.approx(count(z2) + 256, rel=1e-3), (name, out[name])
        assert count(z3) == pytest.approx(count(z2) - 256, rel=1e-3), (name, out[name])
    assert out["missed"]["z"] == [-14.0, -12.0, -10.0], out["missed"]
    assert out["bulk"]["z"] == [-0.75, 0.25, 1.25], out["bulk"]
    assert out["bulk_aimed"]["z"] != out["bulk"]["z"], out["bulk_aimed"]
    assert -1.75 < out["bulk_aimed"]["z"][0] < out["bulk_aimed"]["z"][2] < 2.25, out["bulk_aimed"]
    lo, hi = _ordered32(-16.0), _ordered32(-1.0)  # four binades: not the quarters in z
    span = hi - lo
    assert out["late"]["o"] == [lo + span // 4, lo + span // 2, lo + span * 3 // 4], out["late"]


def _ordered32(v: float) -> int:
    """kernels.triton.common.ordered32 of a float32, in Python."""
    bits = struct.unpack("<i", struct.pack("<f", v))[0]
    return bits ^ 0x7FFFFFFF if bits < 0 else bits


RANDOM_ROWS = """
import maskgate.kernels.triton.fallback
from maskgate import kernels
import maskgate.kernels.triton.resolve
from maskgate import kernels
from kernels_support.fuzz import run_batch

S_OUT = []  # per bracket list of the whole-row search: whether that read listed S too
_cut_listed = kernels.triton.fallback._cut_listed
def _listing(*args):
    out = _cut_listed(*args)
    S_OUT.append(bool(out[3]))
    return out
kernels.triton.fallback._cut_listed = _listing
GATHERS = []  # reads that list S after the search
_gather = kernels.triton.resolve.fallback_gather
def _gathered(*args):
    GATHERS.append(1)
    return _gather(*args)
kernels.triton.resolve.fallback_gather = _gathered

# kernels_support.workloads.random_batch's seeds 112 and 115 cut ties of 0.0 and -0.0.
runs = [run_batch(seed) for seed in (112, 115, 100)]
print(json.dumps({"runs": runs, "s_out": S_OUT, "gathers": len(GATHERS)}))
"""


def test_random_rows_match_oracle_and_torch_path(interpreted: Interpreted) -> None:
    """Seeded random batches (kernels_support.fuzz: ties at 0.0 and -0.0, -inf tokens,
    temperatures 0.7 to 2, fp32 and bf16, every setting, caps of 16 to 256), most rows in the
    rescue or the whole-row fallback, whose S is listed both by the search's last read and
    by a read of its own: the oracle's supports, and the torch path's tokens and
    masks on every row the oracle does not flag (the torch path once put -0.0 after 0.0 in
    its full sort; these seeds found it)."""
    out = interpreted(PRELUDE + RANDOM_ROWS)
    runs = out["runs"]
    assert all(r["ok"] for r in runs), [r["errors"] for r in runs]
    assert sum(r["rows"] for r in runs) == 36 and sum(r["fallback"] for r in runs) >= 12, runs
    assert all(r["token_diff"] == [] and r["mask_diff"] == [] for r in runs), runs
    # Both ways of listing a fallback row's S ran: by the search's bracket read (S_OUT) and
    # by a read of its own after the search.
    assert any(out["s_out"]) and not all(out["s_out"]) and out["gathers"] >= 1, out


PLAIN_ROWS = """
import maskgate.kernels.triton.resolve
from maskgate import kernels
WHOLE_READS = []  # rows that drew by reading the whole row in resolve_kernel
_draw = kernels.triton.resolve.fallback_draw
def _counted(*args):
    WHOLE_READS.append(1)
    return _draw(*args)
kernels.triton.resolve.fallback_draw = _counted

# Rows nothing truncates (top-k off, at V or past it; top-p 1; min-p 0), most asking for no
# mask, among rows that truncate, a greedy row and a NaN row; five 64-token segments a row.
vocab = 300
g = torch.Generator().manual_seed(5)
B = 10
x = torch.randn(B, vocab, generator=g) * 2
x[1] = torch.round(x[1] * 2) / 2       # ties: the race's tie rule (earlier in design order)
x[2, :40] = float("-inf")               # -inf tokens are never drawn nor counted
x[3] = 0.0                              # every token tied
x[8, 17] = float("nan")                 # flagged, never sampled
temp = torch.tensor([1.0, 1.0, 0.7, 1.0, 1.5, 1.0, 0.0, 1.0, 1.0, 2.0])
k = torch.tensor([-1, -1, vocab, -1, -1, 20, -1, vocab + 4, -1, -1], dtype=torch.int32)
p = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0])
mp = torch.zeros(B)
want = torch.tensor([False, False, False, False, True, True, False, False, False, False])
seed = torch.arange(B, dtype=torch.int64) * 3 + 1
step = torch.full((B,), 4, dtype=torch.int64)
cap = 128
inp = check_inputs(x, temp, k, p, mp, want, max_mask_tokens=cap, seed=seed, step=step)
cfg = band_config(vocab, chunk=64, kc=8, lanes=16)
tri = sample_triton(inp, cfg)
reads = len(WHOLE_READS)
cpu = sample_torch(inp)
ref = reference(x, temp, k, p, mp)
rep = check_result(tri, ref, want, None, cap)
alone = []
for r in (0, 3, 9):
    one = check_inputs(x[r:r+1], temp[r:r+1], k[r:r+1], p[r:r+1], mp[r:r+1], want[r:r+1],
                       max_mask_tokens=cap, seed=seed[r:r+1], step=step[r:r+1])
    alone.append(int(sample_triton(one, cfg).tokens[0]) == int(tri.tokens[r]))
half = check_inputs(x.to(torch.bfloat16), temp, k, p, mp, want, max_mask_tokens=cap, seed=seed,
                    step=step)
tri16, cpu16 = sample_triton(half, cfg), sample_torch(half)
print(json.dumps({"ok": rep.ok, "errors": rep.errors, "reads": reads, "alone": alone,
                  "tokens": tri.tokens.tolist(), "cpu_tokens": cpu.tokens.tolist(),
                  "logprob_err": float((tri.logprobs - cpu.logprobs).nan_to_num().abs().max()),
                  "sizes": tri.support_sizes.tolist(), "cpu_sizes": cpu.support_sizes.tolist(),
                  "fallback": tri.fallback_rows.tolist(), "nan": tri.nan_rows.tolist(),
                  "bf16_tokens": torch.equal(tri16.tokens, cpu16.tokens)}))
"""


def test_plain_rows_draw_in_pass_one(interpreted: Interpreted) -> None:
    """Rows nothing truncates that ask for no mask (plain temperature sampling) take their
    token from pass 1's race, segment by segment, and resolve_kernel reads none of their row:
    the torch path's tokens (ties, -inf tokens and a row of one value included, fp32 and
    bf16), the same token alone, log-probs within 1e-5, every finite token counted in the
    support, no fallback. A row nothing truncates that asks for a mask still reads its row
    (its mask is the row in design order), and a NaN row is flagged."""
    out = interpreted(PRELUDE + PLAIN_ROWS)
    assert out["ok"], out["errors"]
    plain = [0, 1, 2, 3, 7, 9]
    assert [out["tokens"][r] for r in plain] == [out["cpu_tokens"][r] for r in plain], out
    assert all(out["alone"]) and out["bf16_tokens"], out
    assert out["logprob_err"] < 1e-5
    assert [out["sizes"][r] for r in plain] == [300, 300, 260, 300, 300, 300]
    assert out["sizes"] == out["cpu_sizes"]
    assert not any(out["fallback"][r] for r in plain), out["fallback"]
    assert out["reads"] == 1  # row 4 only: nothing truncates it, and it asks for a mask
    assert out["nan"][8] and not any(out["nan"][:8])
