"""Pass 1 (band_lanes_kernel, triton/pass1.py, band.py and race.py) through the Triton
interpreter (TRITON_INTERPRET=1): the band contract of every segment's statistics and
candidates, the look-ahead's bit-identical outputs, the reread of collided lanes, and the
race of the rows nothing truncates.

The variable must be set before triton is imported, so each check runs in a fork of a
process that imported Triton under it, and reports JSON on stdout (tests/unit/conftest.py).
Sizes are small (the interpreter runs every program in numpy), with a shrunken band.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from kernels_support.checks import PRELUDE

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)


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


PLAIN_ROWS = """
import maskgate.kernels.triton.whole_row as whole_row_mod
WHOLE_READS = []  # rows that drew by reading the whole row in resolve_kernel
def _counted(*args):
    WHOLE_READS.append(1)
    return _draw(*args)
_draw = patch(whole_row_mod, "fallback_draw", _counted)

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
