"""Pass 1's programs on a timeline (CUDA): where a launch's time goes at the program level.

  python bench/pass1_timeline.py [--variants default,rr16] [--batch 128] [--vocab 151936]
                                 [--dtype float32] [--launches 24] [--out DIR]

band_lanes_kernel stamps each program's start (after any PDL wait) and end (after a barrier,
once every warp is done) on the GPU's global timer and its SM's cycle counter, with its SM
and whether it read collided lanes again (REREAD), and the cycle counter where lane 0's
warp leaves the streaming loop and where it starts and ends the read again. This launches
pass 1 alone (no PDL) over four buffers of Zipf rows (top-p 0.95, the benchmark's),
`--launches` times per variant (alternating), and prints per variant the medians over
launches of:

  span_us     first start to last end (the launch's time on the GPU, without its gaps)
  prog_us     a program's duration (cycle counter, at the clock the timer shows)
  loop_us     the streaming loop (start to lane 0's warp leaving it), programs that do
              not read again
  end_us      the end of segment after it (statistics, cut, writes), same programs
  again       programs that read again, and their median duration (again_us), end of
              segment (a_end) and read again (a_read: lanes picked to block read back)
  waves       programs that started after the first program ended (the second wave)
  tail_us     the last program's end minus the 95th percentile of ends (how much a few
              slow programs hold the launch)
  last_again  launches whose last program to end read again

Writes pass1_timeline.json and a PNG of one launch per variant (programs by start time,
those that read again in red).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.bench_kernels import N_BUFFERS, VARIANTS, band_pass, make_inputs
from maskgate.kernels.triton_band_lanes import TIME_FIELDS
from maskgate.kernels.triton_path import band_config

# Per program: ns start, ns end, cycles start, cycles end, SM, read again, cycles at the
# loop's end, at the start and the end of the read again (0 where none)
FIELDS = TIME_FIELDS.value


def one_launch(b: dict, cfg, times: torch.Tensor) -> dict:
    """One pass-1 launch with stamps; its programs' stamps as host tensors."""
    times.zero_()
    band_pass(b["logits"], b["temperature"], cfg=cfg, times=times)
    torch.cuda.synchronize()
    t = times.cpu()
    return {
        "ns0": t[:, 0],
        "ns1": t[:, 1],
        "clk": (t[:, 3] - t[:, 2]).double(),
        "sm": t[:, 4],
        "again": t[:, 5].bool(),
        "loop_clk": (t[:, 6] - t[:, 2]).double(),
        "end_clk": (t[:, 3] - t[:, 6]).double(),
        "read_clk": (t[:, 8] - t[:, 7]).double(),
    }


def summarise(p: dict) -> dict:
    """One launch's figures (see the module docstring)."""
    t0 = int(p["ns0"].min())
    ends = (p["ns1"] - t0).double() / 1e3
    starts = (p["ns0"] - t0).double() / 1e3
    span = float(ends.max())
    dur_ns = (p["ns1"] - p["ns0"]).double()
    long = dur_ns >= dur_ns.median()  # the timer's ticks are coarse: rate from long programs
    ghz = float(p["clk"][long].sum() / dur_ns[long].sum())
    prog_us = p["clk"] / ghz / 1e3
    first_end = float(ends.min())
    last = int(ends.argmax())
    again = p["again"]

    def med(clk: torch.Tensor, rows: torch.Tensor) -> float | None:
        return float(clk[rows].median()) / ghz / 1e3 if rows.any() else None

    return {
        "programs": int(ends.numel()),
        "span_us": span,
        "ghz": ghz,
        "prog_us_median": float(prog_us.median()),
        "prog_us_max": float(prog_us.max()),
        "again": int(again.sum()),
        "again_prog_us_median": float(prog_us[again].median()) if again.any() else None,
        "loop_us_median": med(p["loop_clk"], ~again),
        "end_us_median": med(p["end_clk"], ~again),
        "again_end_us_median": med(p["end_clk"], again),
        "again_read_us_median": med(p["read_clk"], again),
        "second_wave": int((starts > first_end).sum()),
        "tail_us": span - float(ends.quantile(0.95)),
        "last_again": bool(again[last]),
        "last_start_us": float(starts[last]),
    }


def plot(launches: dict[str, dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(launches), figsize=(5 * len(launches), 4), squeeze=False)
    for ax, (name, p) in zip(axes[0], launches.items(), strict=True):
        t0 = int(p["ns0"].min())
        order = torch.argsort(p["ns0"])
        starts = ((p["ns0"] - t0).double() / 1e3)[order]
        ends = ((p["ns1"] - t0).double() / 1e3)[order]
        again = p["again"][order]
        for i in range(order.numel()):
            color = "tab:red" if again[i] else "tab:blue"
            lw = 1.5 if again[i] else 0.3
            ax.plot([float(starts[i]), float(ends[i])], [i, i], color=color, lw=lw)
        ax.set_title(f"{name}: {int(again.sum())} of {order.numel()} read again")
        ax.set_xlabel("us from the first start")
        ax.set_ylabel("program (by start)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="default,rr16")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--launches", type=int, default=24)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pass1_timeline.py needs a CUDA device (the stamps are PTX registers)")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [v for v in args.variants.split(",") if v]
    dtype = getattr(torch, args.dtype)
    bufs = [make_inputs(args.batch, args.vocab, dtype, "p0.95", False, i) for i in range(N_BUFFERS)]
    cfgs = {v: band_config(args.vocab, batch=args.batch, **VARIANTS[v]) for v in variants}
    times = {
        v: torch.zeros(args.batch * c.n_chunks, FIELDS, dtype=torch.int64, device="cuda")
        for v, c in cfgs.items()
    }
    for v in variants:  # compile and warm up
        for b in bufs:
            one_launch(b, cfgs[v], times[v])
    per = {v: [] for v in variants}
    shown = {}
    for i in range(args.launches):
        for v in variants:
            p = one_launch(bufs[i % len(bufs)], cfgs[v], times[v])
            per[v].append(summarise(p))
            shown.setdefault(v, p)
    rows = []
    print(f"B={args.batch} V={args.vocab} {args.dtype}, medians over {args.launches} launches")
    head = f"{'variant':<12}{'programs':>9}{'span_us':>9}{'prog_us':>9}{'max_us':>8}"
    print(
        head + f"{'loop_us':>8}{'end_us':>7}{'again':>7}{'again_us':>9}{'a_end':>7}{'a_read':>7}"
        f"{'wave2':>7}{'tail_us':>9}{'last_again':>11}"
    )
    for v in variants:
        runs = per[v]

        def med(key: str, runs=runs) -> float:
            vals = [r[key] for r in runs if r[key] is not None]
            return statistics.median(vals) if vals else float("nan")

        row = {
            "variant": v,
            "B": args.batch,
            "V": args.vocab,
            "dtype": args.dtype,
            "launches": len(runs),
            **{
                k: med(k)
                for k in (
                    "programs",
                    "span_us",
                    "ghz",
                    "prog_us_median",
                    "prog_us_max",
                    "again",
                    "again_prog_us_median",
                    "loop_us_median",
                    "end_us_median",
                    "again_end_us_median",
                    "again_read_us_median",
                    "second_wave",
                    "tail_us",
                    "last_start_us",
                )
            },
            "last_again": sum(r["last_again"] for r in runs),
            "span_us_all": [r["span_us"] for r in runs],
        }
        rows.append(row)
        print(
            f"{v:<12}{row['programs']:>9.0f}{row['span_us']:>9.2f}{row['prog_us_median']:>9.2f}"
            f"{row['prog_us_max']:>8.2f}{row['loop_us_median']:>8.2f}{row['end_us_median']:>7.2f}"
            f"{row['again']:>7.0f}{row['again_prog_us_median']:>9.2f}"
            f"{row['again_end_us_median']:>7.2f}{row['again_read_us_median']:>7.2f}"
            f"{row['second_wave']:>7.0f}{row['tail_us']:>9.2f}{row['last_again']:>11}"
        )
    (out / "pass1_timeline.json").write_text(json.dumps(rows, indent=1))
    plot(shown, out / "pass1_timeline.png")


if __name__ == "__main__":
    main()
