"""Host time of an eager kernels.sample call on CUDA: what a worker that does not capture the
sampler in a CUDA graph pays on its CPU every step, next to the GPU time of the same call.

  python -m bench.bench_host [--batches 1,8,128] [--vocab 151936] [--calls 300]
                             [--label NAME] [--name STEM] [--out DIR] [--plot-only A.json,B.json]
                             [--want all|none]

Per batch size (fp32 Zipf rows, top-p 0.95, every row asking for a mask, seeds and steps
given as the worker gives them; --want none: no row asks, so pass 1 carries the race of rows
nothing truncates): the host microseconds of the whole call and of its parts
(argument checks, the mask index, the config, sample_triton with a precomputed index),
medians over --calls calls timed with perf_counter (launches are asynchronous, so this is the
CPU's time, not the GPU's); the same call queued behind ~1 ms of GPU work ('busy': about the
idle time if the call never waits on the device, about 1 ms if it does); the GPU time of one
graph replay of the same launches; and a cProfile of the calls (the functions with the most
own time). Run it from two checkouts with --label and --name to compare them, then
--plot-only both files. Writes STEM.json (host_bench by default) and STEM.png.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pathlib
import pstats
import statistics
import time

import torch

from bench.bench_kernels import CAP, _args, make_inputs, replay_time
from maskgate import kernels
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton_path import band_config, mask_index, sample_triton

PROFILE_TOP = 25
BUSY_CYCLES = 2_000_000  # torch.cuda._sleep cycles queued ahead of a call: ~1 ms at 1.98 GHz


def host_us(fn, calls: int) -> float:
    """Median host microseconds of fn over calls; the device syncs every 50 calls so the
    launch queue never fills (a full queue would make the host wait on the GPU)."""
    times = []
    for i in range(calls):
        if i % 50 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def _where(filename: str) -> str:
    """A profiled function's file from its package root on (no machine paths in results)."""
    parts = pathlib.PurePath(filename).parts
    for root in ("kernels", "triton", "torch", "bench"):
        if root in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(root) - 1 :])
    return parts[-1] if parts else filename


def profile_top(fn, calls: int) -> list[dict]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.items():
        rows.append(
            {
                "function": f"{_where(filename)}:{line}({name})",
                "calls_per_sample": ncalls / calls,
                "own_us": tottime / calls * 1e6,
                "cum_us": cumtime / calls * 1e6,
            }
        )
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:PROFILE_TOP]


def busy_host_us(fn, calls: int, sleep_cycles: int = BUSY_CYCLES) -> float:
    """Median host microseconds of fn called right after a ~1 ms GPU sleep is queued: about
    the same as host_us if fn never waits on the device, about the sleep if it does."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def run_batch(batch: int, vocab: int, calls: int, label: str, want: str = "all") -> dict:
    b = make_inputs(batch, vocab, torch.float32, "p0.95", False, seed=0)
    if want == "none":  # no row asks for a mask: pass 1 is launched with the race compiled in
        b = {**b, "want_mask": torch.zeros(batch, dtype=torch.bool)}
    args = _args(b)
    inp = check_inputs(**args, max_mask_tokens=CAP)
    index = mask_index(inp.want_mask, inp.logits.device)
    kernels.sample(**args, max_mask_tokens=CAP)  # compile
    torch.cuda.synchronize()
    row = {"B": batch, "V": vocab, "label": label, "want": want}
    row["sample_host_us"] = host_us(lambda: kernels.sample(**args, max_mask_tokens=CAP), calls)
    row["busy_host_us"] = busy_host_us(lambda: kernels.sample(**args, max_mask_tokens=CAP), 30)
    row["check_inputs_us"] = host_us(lambda: check_inputs(**args, max_mask_tokens=CAP), calls)
    row["mask_index_us"] = host_us(lambda: mask_index(inp.want_mask, inp.logits.device), calls)
    row["band_config_us"] = host_us(lambda: band_config(vocab, batch=batch), calls)
    row["sample_triton_us"] = host_us(lambda: sample_triton(inp, index=index), calls)
    row["gpu_replay_us"] = replay_time(lambda: sample_triton(inp, index=index), 40)
    row["profile"] = profile_top(lambda: kernels.sample(**args, max_mask_tokens=CAP), calls)
    return row


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("sample_host_us", "busy_host_us", "check_inputs_us", "mask_index_us")
    keys += ("band_config_us", "sample_triton_us", "gpu_replay_us")
    fig, ax = plt.subplots(figsize=(max(7, len(rows) * 1.1), 4.5))
    xs = range(len(rows))
    width = 0.8 / len(keys)
    for j, key in enumerate(keys):
        ax.bar([x + j * width for x in xs], [r[key] for r in rows], width, label=key[:-3])
    ax.set_xticks([x + 0.4 for x in xs], [f"B={r['B']}\n{r.get('label', '')}" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("us a call (host: median; gpu: one graph replay)")
    ax.set_title(f"eager kernels.sample: host time against GPU time (V={rows[0]['V']})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,128")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="host_bench", help="results file stem")
    ap.add_argument("--label", default="", help="names the checkout in the rows and plot")
    ap.add_argument("--want", choices=("all", "none"), default="all", help="rows asking for a mask")
    ap.add_argument("--plot-only", metavar="JSON,...", help="redraw the PNG from results files")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        files = [pathlib.Path(f) for f in args.plot_only.split(",")]
        plot([r for f in files for r in json.loads(f.read_text())], out / f"{args.name}.png")
        return
    rows = []
    print(
        f"{'B':>5} {'label':>8} {'sample':>8} {'busy':>8} {'check':>7} {'index':>7} "
        f"{'config':>7} {'triton':>8} {'gpu':>7}"
    )
    for batch in [int(x) for x in args.batches.split(",") if x]:
        row = run_batch(batch, args.vocab, args.calls, args.label, args.want)
        rows.append(row)
        print(
            f"{batch:>5} {args.label:>8} {row['sample_host_us']:>8.1f} {row['busy_host_us']:>8.1f} "
            f"{row['check_inputs_us']:>7.1f} "
            f"{row['mask_index_us']:>7.1f} {row['band_config_us']:>7.1f} "
            f"{row['sample_triton_us']:>8.1f} {row['gpu_replay_us']:>7.1f}",
            flush=True,
        )
        for p in row["profile"][:12]:
            print(
                f"      {p['own_us']:>7.1f} own {p['cum_us']:>7.1f} cum "
                f"{p['calls_per_sample']:>5.1f}x  {p['function']}"
            )
        (out / f"{args.name}.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / f"{args.name}.png")


if __name__ == "__main__":
    main()
