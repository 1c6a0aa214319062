"""The whole Triton path (sample_triton: pass 1, resolve, emit) through the Triton
interpreter against the float64 oracle and the torch path: the adversarial grid, edge rows
and seeded random batches, with pass 1 unrolled, looped and rereading.

Each check runs in a fork of a process that imported Triton under TRITON_INTERPRET=1
(tests/unit/conftest.py) and reports JSON on stdout. Sizes are small (the interpreter runs
every program in numpy), with a shrunken band (segments of 64, 8 candidates each) so that
several segments, the tiers, the rescue and the whole-row fallback all run.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from kernels_support.checks import PRELUDE

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


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


RANDOM_ROWS = """
import maskgate.kernels.triton.fallback as fallback_mod
import maskgate.kernels.triton.whole_row as whole_row_mod
from kernels_support.fuzz import run_batch

S_OUT = []  # per bracket list of the whole-row search: whether that read listed S too
def _listing(*args):
    out = _cut_listed(*args)
    S_OUT.append(bool(out[3]))
    return out
_cut_listed = patch(fallback_mod, "_cut_listed", _listing)
GATHERS = []  # reads that list S after the search
def _gathered(*args):
    GATHERS.append(1)
    return _gather(*args)
_gather = patch(whole_row_mod, "fallback_gather", _gathered)

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
