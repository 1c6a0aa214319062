"""Latency of the building blocks of resolve_kernel's per-row decision, one program per row.

resolve_kernel is latency-bound (one program per row, 128 rows fill one wave of the H200), so
what matters is the serial cost of each block-wide step. This times, in isolation and from
CUDA graph replays of 128 programs:

  sort<T>     tl.sort of T packed int64 keys (the current tier-1 ordering)
  rank<T>     the rank and mass-before of each of T keys by counting (no sort)
  reduce16    16 dependent block-wide sums over 2048 values (a bisection's cost)
  bracket2    two 16-way threshold brackets over 2048 values (replacing an 8-step bisection)

with --search ROWS.pt, the whole-row fallback's reads of one row (SmolLM2's rows, V = 49152,
one program a row, the first 128 rows of bench/real_rows.py's file):

  max<B>      the loads and an elementwise max (blocks of B tokens, the next one loaded ahead)
  above3<B>   triton_fallback._above3 at three thresholds 8, 10 and 12 nats below the max
              (a search read; _t07: at temperature 0.7, where each logit is divided)
  above7<B>   the same counts and masses at seven thresholds (what a read with more
              thresholds, and fewer reads a search, would cost)
  listed      triton_fallback._cut_listed: the read that lists a bracket and S, its
              1024-key sort and the cut
  draw        triton_fallback.fallback_draw: the Gumbel race over the row

with --sort, the sort of a fallback row's S (up to the mask block, unsorted in scratch), each
checked against torch.sort:

  sort<T>     one tl.sort of the T-key block
  sort<T>r<R> triton_sort.sort_desc: tl.sort on runs of R keys, then merges of run pairs

and, with --read, the rescue's read of one pass-1 segment (16384 tokens of a Zipf row, about
40 of them above the floor t), one program a row, taken apart block by block:

  read_max    the loads and an elementwise max, one reduction at the end (the memory part)
  read_count  + a block-wide count of x > t per block
  read_z      + each token's exact z (div_rn) before the count
  read_scan   + the scan, key packing and scattered stores of the tokens above t: the
              rescue's read before session 14
  gather      triton_fallback.gather_above itself (two reads, no block-wide step inside
              either)

  python bench/bench_resolve_parts.py [--warps 4,8] [--read | --sort | --search ROWS.pt]

Writes bench/results/resolve_parts.json (resolve_read_parts.json with --read,
resolve_sort_parts.json with --sort, resolve_search_parts.json with --search).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.bench_kernels import replay_time
from maskgate.kernels.order import key_ids
from maskgate.kernels.triton_common import EMPTY_KEY, ordered32, pack_key, scale
from maskgate.kernels.triton_fallback import (
    _above3,
    _cut_listed,
    _load_block,
    fallback_draw,
    gather_above,
)
from maskgate.kernels.triton_sort import sort_desc
from maskgate.kernels.workloads import peaked_logits


@triton.jit
def sort_kernel(k_ptr, out_ptr, T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, T)
    keys = tl.load(k_ptr + row * T + pos)
    tl.store(out_ptr + row * T + pos, tl.sort(keys, 0, descending=True))


@triton.jit
def block_sort_kernel(k_ptr, n_ptr, buf_ptr, out_ptr, T: tl.constexpr, RUN: tl.constexpr):
    """A fallback row's sort: its n keys copied to scratch (as the gather leaves them), then
    sorted by sort_desc (RUN == T: one tl.sort)."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.load(n_ptr + row)
    pos = tl.arange(0, T)
    tl.store(buf_ptr + row * T + pos, tl.load(k_ptr + row * T + pos), mask=pos < n)
    tl.debug_barrier()
    tl.store(out_ptr + row * T + pos, sort_desc(buf_ptr + row * T, n, T, RUN))


@triton.jit
def search_kernel(
    x_ptr, zmax_ptr, out_ptr, scratch_ptr, stride_x, vocab, temp_ptr,
    PART: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One of the whole-row fallback's reads of a row (module docstring), the row's z max
    given."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    z_max = tl.load(zmax_ptr + row)
    temp = tl.load(temp_ptr)
    if PART == 0:  # loads and a max
        acc = tl.full([BLOCK], float("-inf"), tl.float32)
        x = _load_block(x_row, vocab, 0, BLOCK)
        for start in range(0, vocab, BLOCK):
            x_next = _load_block(x_row, vocab, start + BLOCK, BLOCK)
            acc = tl.maximum(acc, x.to(tl.float32))
            x = x_next
        tl.store(out_ptr + row, tl.max(acc, axis=0))
    elif PART == 1:  # a search read, three thresholds
        q1, q2, q3 = ordered32(z_max - 8.0), ordered32(z_max - 10.0), ordered32(z_max - 12.0)
        n1, n2, n3, s1, s2, s3 = _above3(
            x_row, temp, vocab, q1, q2, q3, z_max, (out_ptr, False), False, BLOCK
        )
        tl.store(out_ptr + row, (n1 + n2 + n3).to(tl.float32) + s1 + s2 + s3)
    elif PART == 2:  # seven thresholds, compared in logits (temperature 1)
        c = tl.zeros([BLOCK], tl.int32)
        m = tl.zeros([BLOCK], tl.float32)
        c2, c3, c4, c5, c6, c7 = c, c, c, c, c, c
        m2, m3, m4, m5, m6, m7 = m, m, m, m, m, m
        x = _load_block(x_row, vocab, 0, BLOCK)
        for start in range(0, vocab, BLOCK):
            x_next = _load_block(x_row, vocab, start + BLOCK, BLOCK)
            v = x.to(tl.float32)
            e = tl.exp(v - z_max)
            c += (v > z_max - 6.0).to(tl.int32)
            c2 += (v > z_max - 7.0).to(tl.int32)
            c3 += (v > z_max - 8.0).to(tl.int32)
            c4 += (v > z_max - 9.0).to(tl.int32)
            c5 += (v > z_max - 10.0).to(tl.int32)
            c6 += (v > z_max - 11.0).to(tl.int32)
            c7 += (v > z_max - 12.0).to(tl.int32)
            m += tl.where(v > z_max - 6.0, e, 0.0)
            m2 += tl.where(v > z_max - 7.0, e, 0.0)
            m3 += tl.where(v > z_max - 8.0, e, 0.0)
            m4 += tl.where(v > z_max - 9.0, e, 0.0)
            m5 += tl.where(v > z_max - 10.0, e, 0.0)
            m6 += tl.where(v > z_max - 11.0, e, 0.0)
            m7 += tl.where(v > z_max - 12.0, e, 0.0)
            x = x_next
        n = c + c2 + c3 + c4 + c5 + c6 + c7
        mass = m + m2 + m3 + m4 + m5 + m6 + m7
        tl.store(out_ptr + row, tl.sum(n, axis=0).to(tl.float32) + tl.sum(mass, axis=0))
    elif PART == 3:  # the read that lists a bracket (12 to 12.25 nats down) and S, then cuts
        lo, hi = ordered32(z_max - 12.25), ordered32(z_max - 12.0)
        scratch = scratch_ptr + row * 6144
        n_between, c_hi = tl.full([], 1024, tl.int32), tl.full([], 2000, tl.int32)
        m_hi, z_norm = tl.full([], 0.5, tl.float32), tl.full([], 1.0, tl.float32)
        k = tl.full([], 1 << 40, tl.int64)
        top_p, min_p = tl.full([], 0.95, tl.float32), tl.full([], 0.0, tl.float32)
        t, n, mass, _ = _cut_listed(
            x_row, temp, vocab, lo, hi, n_between, c_hi, m_hi, k, z_norm, top_p, min_p, z_max,
            scratch, scratch + 1024, tl.full([], 4096, tl.int32), 1024, BLOCK,
        )  # fmt: skip
        tl.store(out_ptr + row, mass + n.to(tl.float32) + (t & 1).to(tl.float32))
    else:  # the draw: a Gumbel race over the tokens 12 nats from the max
        t_cut = ordered32(z_max - 12.0).to(tl.int64) << 32
        key = fallback_draw(x_row, temp, vocab, t_cut, row, row + 1, BLOCK)
        tl.store(out_ptr + row, (key & 0xFFFF).to(tl.float32))


@triton.jit
def rank_kernel(k_ptr, m_ptr, out_ptr, before_ptr, T: tl.constexpr, COLS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, T)
    keys = tl.load(k_ptr + row * T + pos)
    acc_n = tl.zeros([T, COLS], tl.int32)
    acc_m = tl.zeros([T, COLS], tl.float32)
    for c in tl.static_range(0, T, COLS):
        cols = c + tl.arange(0, COLS)
        kc = tl.load(k_ptr + row * T + cols)
        mc = tl.load(m_ptr + row * T + cols)
        gt = kc[None, :] > keys[:, None]
        acc_n += gt.to(tl.int32)
        acc_m += tl.where(gt, mc[None, :], 0.0)
    tl.store(out_ptr + row * T + pos, tl.sum(acc_n, axis=1).to(tl.int64))
    tl.store(before_ptr + row * T + pos, tl.sum(acc_m, axis=1))


@triton.jit
def reduce_kernel(z_ptr, out_ptr, N: tl.constexpr, STEPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z = tl.load(z_ptr + row * N + tl.arange(0, N))
    lo = tl.min(z, axis=0)
    hi = tl.max(z, axis=0)
    for _ in range(STEPS):
        mid = lo + (hi - lo) * 0.5
        over = tl.sum((z >= mid).to(tl.int32), axis=0) > 256
        lo = tl.where(over, mid, lo)
        hi = tl.where(over, hi, mid)
    tl.store(out_ptr + row, lo)


@triton.jit
def bracket_kernel(z_ptr, out_ptr, N: tl.constexpr, WAYS: tl.constexpr, ROUNDS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z = tl.load(z_ptr + row * N + tl.arange(0, N))
    lo = tl.min(z, axis=0)
    hi = tl.max(z, axis=0)
    w = tl.arange(0, WAYS)
    for _ in range(ROUNDS):
        t = lo + (hi - lo) * (w.to(tl.float32) / WAYS)
        cnt = tl.sum((z[:, None] >= t[None, :]).to(tl.int32), axis=0)
        ok = cnt <= 256  # thresholds low enough to keep at most 256
        first = tl.min(tl.where(ok, w, WAYS), axis=0)
        new_lo = lo + (hi - lo) * ((first - 1).to(tl.float32) / WAYS)
        hi = lo + (hi - lo) * (first.to(tl.float32) / WAYS)
        lo = new_lo
    tl.store(out_ptr + row, lo)


@triton.jit
def read_kernel(
    x_ptr, t_ptr, out_ptr, scratch_ptr, stride_x, seg_len, MODE: tl.constexpr, BLOCK: tl.constexpr
):
    """The rescue's read of tokens [0, seg_len) of a row, cut down to MODE's parts."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    t = tl.load(t_ptr + row)
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    written = tl.full([], 0, tl.int32)
    for start in range(0, seg_len, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + ids)
        if MODE == 0:
            acc = tl.maximum(acc, x)
        elif MODE == 1:
            written += tl.sum((x > t).to(tl.int32), axis=0)
        else:
            z = scale(x, tl.full([], 1.0, tl.float32))
            sel = z > t
            if MODE == 2:
                written += tl.sum(sel.to(tl.int32), axis=0)
            else:
                rank = written + tl.cumsum(sel.to(tl.int32), axis=0) - 1
                tl.store(scratch_ptr + row * 4096 + rank, pack_key(z, ids.to(tl.int64)), mask=sel)
                written += tl.sum(sel.to(tl.int32), axis=0)
    if MODE == 0:
        written += (tl.max(acc, axis=0) > t).to(tl.int32)
    tl.store(out_ptr + row, written)


@triton.jit
def gather_kernel(x_ptr, t_ptr, out_ptr, scratch_ptr, stride_x, seg_len, BLOCK: tl.constexpr):
    """gather_above over a row whose only segment (floor above t) has no known candidates."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ch = tl.arange(0, 16)
    got = gather_above(
        x_ptr + row * stride_x,
        tl.full([], 1.0, tl.float32),
        seg_len,
        t,
        tl.where(ch == 0, float("inf"), float("-inf")),
        ch,
        seg_len,
        tl.full([BLOCK], EMPTY_KEY, tl.int64),
        tl.full([BLOCK], float("-inf"), tl.float32),
        tl.zeros([BLOCK], tl.int1),
        scratch_ptr + row * 4096,
        4096,
        BLOCK,
    )
    tl.store(out_ptr + row, got)


def read_parts(rows: int, warps_list, record) -> None:
    """The --read parts: 16384-token segments of Zipf rows, t = each segment's 40th z."""
    seg = 16384
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = peaked_logits(rows, seg, 1.1, gen).contiguous()
    t = torch.topk(x, 41, dim=1).values[:, -1].contiguous()
    out = torch.empty(rows, dtype=torch.int32, device="cuda")
    scratch = torch.empty(rows, 4096, dtype=torch.int64, device="cuda")
    for warps in warps_list:
        for block in (2048, 4096):
            for mode, part in enumerate(("read_max", "read_count", "read_z", "read_scan")):
                us = launch_us(
                    read_kernel, rows, x, t, out, scratch, x.stride(0), seg,
                    MODE=mode, BLOCK=block, num_warps=warps,
                )  # fmt: skip
                record(f"{part}{block}", warps, us)
            us = launch_us(
                gather_kernel, rows, x, t, out, scratch, x.stride(0), seg,
                BLOCK=block, num_warps=warps,
            )  # fmt: skip
            record(f"gather{block}", warps, us)
            check_gather(x, out, scratch)


def check_gather(x: torch.Tensor, got: torch.Tensor, scratch: torch.Tensor) -> None:
    """The gathered keys are the 40 largest tokens of each row."""
    assert bool((got == 40).all()), f"gather_above counted {got.tolist()}, not 40 a row"
    ids = key_ids(scratch[:, :40])
    want = torch.topk(x, 40, dim=1).indices
    assert torch.equal(ids.sort(dim=1).values, want.sort(dim=1).values), "wrong tokens gathered"


def plot_search(results: list[dict], path: pathlib.Path) -> None:
    """--search: one bar a read (us a launch of 128 programs, one row each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [f"{r['part']} ({r['warps']}w)" for r in results]
    ax.barh(names, [r["us"] for r in results], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("us a launch (128 programs, one 49152-token row each)")
    ax.set_title("The whole-row fallback's reads of a real row")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_sort(results: list[dict], path: pathlib.Path) -> None:
    """--sort: us a launch against the run length, one line per block size and warps (the
    run equal to the block is the single tl.sort)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    lines: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for r in results:
        block, _, run = r["part"].removeprefix("sort").partition("r")
        lines.setdefault((int(block), r["warps"]), []).append((int(run or block), r["us"]))
    for (block, warps), pts in sorted(lines.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{block} keys, {warps} warps"
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("run length (tl.sort on runs, then merges; run = block: one tl.sort)")
    ax.set_ylabel("us a launch (128 programs, one row each)")
    ax.set_title("Sorting a fallback row's keys in one program")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_read(results: list[dict], path: pathlib.Path) -> None:
    """Bars of the --read parts, one group per (block, warps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ["read_max", "read_count", "read_z", "read_scan", "gather"]
    groups = sorted(
        {
            (r["part"][len(p) :], r["warps"])
            for r in results
            for p in parts
            if r["part"].startswith(p)
        }
    )
    groups = [(b, w) for b, w in groups if b.isdigit()]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(parts)
    for j, part in enumerate(parts):
        us = [
            next((r["us"] for r in results if r["part"] == part + b and r["warps"] == w), 0.0)
            for b, w in groups
        ]
        ax.bar([i + j * width for i in range(len(groups))], us, width, label=part)
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(groups))],
        [f"block {b}, {w} warps" for b, w in groups],
    )
    ax.set_ylabel("us per launch (graph replay, 128 rows)")
    ax.set_title("the rescue's read of a 16384-token segment, taken apart")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def launch_us(kernel, rows: int, *args, **meta) -> float:
    """GPU time of one launch: ten launches captured in a graph, replayed, divided by ten."""

    def ten() -> None:
        for _ in range(10):
            kernel[(rows,)](*args, **meta)

    return replay_time(ten, 50) / 10


def sort_parts(rows: int, warps_list, record) -> None:
    """Times the fallback's sort of S at each mask block, one tl.sort against sort_desc's
    runs, on rows of random keys whose S fills 55-100% of the block (what reaches a block:
    an S past half of it), and checks every result against torch.sort."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    for t in (256, 512, 1024, 2048, 4096):
        keys = torch.randint(0, 2**62, (rows, t), device="cuda", generator=gen)
        n = torch.randint(t * 55 // 100, t + 1, (rows,), device="cuda", generator=gen)
        valid = torch.arange(t, device="cuda")[None, :] < n[:, None]
        want = (
            torch.where(valid, keys, torch.iinfo(torch.int64).min)
            .sort(dim=1, descending=True)
            .values
        )
        buf, out = torch.empty_like(keys), torch.empty_like(keys)
        for warps in warps_list:
            for run in sorted({t} | {r for r in (1024, 512, 256, 128, 64, 32) if r < t})[::-1]:
                out.zero_()
                us = launch_us(
                    block_sort_kernel, rows, keys, n, buf, out, T=t, RUN=run, num_warps=warps
                )
                if not torch.equal(out, want):
                    raise SystemExit(f"sort{t} run {run}: wrong order")
                record(f"sort{t}" + ("" if run == t else f"r{run}"), warps, us)


def search_parts(path: str, warps_list, record) -> None:
    """Times the whole-row fallback's reads on the first 128 rows of a real rows file."""
    x = torch.load(path)["logits"][:128].float().cuda()
    rows, vocab = x.shape
    out = torch.empty(rows, device="cuda")
    scratch = torch.empty(rows, 6144, dtype=torch.int64, device="cuda")
    parts = [("max", 0, 1.0), ("above3", 1, 1.0), ("above3_t07", 1, 0.7), ("above7", 2, 1.0)]
    for warps in warps_list:
        for name, part, temp in parts:
            z_max = (x / temp).amax(dim=1).contiguous()
            t = torch.full((1,), temp, device="cuda")
            for block in (1024, 2048, 4096):
                us = launch_us(
                    search_kernel, rows, x, z_max, out, scratch, x.stride(0), vocab, t,
                    PART=part, BLOCK=block, num_warps=warps,
                )  # fmt: skip
                record(f"{name}{block}", warps, us)
        z_max = x.amax(dim=1).contiguous()
        one = torch.ones(1, device="cuda")
        for name, part in (("listed", 3), ("draw", 4)):
            us = launch_us(
                search_kernel, rows, x, z_max, out, scratch, x.stride(0), vocab, one,
                PART=part, BLOCK=2048, num_warps=warps,
            )  # fmt: skip
            record(name, warps, us)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--read", action="store_true", help="the rescue's read, taken apart")
    ap.add_argument("--sort", action="store_true", help="the fallback's sort of S")
    ap.add_argument("--search", metavar="PT", help="the whole-row fallback's reads, real rows")
    args = ap.parse_args()
    rows, dev = args.rows, "cuda"
    results = []
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def record(part: str, warps: int, us: float) -> None:
        results.append({"part": part, "warps": warps, "us": us})
        print(f"{part:>12} warps={warps} {us:7.2f} us", flush=True)

    if args.read:
        read_parts(rows, [int(w) for w in args.warps.split(",")], record)
        (out_dir / "resolve_read_parts.json").write_text(json.dumps(results, indent=1))
        plot_read(results, out_dir / "resolve_read_parts.png")
        return

    if args.search:
        search_parts(args.search, [int(w) for w in args.warps.split(",")], record)
        (out_dir / "resolve_search_parts.json").write_text(json.dumps(results, indent=1))
        plot_search(results, out_dir / "resolve_search_parts.png")
        return

    if args.sort:
        sort_parts(rows, [int(w) for w in args.warps.split(",")], record)
        (out_dir / "resolve_sort_parts.json").write_text(json.dumps(results, indent=1))
        plot_sort(results, out_dir / "resolve_sort_parts.png")
        return

    z = torch.randn(rows, 2048, device=dev)
    o = torch.empty(rows, device=dev)
    for warps in (int(w) for w in args.warps.split(",")):
        for t in (128, 256):
            keys = torch.randint(0, 2**62, (rows, t), device=dev)
            mass = torch.rand(rows, t, device=dev)
            out = torch.empty_like(keys)
            before = torch.empty_like(mass)
            record(f"sort{t}", warps, launch_us(sort_kernel, rows, keys, out, T=t, num_warps=warps))
            us = launch_us(
                rank_kernel, rows, keys, mass, out, before, T=t, COLS=32, num_warps=warps
            )
            record(f"rank{t}", warps, us)
        for steps in (0, 8, 16):
            us = launch_us(reduce_kernel, rows, z, o, N=2048, STEPS=steps, num_warps=warps)
            record(f"reduce{steps}", warps, us)
        us = launch_us(bracket_kernel, rows, z, o, N=2048, WAYS=16, ROUNDS=2, num_warps=warps)
        record("bracket2", warps, us)
    (out_dir / "resolve_parts.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
