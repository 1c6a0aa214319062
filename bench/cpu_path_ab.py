"""The CPU torch path of two source trees, timed in turn: kernels.sample on a real model's rows.

    python bench/cpu_path_ab.py --trees before=<an older checkout>,after=. \
        --real .cache/real_rows/smollm2.pt --threads 1,2 --rounds 4

Each (round, thread count, tree) is a process of its own that imports `kernels` from that tree
(OMP_NUM_THREADS sets its torch threads), so the trees alternate and a slow spell of a shared
machine falls on both. A process times every case 15 times after two warm-up calls; the table
gives the median over rounds of each process's median wall time (and CPU time), with the
rounds' range. Cases: B in 1, 8, 16, 64 rows (the first B of a fixed shuffle of the file) x
bench_kernels.py's three settings (top-k 50 + top-p 0.9, top-p 0.95, min-p 0.05; masks on) and
plain rows (nothing truncates, no mask).
Saves cpu_path_ab.json and cpu_path_ab.png under --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# Imported before a child puts its tree first on sys.path: the timing code is this tree's.
from bench.cpu_timing import median_times, sample_args

BATCHES = (1, 8, 16, 64)
# name: (top_k, top_p, min_p, want_mask)
SETTINGS = {
    "k50_p0.9": (50, 0.9, 0.0, True),
    "p0.95": (-1, 0.95, 0.0, True),
    "minp0.05": (-1, 1.0, 0.05, True),
    "plain": (-1, 1.0, 0.0, False),
}
REPEATS = 15


def child(tree: str, real: str) -> None:
    """Times every case with `kernels` from `tree`; prints one JSON line."""
    sys.path.insert(0, tree)
    import torch

    from maskgate import kernels

    assert pathlib.Path(kernels.__file__).resolve().is_relative_to(pathlib.Path(tree).resolve())
    rows = torch.load(real)["logits"].float()
    rows = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))]
    out = {}
    for batch in BATCHES:
        x = rows[:batch].contiguous()
        for name, (k, p, mp, want) in SETTINGS.items():
            args = sample_args(x, k, p, mp, want)
            kw = {
                "max_mask_tokens": 4096,
                "seed": torch.arange(batch),
                "step": torch.zeros(batch, dtype=torch.int64),
            }
            call = functools.partial(kernels.sample, *args, **kw)
            out[f"{batch}/{name}"] = list(median_times(call, REPEATS, warmup=2))
    print(json.dumps(out))


def describe_tree(tree: str) -> str:
    """The tree's commit, and whether its kernels/ differ from it (the results file records
    this, not the machine's path)."""
    git = ["git", "-C", tree]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "not a git checkout"
    diff = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "kernels"], check=False)
    return head.stdout.strip() + (" with kernels/ changed" if diff.returncode else "")


def run(trees: dict[str, str], threads: list[int], rounds: int, real: str) -> dict:
    runs: dict[str, list[dict]] = {}
    for r in range(rounds):
        for t in threads:
            for label, tree in trees.items():
                env = {**os.environ, "OMP_NUM_THREADS": str(t)}
                cmd = [sys.executable, __file__, "--child", tree, "--real", real]
                line = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                runs.setdefault(f"{label}/t{t}", []).append(
                    json.loads(line.stdout.splitlines()[-1])
                )
                print(f"round {r + 1}/{rounds} {label} threads={t} done", flush=True)
    return runs


def summarise(runs: dict[str, list[dict]], trees: list[str], threads: list[int]) -> list[dict]:
    rows = []
    for t in threads:
        for case in runs[f"{trees[0]}/t{t}"][0]:
            row = {"threads": t, "case": case}
            for label in trees:
                walls = [r[case][0] for r in runs[f"{label}/t{t}"]]
                row[f"{label}_wall_ms"] = round(statistics.median(walls), 2)
                row[f"{label}_wall_range"] = [round(min(walls), 2), round(max(walls), 2)]
                cpus = [r[case][1] for r in runs[f"{label}/t{t}"]]
                row[f"{label}_cpu_ms"] = round(statistics.median(cpus), 2)
            rows.append(row)
    return rows


def plot(rows: list[dict], trees: list[str], threads: list[int], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.bench_fallback import bar_panel

    fig, axes = plt.subplots(1, len(threads), figsize=(7 * len(threads), 4.5), squeeze=False)
    for ax, t in zip(axes[0], threads, strict=True):
        sel = [r for r in rows if r["threads"] == t]
        series = []
        for label in trees:
            med = [r[f"{label}_wall_ms"] for r in sel]
            lo = [m - r[f"{label}_wall_range"][0] for m, r in zip(med, sel, strict=True)]
            hi = [r[f"{label}_wall_range"][1] - m for m, r in zip(med, sel, strict=True)]
            series.append((label, med, [lo, hi]))
        ylabel = "ms per kernels.sample call (median of rounds)"
        bar_panel(ax, [r["case"] for r in sel], series, ylabel, f"CPU path, {t} torch thread(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", help="label=path,label=path (the first is the baseline)")
    ap.add_argument("--real", required=True, help="a bench/real_rows.py file")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--child", metavar="TREE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.real)
        return
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    threads = [int(t) for t in args.threads.split(",")]
    rows = summarise(run(trees, threads, args.rounds, args.real), list(trees), threads)
    base, *others = list(trees)
    print(f"{'thr':>3} {'case':>14} " + " ".join(f"{label:>22}" for label in trees) + "  speed-up")
    for r in rows:
        cells = [
            f"{r[f'{label}_wall_ms']:7.1f} ({r[f'{label}_wall_range'][0]:.1f}-{r[f'{label}_wall_range'][1]:.1f})"
            for label in trees
        ]
        gains = " ".join(f"{r[f'{base}_wall_ms'] / r[f'{o}_wall_ms']:.2f}x" for o in others)
        print(
            f"{r['threads']:>3} {r['case']:>14} "
            + " ".join(f"{c:>22}" for c in cells)
            + f"  {gains}"
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "trees": {label: describe_tree(tree) for label, tree in trees.items()},
        "rounds": args.rounds,
        "repeats": REPEATS,
        "rows": rows,
    }
    (out / "cpu_path_ab.json").write_text(json.dumps(doc, indent=1))
    plot(rows, list(trees), threads, out / "cpu_path_ab.png")


if __name__ == "__main__":
    main()
