"""Pass 1's segment count per row against the GPU's waves (CUDA; V = 151936 unless --vocab).

  python bench/bench_segments.py [--batches 64,128,256,512] [--segments 6,8,10,12,16]
                                 [--whole 10,12] [--rounds 2] [--rep-ms 10] [--out DIR]

A pass-1 program streams one segment of a row. B rows of n segments are B * n programs, and
an SM holds a fixed number of them at once (6 of band_lanes_kernel's at 40 registers), so a
launch runs in ceil(B * n / slots) waves of one segment's time each: at B = 128 the default
16384-token segments (n = 10) are 1280 programs, 1.6 waves of 132 x 6 slots, paid as 2. This
times pass 1 alone (8 launches a CUDA graph, over 4 input buffers, per launch) for each n,
rounds alternating, with the floor (one read for max and sum-exp) beside it; then, for the
--whole counts, the whole kernels.sample steady time and the rows that needed the rescue
(fewer lanes per row put more of a row's top tokens in one lane). Zipf rows, fp32, top-p 0.95.
Prints a table; writes kernels_segments.json and .png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import statistics
import sys

import torch
import triton

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.bench_kernels import (
    CAP,
    N_BUFFERS,
    STEADY_CALLS,
    _args,
    floor_steady_time,
    make_inputs,
    replay_time,
)
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton_path import (
    LANES,
    NBISECT,
    band_config,
    launch_band,
    mask_index,
    sample_triton,
    sm_count,
)


def segment_config(vocab: int, batch: int, n: int | None):
    """band_config with the fewest 512-token tiles a segment that give n segments a row
    (None: the default shape)."""
    if n is None:
        return band_config(vocab, batch=batch)
    tiles = triton.cdiv(triton.cdiv(vocab, LANES), n)
    return band_config(vocab, batch=batch, chunk=tiles * LANES)


def shape(cfg, n: int | None) -> dict:
    """A result row's segment fields: segments a row, tokens a segment, the default shape."""
    return {"n": cfg.n_chunks, "seg": cfg.chunk, "default": n is None}


def pass1_graph_time(bufs, cfg, rep_ms: int) -> float:
    """Pass 1 alone under cfg, STEADY_CALLS launches a graph, us per launch."""
    batch = bufs[0]["logits"].shape[0]
    dev = bufs[0]["logits"].device
    key = torch.empty(batch, cfg.ncand, dtype=torch.int64, device=dev)
    m, s, d = (torch.empty(batch, cfg.n_chunks, device=dev) for _ in range(3))
    it = itertools.cycle(bufs)

    def run():
        b = next(it)
        launch_band(b["logits"], b["temperature"], key, m, s, d, cfg, NBISECT)

    return replay_time(run, rep_ms, STEADY_CALLS)


def whole(bufs, cfg, rep_ms: int) -> tuple[float, list[int]]:
    """Steady us per kernels.sample under cfg, and the rescued rows of each buffer."""
    inps = [check_inputs(**_args(b), max_mask_tokens=CAP) for b in bufs]
    rescued = [int(sample_triton(inp, cfg).fallback_rows.sum()) for inp in inps]
    index = mask_index(inps[0].want_mask, inps[0].logits.device)
    it = itertools.cycle(inps)
    us = replay_time(lambda: sample_triton(next(it), cfg, index=index), rep_ms, STEADY_CALLS)
    return us, rescued


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="64,128,256,512")
    ap.add_argument("--segments", default="6,8,10,12,14,16,20,24", help="segments a row")
    ap.add_argument("--whole", default="10,12", help="segment counts to time whole")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep-ms", type=int, default=10)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    slots = sm_count(dev)
    rows: list[dict] = []

    def record(**row) -> None:
        rows.append(row)
        (out / "kernels_segments.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps(row), flush=True)

    counts = [None] + [int(n) for n in a.segments.split(",")]
    for batch in (int(b) for b in a.batches.split(",")):
        bufs = [
            make_inputs(batch, a.vocab, torch.float32, "p0.95", False, i) for i in range(N_BUFFERS)
        ]
        record(B=batch, what="floor_steady", us=floor_steady_time(bufs, a.rep_ms, STEADY_CALLS))
        for rnd in range(a.rounds):
            order = counts if rnd % 2 == 0 else counts[::-1]
            for n in order:
                cfg = segment_config(a.vocab, batch, n)
                record(
                    B=batch,
                    what="pass1",
                    **shape(cfg, n),
                    programs=batch * cfg.n_chunks,
                    per_sm=round(batch * cfg.n_chunks / slots, 2),
                    round=rnd,
                    us=pass1_graph_time(bufs, cfg, a.rep_ms),
                )
        for n in [None] + [int(n) for n in a.whole.split(",") if n]:
            cfg = segment_config(a.vocab, batch, n)
            us, rescued = whole(bufs, cfg, a.rep_ms)
            record(B=batch, what="whole", **shape(cfg, n), us=us, rescued=rescued)
    table(rows)
    plot(rows, out / "kernels_segments.png")


def table(rows: list[dict]) -> None:
    """Median pass-1 time per (B, segments), against the floor, and the whole-sample rows."""
    floors = {r["B"]: r["us"] for r in rows if r["what"] == "floor_steady"}
    print(
        f"{'B':>5} {'n':>3} {'seg':>6} {'programs':>8} {'per SM':>6} {'pass1 us':>9} {'/floor':>6}"
    )
    keys = dict.fromkeys((r["B"], r["n"], r["seg"]) for r in rows if r["what"] == "pass1")
    for b, n, seg in keys:
        same = [
            r for r in rows if r["what"] == "pass1" and (r["B"], r["n"], r["seg"]) == (b, n, seg)
        ]
        us = statistics.median(r["us"] for r in same)
        print(
            f"{b:>5} {n:>3} {seg:>6} {same[0]['programs']:>8} {same[0]['per_sm']:>6} "
            f"{us:>9.2f} {us / floors[b]:>6.2f}"
        )
    for r in rows:
        if r["what"] == "whole":
            print(
                f"whole B={r['B']} n={r['n']} seg={r['seg']}: {r['us']:.2f} us steady "
                f"({r['us'] / floors[r['B']]:.2f}x floor), rescued rows per buffer {r['rescued']}"
            )


def plot(rows: list[dict], path: pathlib.Path) -> None:
    """Pass-1 time over the floor against programs per SM, one line per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floors = {r["B"]: r["us"] for r in rows if r["what"] == "floor_steady"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for b in floors:
        pts: dict[tuple, list[float]] = {}
        for r in rows:
            if r["what"] == "pass1" and r["B"] == b:
                pts.setdefault((r["per_sm"], r["n"]), []).append(r["us"] / floors[b])
        xs = sorted(pts)
        ax.plot([x[0] for x in xs], [statistics.median(pts[x]) for x in xs], "o-", label=f"B={b}")
    ax.set_xlabel("pass-1 programs per SM (B x segments / SMs)")
    ax.set_ylabel("pass 1 / floor (steady)")
    ax.set_title("pass 1 against its waves, V=151936 fp32")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
