"""One program a row: how fast can a single program stream a whole row, and what does a
sample cost when each row's pass 1 and resolve run in one program? (CUDA.)

The default sample at B = 128 spends pass 1 (segments of many programs a row), a launch
gap and resolve (one program a row) one after the other. With B at most the SM count, a
row per program needs no candidates from other programs and no second launch: the program
streams its row, cuts its band and resolves at once (band_resolve_kernel with one segment
a row). That only pays if one program can pull its row at about the floor's rate, about
30 GB/s an SM at B = 128, V = 151936, so this script measures that first:

* `stream`: one program a row streams the row in tiles of W lanes with the loop's work
  only (mode floor: a lane's max and sum-exp; lanes2 / lanes3: pass 1's lane step keeping
  two or three tops), then one block reduction. Against the chunk floor of
  bench/kernel_baselines.py. Lookahead 1 or 2 tiles.
* `sample`: kernels.sample's default against one segment a row (fused: one launch; split:
  pass 1 then resolve), steady (8 samples a graph over 4 buffers), with their fallback
  rows, and a check that each gives the default's tokens and masks (seeded rows).

  python bench/row_stream.py [--batches 128] [--rep-ms 10] [--out bench/results]
  python bench/row_stream.py --streams= --no-sample --variants default,look1 --rounds 2

Writes row_stream.json and row_stream.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.bench_kernels import (
    CAP,
    STEADY_CALLS,
    VARIANTS,
    _args,
    band_pass,
    floor_steady_time,
    graph_time,
    make_inputs,
    replay_time,
    same_csr,
)
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton_band_lanes import _lane_step, _lane_step3
from maskgate.kernels.triton_common import FLT_MAX
from maskgate.kernels.triton_path import band_config, sample_triton

LOG2E = tl.constexpr(1.4426950408889634)
MODES = {"floor": 0, "lanes2": 1, "lanes3": 2}


@triton.jit
def _tile(x, t1, i1, t2, i2, t3, i3, d, s, it, nc, MODE: tl.constexpr):
    x = x.to(tl.float32)
    if MODE == 0:
        e = tl.exp2(tl.abs(x - tl.maximum(t1, -FLT_MAX)) * nc)
        gt = x > t1
        s = tl.where(gt, s * e + 1.0, s + e)
        t1 = tl.maximum(t1, x)
    elif MODE == 1:
        t1, i1, t2, i2, d, s = _lane_step(x, t1, i1, t2, i2, d, s, it, nc)
    else:
        t1, i1, t2, i2, t3, i3, d, s = _lane_step3(x, t1, i1, t2, i2, t3, i3, d, s, it, nc)
    return t1, i1, t2, i2, t3, i3, d, s


@triton.jit
def _row_stream_kernel(
    x_ptr, out_ptr, stride_x, vocab, W: tl.constexpr, MODE: tl.constexpr, LOOK: tl.constexpr
):
    """One row a program: the loop's work over the whole row, then one block reduction. (Its
    own loop, as measured in session 35; kernels' lanes_pass reads ahead the same way.)"""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, W)
    ptrs = x_ptr + row * stride_x + lanes
    nc = -LOG2E
    t1 = tl.full([W], float("-inf"), tl.float32)
    t2 = t1
    t3 = t1
    d = t1
    s = tl.zeros([W], tl.float32)
    i1 = tl.full([W], -1, tl.int32)
    i2 = i1
    i3 = i1
    n_full = vocab // W
    n_tiles = (vocab + W - 1) // W
    xa = tl.load(ptrs)
    if LOOK == 2:
        xb = tl.load(ptrs + W)
        for it in range(0, n_full - 2):
            xn = tl.load(ptrs + (it + 2) * W)
            t1, i1, t2, i2, t3, i3, d, s = _tile(xa, t1, i1, t2, i2, t3, i3, d, s, it, nc, MODE)
            xa = xb
            xb = xn
        t1, i1, t2, i2, t3, i3, d, s = _tile(xa, t1, i1, t2, i2, t3, i3, d, s, n_full - 2, nc, MODE)
        xa = xb
        first = n_full - 1
    else:
        for it in range(0, n_full - 1):
            xn = tl.load(ptrs + (it + 1) * W)
            t1, i1, t2, i2, t3, i3, d, s = _tile(xa, t1, i1, t2, i2, t3, i3, d, s, it, nc, MODE)
            xa = xn
        first = n_full - 1
    for it in range(first, n_tiles):  # the last full tile, then a partial one
        nxt = (it + 1) * W
        xn = tl.load(ptrs + nxt, mask=nxt + lanes < vocab, other=float("-inf"))
        t1, i1, t2, i2, t3, i3, d, s = _tile(xa, t1, i1, t2, i2, t3, i3, d, s, it, nc, MODE)
        xa = xn
    m = tl.max(t1, axis=0)
    total = tl.sum(s * tl.exp2((t1 - m) * LOG2E), axis=0)
    tl.store(out_ptr + row * 4, m)
    tl.store(out_ptr + row * 4 + 1, total)
    tl.store(out_ptr + row * 4 + 2, tl.max(tl.maximum(d, t2), axis=0) + tl.max(t3, axis=0))
    tl.store(out_ptr + row * 4 + 3, tl.sum(i1 + i2 + i3, axis=0).to(tl.float32))


def stream(x: torch.Tensor, out: torch.Tensor, w: int, mode: str, look: int, warps: int) -> None:
    batch, vocab = x.shape
    _row_stream_kernel[(batch,)](
        x, out, x.stride(0), vocab, W=w, MODE=MODES[mode], LOOK=look, num_warps=warps
    )


def _pass1(b: dict, cfg) -> None:
    band_pass(b["logits"], b["temperature"], cfg=cfg)


def check_stream(x: torch.Tensor, out: torch.Tensor) -> float:
    """Largest relative error of the streamed row max and sum-exp against torch's."""
    m = x.float().amax(dim=1)
    s = torch.exp(x.float() - m[:, None]).sum(dim=1)
    return float(torch.maximum((out[:, 0] - m).abs(), ((out[:, 1] - s) / s).abs()).max())


def row_configs(vocab: int, batch: int) -> dict:
    """One segment a row: its lanes, the segment a whole number of tiles covering the row."""
    cfgs = {}
    for lanes, keep, fused in ((4096, 3, True), (4096, 2, True), (4096, 3, False)):
        chunk = -(-vocab // lanes) * lanes
        name = f"{'fused' if fused else 'split'}_l{lanes}k{keep}"
        cfgs[name] = band_config(
            vocab, chunk=chunk, lanes=lanes, batch=batch, keep=keep, fused=fused, reread=0
        )
    return cfgs


def sample_steady(bufs: list[dict], cfg, rep_ms: int) -> float:
    return graph_time(bufs, rep_ms, calls=STEADY_CALLS, cfg=cfg)


def compare(bufs: list[dict], cfg) -> dict:
    """Tokens, masks and log-probs of cfg against the default's, over every buffer."""
    tok_diff = mask_diff = fb = 0
    lp_err = 0.0
    for b in bufs:
        inp = check_inputs(**_args(b), max_mask_tokens=CAP)
        ref = sample_triton(inp)
        got = sample_triton(inp, cfg)
        tok_diff += int((ref.tokens != got.tokens).sum())
        mask_diff += 0 if same_csr(ref, got) else 1
        lp_err = max(lp_err, float((ref.logprobs - got.logprobs).abs().max()))
        fb += int(got.fallback_rows.sum())
    return {
        "token_diffs": tok_diff,
        "mask_buffers_differ": mask_diff,
        "logprob_max_err": lp_err,
        "fallback_rows": fb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="128")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rep-ms", type=int, default=10)
    ap.add_argument("--setting", default="p0.95")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--streams",
        default="floor:4096:1:8,floor:4096:2:8,lanes2:4096:1:8,"
        "lanes2:4096:2:8,lanes3:4096:2:8,lanes2:2048:2:8,lanes2:4096:2:16",
    )
    ap.add_argument(
        "--no-sample", action="store_true", help="no whole samples with one segment a row"
    )
    ap.add_argument(
        "--variants",
        default="",
        help="bench_kernels VARIANTS: pass 1 alone and "
        "the whole sample, steady, in alternating rounds, against the default",
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--plot-only",
        nargs="*",
        help="draw these row_stream.json files' "
        "--variants runs (whole sample, median of rounds) into --png",
    )
    ap.add_argument("--png", default="row_stream_variants.png")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        runs = [r for f in args.plot_only for r in json.loads(pathlib.Path(f).read_text())]
        plot_variants(runs, out / args.png)
        return
    rows: list[dict] = []

    def record(row: dict) -> None:
        row = {"V": args.vocab, "dtype": args.dtype, **row}
        rows.append(row)
        (out / "row_stream.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps(row), flush=True)

    for batch in [int(b) for b in args.batches.split(",")]:
        dtype = getattr(torch, args.dtype)
        bufs = [make_inputs(batch, args.vocab, dtype, args.setting, False, i) for i in range(4)]
        gb = batch * args.vocab * dtype.itemsize / 1e9
        fl = floor_steady_time(bufs, args.rep_ms, STEADY_CALLS)
        record({"B": batch, "kind": "floor_chunks", "us": fl, "GBps": gb / fl * 1e6})
        res = torch.empty(batch, 4, device="cuda")
        for spec in [s for s in args.streams.split(",") if s]:
            mode, w, look, warps = spec.split(":")
            shape = (int(w), mode, int(look), int(warps))
            it = itertools.cycle([b["logits"] for b in bufs])
            us = replay_time(
                lambda it=it, shape=shape, res=res: stream(next(it), res, *shape),
                args.rep_ms,
                STEADY_CALLS,
            )
            stream(bufs[0]["logits"], res, *shape)
            err = check_stream(bufs[0]["logits"], res)
            record(
                {
                    "B": batch,
                    "kind": f"stream_{spec}",
                    "us": us,
                    "GBps": gb / us * 1e6,
                    "x_floor": us / fl,
                    "max_err": err,
                }
            )
        variants = [v for v in args.variants.split(",") if v]
        if variants:
            cfgs = {v: band_config(args.vocab, batch=batch, **VARIANTS[v]) for v in variants}
            for v, cfg in cfgs.items():
                record({"B": batch, "kind": f"check_{v}", "us": 0.0, **compare(bufs, cfg)})
            for rnd in range(args.rounds):
                for v, cfg in cfgs.items():
                    it = itertools.cycle(bufs)
                    p1 = replay_time(
                        lambda it=it, cfg=cfg: _pass1(next(it), cfg),
                        args.rep_ms,
                        STEADY_CALLS,
                    )
                    record(
                        {
                            "B": batch,
                            "kind": f"pass1_{v}",
                            "round": rnd,
                            "us": p1,
                            "x_floor": p1 / fl,
                        }
                    )
                    us = sample_steady(bufs, cfg, args.rep_ms)
                    record(
                        {
                            "B": batch,
                            "kind": f"sample_{v}",
                            "round": rnd,
                            "us": us,
                            "x_floor": us / fl,
                        }
                    )
        if args.no_sample:
            continue
        record({"B": batch, "kind": "sample_default", "us": sample_steady(bufs, None, args.rep_ms)})
        for name, cfg in row_configs(args.vocab, batch).items():
            cmp = compare(bufs, cfg)
            us = sample_steady(bufs, cfg, args.rep_ms)
            record({"B": batch, "kind": f"sample_{name}", "us": us, "x_floor": us / fl, **cmp})
    plot(rows, out / "row_stream.png")


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    names = [f"B={r['B']} {r['kind']}" for r in rows]
    ax.barh(names, [r["us"] for r in rows])
    for i, r in enumerate(rows):
        ax.text(r["us"], i, f" {r['us']:.1f}", va="center", fontsize=8)
    ax.set_xlabel("us (steady: 8 calls a graph)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_variants(rows: list[dict], path: pathlib.Path) -> None:
    """Whole-sample steady time per variant over the default before session 35 (one tile
    read ahead: `default` in runs before it, `look1` after, where `default` is two tiles at
    48 registers, drawn as look2n48), per (V, dtype, B): medians of the --variants rounds."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        if r["kind"].startswith("sample_") and "round" in r:
            case = (r.get("V", 151936), r.get("dtype", "float32"), r["B"])
            times.setdefault(case, {}).setdefault(r["kind"][len("sample_") :], []).append(r["us"])
    ratios: dict[str, dict[tuple, float]] = {}
    for case, by in times.items():
        old = "look1" if "look1" in by else "default"
        for v, us in by.items():
            if v != old:
                name = "look2n48" if (v, old) == ("default", "look1") else v
                ratios.setdefault(name, {})[case] = statistics.median(us) / statistics.median(
                    by[old]
                )
    cases = sorted(times)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cases)), 4))
    width = 0.8 / max(len(ratios), 1)
    for i, (v, by_case) in enumerate(sorted(ratios.items())):
        xs = [j + i * width for j, c in enumerate(cases) if c in by_case]
        ax.bar(xs, [by_case[c] for c in cases if c in by_case], width, label=v)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
    ax.set_xticklabels([f"V={v}\n{d}\nB={b}" for v, d, b in cases], fontsize=7)
    ax.set_ylabel("whole sample, steady / one tile ahead")
    ax.set_ylim(0.85, 1.05)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
