"""How close pass 1's normaliser sums come to float64, under the Triton interpreter (no GPU).

Pass 1 (`band_lanes_kernel`) writes, per segment c of a row, s_c = sum exp(z - m_c); resolve
combines them into the row's normaliser Z. Top-p decides on Z, so its rounding is what the
oracle's ambiguity band has to absorb. This script runs pass 1 at B = 128's launch shape on
a real model's rows (bench/real_rows.py's file) at several temperatures and on Zipf rows,
and prints the relative error of s_c and of the combined Z against float64 sums over the
same float32 z = RN(x / T) (and against exp((x - x_max) / T), the logit-space form pass 1
computes in). The interpreter's exp2 is numpy's (correctly rounded float32), the H200's is
`ex2.approx`, so this compares the arithmetic around the exponentials (references,
rescales, sums) of pass-1 variants, not the GPU's own figure.

    python bench/pass1_sums.py --real ROWS.pt --rows 24 --out bench/results/pass1_sums.json
    python bench/pass1_sums.py --plot a.json b.json ... --png bench/results/pass1_sums.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import time

import torch

TEMPERATURES = (0.7, 1.0, 1.3)
ZIPF_ALPHAS = (1.0, 1.6)
METRICS = ("seg_z", "row_z", "row_logit")


def _summary(values: list[float]) -> dict[str, float]:
    """max, mean and p99 (the value at rank floor(0.99 (n - 1)) of n, ascending)."""
    ordered = sorted(values)
    return {
        "max": ordered[-1],
        "p99": ordered[int(0.99 * (len(ordered) - 1))],
        "mean": sum(ordered) / len(ordered),
    }


def sum_errors(x: torch.Tensor, temperature: float, launch_rows: int) -> dict[str, dict]:
    """Pass 1 on x ([B, V] float32) at one temperature with launch_rows' shape: the relative
    errors of each segment's s_c and of each row's Z (combined in float64 from the segments'
    s_c and maxima m_c, so only pass 1's rounding is in it), summarised. Rows must be
    finite somewhere; segments of -inf only are left out."""
    from maskgate.kernels.triton_path import band_config, launch_band

    rows, vocab = x.shape
    cfg = band_config(vocab, batch=launch_rows)
    temps = torch.full((rows,), temperature)
    keys = torch.empty((rows, cfg.ncand), dtype=torch.int64)
    m, s, d = (torch.empty((rows, cfg.n_chunks)) for _ in range(3))
    launch_band(x, temps, keys, m, s, d, cfg)
    errors: dict[str, list[float]] = {name: [] for name in METRICS}
    for r in range(rows):
        z = (x[r] / temps[r]).double()  # z = RN(x / T) in float32, widened
        logits = x[r].double()
        combined = 0.0
        top = float(m[r].max())
        for c in range(cfg.n_chunks):
            part = slice(c * cfg.chunk, min((c + 1) * cfg.chunk, vocab))
            if not math.isfinite(float(m[r, c])):
                continue  # a segment of -inf only: s_c is 0 and adds nothing
            exact = torch.exp(z[part] - z[part].max()).sum().item()
            errors["seg_z"].append(abs(float(s[r, c]) / exact - 1))
            combined += float(s[r, c]) * math.exp(float(m[r, c]) - top)
        z_row = torch.exp(z - z.max()).sum().item()
        t = float(temps[r])  # float32(T), as the kernel reads it
        logit_row = torch.exp((logits - logits.max()) / t).sum().item()
        errors["row_z"].append(abs(combined / z_row - 1))
        errors["row_logit"].append(abs(combined / logit_row - 1))
    return {name: _summary(values) for name, values in errors.items()}


def run(real: str, rows: int) -> dict[str, dict]:
    from maskgate.kernels.workloads import peaked_logits

    real_rows = torch.load(real)["logits"].float()[:rows].contiguous()
    cases = {f"real_T{t}": (real_rows, t) for t in TEMPERATURES}
    gen = torch.Generator().manual_seed(0)
    for alpha in ZIPF_ALPHAS:
        cases[f"zipf_a{alpha}"] = (peaked_logits(max(rows // 2, 1), 151936, alpha, gen), 1.0)
    results = {}
    start = time.time()
    for name, (x, t) in cases.items():
        results[name] = sum_errors(x, t, launch_rows=128)
        line = "  ".join(
            f"{k} {results[name][k]['max']:.2e}/{results[name][k]['p99']:.2e}" for k in METRICS
        )
        print(f"{name:12s} {line}   ({time.time() - start:.0f} s)", flush=True)
    return results


def plot(files: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {pathlib.Path(f).stem: json.loads(pathlib.Path(f).read_text()) for f in files}
    cases = list(next(iter(runs.values()))["results"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, metric in zip(axes, ("seg_z", "row_z"), strict=True):
        width = 0.8 / len(runs)
        for i, (label, run_) in enumerate(runs.items()):
            values = [run_["results"][c][metric]["max"] for c in cases]
            ax.bar([j + i * width for j in range(len(cases))], values, width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, fontsize=8)
        ax.set_title(f"{metric}: largest relative error")
    axes[0].set_ylabel("relative error against float64")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", help="bench/real_rows.py's file of a real model's logits")
    ap.add_argument("--rows", type=int, default=24, help="real rows (half as many Zipf rows)")
    ap.add_argument("--out", default="bench/results/pass1_sums.json")
    ap.add_argument("--label", default="", help="a name for the kernels measured")
    ap.add_argument("--plot", nargs="+", metavar="JSON", help="draw these results files")
    ap.add_argument("--png", default="bench/results/pass1_sums.png")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        return
    if not args.real:
        ap.error("--real is required (bench/real_rows.py writes the file)")
    # before anything imports triton (the kernels are imported in the functions above)
    os.environ["TRITON_INTERPRET"] = "1"
    from maskgate import kernels

    kernels.interpreter.install()  # tuple reductions as a tree over blocks, as on the GPU
    results = run(args.real, args.rows)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"label": args.label, "rows": args.rows, "results": results}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
