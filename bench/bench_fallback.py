"""Time kernels.sample on rows that only the whole-row fallback decides. Needs CUDA.

  python bench/bench_fallback.py [--label NAME] [--batches 1,128] [--out DIR]
  python bench/bench_fallback.py --plot BEFORE.json AFTER.json [--out DIR] [--png F --title T]
  python bench/bench_fallback.py --cpu [--label NAME]   (the CPU torch path, no CUDA)
  python bench/bench_fallback.py --real ROWS.pt --fb-blocks 1024,2048,4096 --cases ...

Rows the band cannot decide (flat, high-temperature rows whose support runs to thousands of
tokens; a top-k past the band; min-p alone on flat rows) are decided in resolve_kernel by
reads of the whole row, one program a row. Rows that nothing truncates (temperature sampling
with top_k off, top_p 1, min_p 0: a general pool's plain traffic, no mask) took that path
too; pass 1 now races them segment by segment. This script times those cases, the band's
Zipf top-p 0.95 rows alone, without masks, and with one plain row among them, V = 151936,
against the sort-based path (baseline b of bench_kernels.py, eager: its nonzero syncs) on
the same inputs. kernels.sample is timed as a CUDA graph of one call, replayed (median, us).
Writes fallback_bench[_LABEL].json; --plot draws two runs side by side into
fallback_bench.png. --cpu times the CPU path on rows nothing truncates, no mask (V = 49152
and 151936, one torch thread, median of 5 calls, ms) into fallback_bench_cpu[_LABEL].json.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
from collections.abc import Iterator

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

VOCAB = 151936
CAP = 4096
ALPHA = 1.6  # the Zipf rows of bench_kernels.py
# name: (logits, dtype, temperature, top_k, top_p, min_p, want_mask, bounded)
CASES = {
    "zipf_untruncated": ("zipf", torch.float32, 1.0, -1, 1.0, 0.0, False, False),
    "flat_untruncated": ("flat", torch.float32, 1.0, -1, 1.0, 0.0, False, False),
    "flat_p0.95": ("flat", torch.float32, 2.0, -1, 0.95, 0.0, True, False),
    "flat_p0.95_bounded": ("flat", torch.float32, 2.0, -1, 0.95, 0.0, True, True),
    "flat_p0.5": ("flat", torch.float32, 2.0, -1, 0.5, 0.0, True, False),
    "flat_k2000_p0.9": ("flat", torch.float32, 2.0, 2000, 0.9, 0.0, True, False),
    "flat_minp0.05": ("flat", torch.float32, 2.0, -1, 1.0, 0.05, True, False),
    "flat_bf16_p0.9": ("flat", torch.bfloat16, 1.0, -1, 0.9, 0.0, True, False),
    # The band's rows (the target setting) with and without one plain row among them.
    "zipf_p0.95": ("zipf", torch.float32, 1.0, -1, 0.95, 0.0, True, False),
    "zipf_p0.95_one_plain": ("zipf", torch.float32, 1.0, -1, 0.95, 0.0, True, False),
    # No mask asked: pass 1 is compiled with the race, which no row takes.
    "zipf_p0.95_no_mask": ("zipf", torch.float32, 1.0, -1, 0.95, 0.0, False, False),
    # A real model's rows (--real): wide supports take the rescue and the whole-row fallback.
    "real_p0.95": ("real", torch.float32, 1.0, -1, 0.95, 0.0, True, False),
}
REAL: dict[str, torch.Tensor] = {}  # --real: "logits", the rows in file order, on the GPU
# Cases whose first row samples plainly (nothing truncates, no mask) among the others.
ONE_PLAIN = {"zipf_p0.95_one_plain"}


def make_inputs(case: str, batch: int) -> dict:
    from maskgate.kernels.workloads import flat_logits, peaked_logits

    kind, dtype, temp, k, p, mp, want, bounded = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "real":
        x = REAL["logits"][torch.arange(batch) % REAL["logits"].shape[0]]
    elif kind == "flat":
        x = flat_logits(batch, VOCAB, g)
    else:
        x = peaked_logits(batch, VOCAB, ALPHA, g)
    dev = "cuda"
    top_p = torch.full((batch,), p, device=dev)
    want_mask = torch.full((batch,), want, dtype=torch.bool)
    if case in ONE_PLAIN:
        top_p[0] = 1.0
        want_mask[0] = False
    return {
        "logits": x.to(dtype),
        "temperature": torch.full((batch,), temp, device=dev),
        "top_k": torch.full((batch,), k, dtype=torch.int32, device=dev),
        "top_p": top_p,
        "min_p": torch.full((batch,), mp, device=dev),
        "want_mask": want_mask,
        "seed": torch.arange(batch, dtype=torch.int64, device=dev),
        "step": torch.zeros(batch, dtype=torch.int64, device=dev),
        "bounded": torch.full((batch,), bounded, dtype=torch.bool, device=dev),
    }


def run(
    batches: list[int], rep_ms: int, cases: list[str], fb_blocks: list[int], variant: str = ""
) -> Iterator[dict]:
    """Each case's row as soon as it is timed (main saves the file after each)."""
    from maskgate.kernels import triton_path

    for fb_block in fb_blocks:
        triton_path.FB_BLOCK = fb_block  # read at every launch: one compile per size
        yield from run_cases(batches, rep_ms, cases, fb_block, variant)


def run_cases(
    batches: list[int], rep_ms: int, cases: list[str], fb_block: int, variant: str = ""
) -> Iterator[dict]:
    from bench.bench_kernels import bench, replay_time, variant_config
    from bench.kernel_baselines import sort_path
    from maskgate.kernels.inputs import check_inputs
    from maskgate.kernels.triton_path import mask_index, sample_triton

    for case in cases:
        for batch in batches:
            b = make_inputs(case, batch)
            inp = check_inputs(**b, max_mask_tokens=CAP)
            index = mask_index(inp.want_mask, inp.logits.device)
            vocab = b["logits"].shape[1]
            cfg = variant_config(vocab, batch, variant)
            res = sample_triton(inp, cfg, index=index)
            us = replay_time(
                lambda inp=inp, index=index, cfg=cfg: sample_triton(inp, cfg, index=index), rep_ms
            )
            args = [b[n] for n in ("logits", "temperature", "top_k", "top_p", "min_p")]
            sort_us = bench(lambda args=args: sort_path(*args), rep_ms)  # eager: it syncs
            row = {
                "case": case,
                "batch": batch,
                "vocab": vocab,
                "fb_block": fb_block,
                "variant": variant or "default",
                "us": round(us, 1),
                "sort_us": round(sort_us, 1),
                "fallback": float(res.fallback_rows.float().mean()),
                "support_median": int(res.support_sizes.median()),
                "status": sorted({int(s) for s in res.mask_status.tolist()}),
            }
            print(
                f"{case:>20} B={batch:<4} FB_BLOCK={fb_block:<5} {row['us']:>10.1f} us  sort {row['sort_us']:>9.1f} us"
                f"  fallback {row['fallback']:.0%}  |S| {row['support_median']}"
                f"  status {row['status']}",
                flush=True,
            )
            yield row


def run_cpu(repeats: int = 5) -> list[dict]:
    """kernels.sample on the CPU, rows nothing truncates and no mask (the general pool's
    plain sampling on a CPU worker): median ms of `repeats` calls."""
    from bench.cpu_timing import median_times, sample_args
    from maskgate import kernels

    torch.set_num_threads(1)
    rows = []
    for vocab in (49152, VOCAB):
        for batch in (1, 8, 32):
            g = torch.Generator().manual_seed(0)
            x = 3 * torch.randn(batch, vocab, generator=g)
            args = sample_args(x, -1, 1.0, 0.0, want_mask=False)
            kw = {
                "max_mask_tokens": CAP,
                "seed": torch.arange(batch),
                "step": torch.zeros(batch, dtype=torch.int64),
            }
            call = functools.partial(kernels.sample, *args, **kw)
            wall_ms, _ = median_times(call, repeats, warmup=1)
            row = {"vocab": vocab, "batch": batch, "ms": round(wall_ms, 2)}
            rows.append(row)
            print(f"V={vocab:<7} B={batch:<3} {row['ms']:>9.2f} ms", flush=True)
    return rows


def _by_case(doc: dict) -> dict:
    return {(r["case"], r["batch"]): r for r in doc["rows"]}


def bar_panel(ax, labels: list[str], series: list[tuple], ylabel: str, title: str) -> None:
    """Grouped bars on a log scale, one group a label: series are (name, values, yerr or
    None), side by side in each group."""
    xs = range(len(labels))
    w = 0.8 / len(series)
    for i, (name, values, yerr) in enumerate(series):
        at = [x + (i - (len(series) - 1) / 2) * w for x in xs]
        ax.bar(at, values, w, yerr=yerr, label=name)
    ax.set_xticks(list(xs), labels, fontsize=7, rotation=30)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()


def plot(docs: list[dict], path: pathlib.Path, title: str) -> None:
    """One bar a run for each case of the last run, then the last run's sort path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = _by_case(docs[-1])
    keys = list(last)
    series = []
    for doc in docs:
        rows = _by_case(doc)
        series.append((doc["label"], [rows[k]["us"] if k in rows else 0 for k in keys], None))
    series.append(("sort path", [last[k]["sort_us"] for k in keys], None))
    labels = [f"{c}\nB={b} V={last[(c, b)]['vocab']}" for c, b in keys]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    bar_panel(ax, labels, series, "us per sample (graph replay, median)", f"{title}, H200")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="")
    ap.add_argument("--batches", default="1,128")
    ap.add_argument("--cases", default=",".join(CASES), help="cases to time")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument(
        "--plot", nargs="+", metavar="JSON", help="runs to compare (the first: before), no timing"
    )
    ap.add_argument("--png", default="fallback_bench.png", help="--plot: the file to draw")
    ap.add_argument("--title", default="Rows decided by the whole-row fallback", help="--plot")
    ap.add_argument("--cpu", action="store_true", help="the CPU path, rows nothing truncates")
    ap.add_argument("--real", metavar="PT", help="a real model's rows: adds case real_p0.95")
    ap.add_argument("--fb-blocks", default="", help="FB_BLOCK sizes to time (default: the one set)")
    ap.add_argument("--variant", default="", help="a bench_kernels.py variant (band_config's)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot:
        docs = [json.loads(pathlib.Path(p).read_text()) for p in args.plot]
        plot(docs, out / args.png, args.title)
        runs = [_by_case(doc) for doc in docs]
        print(f"{'case':>20} {'B':>4}" + "".join(f" {d['label']:>12}" for d in docs) + "   sort")
        for key, r in runs[-1].items():
            us = [run[key]["us"] if key in run else float("nan") for run in runs]
            print(f"{key[0]:>20} {key[1]:>4}" + "".join(f" {u:>12.1f}" for u in us), end="")
            print(f" {r['sort_us']:>6.0f}")
        return
    if args.cpu:
        name = f"fallback_bench_cpu_{args.label}.json" if args.label else "fallback_bench_cpu.json"
        doc = {"label": args.label or "run", "threads": 1, "rows": run_cpu()}
        (out / name).write_text(json.dumps(doc, indent=1))
        return
    if not torch.cuda.is_available():
        sys.exit("bench_fallback.py needs CUDA")
    from maskgate.kernels import triton_path

    cases = args.cases.split(",")
    if args.real:
        REAL["logits"] = torch.load(args.real)["logits"].float().cuda()
    else:
        cases = [c for c in cases if CASES[c][0] != "real"]
    fb_blocks = [int(v) for v in args.fb_blocks.split(",") if v] or [triton_path.FB_BLOCK]
    batches = [int(b) for b in args.batches.split(",")]
    name = f"fallback_bench_{args.label}.json" if args.label else "fallback_bench.json"
    doc = {
        "label": args.label or "run",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "vocab": VOCAB,
        "cap": CAP,
        "rows": [],
    }
    for row in run(batches, args.rep_ms, cases, fb_blocks, args.variant):
        doc["rows"].append(row)  # saved after every case: a run cut short keeps what it timed
        (out / name).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
