"""Latency of the building blocks of resolve_kernel's per-row decision, one program per row.

resolve_kernel is latency-bound (one program per row, 128 rows fill one wave of the H200), so
what matters is the serial cost of each block-wide step. This times, in isolation and from
CUDA graph replays of 128 programs:

  sort<T>     tl.sort of T packed int64 keys (the current tier-1 ordering)
  rank<T>     the rank and mass-before of each of T keys by counting (no sort)
  reduce16    16 dependent block-wide sums over 2048 values (a bisection's cost)
  bracket2    two 16-way threshold brackets over 2048 values (replacing an 8-step bisection)

  python bench/bench_resolve_parts.py [--warps 4,8]

Writes bench/results/resolve_parts.json.
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


@triton.jit
def sort_kernel(k_ptr, out_ptr, T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, T)
    keys = tl.load(k_ptr + row * T + pos)
    tl.store(out_ptr + row * T + pos, tl.sort(keys, 0, descending=True))


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


def launch_us(kernel, rows: int, *args, **meta) -> float:
    """GPU time of one launch: ten launches captured in a graph, replayed, divided by ten."""

    def ten() -> None:
        for _ in range(10):
            kernel[(rows,)](*args, **meta)

    return replay_time(ten, 50) / 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    rows, dev = args.rows, "cuda"
    results = []

    def record(part: str, warps: int, us: float) -> None:
        results.append({"part": part, "warps": warps, "us": us})
        print(f"{part:>10} warps={warps} {us:7.2f} us", flush=True)

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
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "resolve_parts.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
