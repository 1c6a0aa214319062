"""The rescue (triton/rescue.py, and reads.gather_above) through the Triton interpreter:
rows whose band floor lies inside S decide from a read of the bad segments instead of the
whole-row fallback, in one round or two; the gather and its logit threshold alone; and the
rounds stopping once a top-p support outgrows the tier.

Each check runs in a fork of a process that imported Triton under TRITON_INTERPRET=1
(tests/unit/conftest.py) and reports JSON on stdout. The checks of rows the rescue must
decide replace the whole-row fallback's search with an error (NO_BISECTION), so a row that
reaches it fails the check.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from kernels_support.checks import PRELUDE

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


NO_BISECTION = """
import maskgate.kernels.triton.whole_row as whole_row_mod
def no_bisection(*args, **kwargs):  # the interpreter runs resolve_row as Python
    raise AssertionError("the bisection fallback ran")

patch(whole_row_mod, "fallback_support", no_bisection)
"""


COUNT_SORTS = """
import maskgate.kernels.triton.rescue as rescue_mod
import maskgate.kernels.triton.resolve as resolve_mod
SORTS = []  # one entry per best_sorted call: the tiers and the rescue's picks
_best_sorted = resolve_mod.best_sorted

def counting_best_sorted(*args):  # the interpreter runs resolve_row as Python
    SORTS.append(1)
    return _best_sorted(*args)

patch(resolve_mod, "best_sorted", counting_best_sorted)  # the first tier
patch(rescue_mod, "best_sorted", counting_best_sorted)  # the second tier, the rescue
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
import maskgate.kernels.triton.rescue as rescue_mod
GATHERS = []
_band_past_tier = rescue_mod.band_past_tier

def counting_gather_above(*args):  # the interpreter runs resolve_row as Python
    GATHERS.append(1)
    return _gather_above(*args)

def no_band_past_tier(*args):  # pass 1's proof off: the rescue's rounds must stop the row
    return args[9] != args[9]  # False, as a Triton value (z_max is not NaN)

_gather_above = patch(rescue_mod, "gather_above", counting_gather_above)
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
    patch(rescue_mod, "band_past_tier", _band_past_tier if proof else no_band_past_tier)
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
