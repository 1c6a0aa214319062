"""The whole-row fallback (triton/whole_row.py, fallback.py, thresholds.py, reads.py) through
the Triton interpreter: cuts inside ties with its reads of the row counted, a short support
sorted in half the mask block, and the search's thresholds alone.

Each check runs in a fork of a process that imported Triton under TRITON_INTERPRET=1
(tests/unit/conftest.py) and reports JSON on stdout.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from kernels_support.checks import PRELUDE

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


COUNT_READS = """
import maskgate.kernels.triton.fallback as fallback_mod
READS = []  # one entry per read of a row by the fallback's threshold searches
for _name in ("above3", "level_ids3", "_cut_listed"):
    def _counted(*args, _f=getattr(fallback_mod, _name), _n=_name):
        READS.append(_n)
        return _f(*args)
    patch(fallback_mod, _name, _counted)
"""


WHOLE_ROW = """
import maskgate.kernels.triton.whole_row as whole_row_mod
DRAWS = []  # draws that read the whole row (the other fallback rows draw from their list)
def _drawn(*args):
    DRAWS.append(1)
    return _draw(*args)
_draw = patch(whole_row_mod, "fallback_draw", _drawn)
GATHERS = []  # reads that list S after the search (the search's last read lists it when it can)
def _gathered(*args):
    GATHERS.append(1)
    return _gather(*args)
_gather = patch(whole_row_mod, "fallback_gather", _gathered)

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
import maskgate.kernels.triton.sort as sort_mod
import maskgate.kernels.triton.whole_row as whole_row_mod
patch(whole_row_mod, "HALF_SORT_MIN", tl.constexpr(64))  # cap 128: halves of 64 keys
patch(sort_mod, "SORT_RUN", tl.constexpr(16))  # sorts in runs of 16, then merges
patch(sort_mod, "MERGE_MIN", tl.constexpr(32))
BLOCKS = []  # (|S|, the block its listed draw sorts in), one a call
def _sized(*args):
    BLOCKS.append((int(args[2]), int(args[-1])))
    return _sized_fn(*args)
_sized_fn = patch(whole_row_mod, "sort_and_store", _sized)
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


THRESHOLDS = """
import json, math
import numpy as np
import torch, triton, triton.language as tl
from maskgate.kernels.triton.common import ordered32
from maskgate.kernels.triton.thresholds import thresholds as search_thresholds

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
    q1, q2, q3 = search_thresholds(
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
    """cut_key's thresholds (thresholds.thresholds): 16, 8 and 4 nats under the max first, 48, 32 and
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
    """triton.common.ordered32 of a float32, in Python."""
    bits = struct.unpack("<i", struct.pack("<f", v))[0]
    return bits ^ 0x7FFFFFFF if bits < 0 else bits
