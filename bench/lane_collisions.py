"""How often pass 1's lanes lose a row's support, per pass-1 shape: a CPU count, no kernels.

band_lanes_kernel gives each lane (one position of a W-token tile, within one segment of SEG
tokens) room for its two largest tokens. A lane that holds three or more of a row's support
S lets the third go, so the row floor D lands inside S and the band cannot decide the row:
resolve then reads the row again (the rescue) or, with too many tokens above the second
floor, bisects it (design: counted as fallback rows). The chance grows as lanes per row
(W * segments) shrink, about |S|^3 / (6 L^2) of rows. This script counts, for each shape,
the rows whose support (top-p, sorted in float64) puts three tokens in one lane, on Zipf rows
(the kernel benchmark's generator) and on Gaussian rows (a random-weight model's logits,
whose top-p supports reach hundreds of tokens). It does not count the KC slot limit per
segment, so it is a lower bound on band failures. lost3_rate asks the same of a lane that
would keep three tokens (a row is lost when four share a lane): what such a pass 1 would buy.

    python bench/lane_collisions.py [--rows 512] [--vocab 151936] [--shapes 512x4096,...]

Prints a table; writes lane_collisions.json and lane_collisions.png under --out
(lane_collisions_v<V>.* for another vocabulary).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from maskgate.kernels.workloads import peaked_logits

# (lanes W, segment tokens): the default shapes at B = 1 and 128 (V = 151936), and the
# 32768-token candidates timed in session 6.
SHAPES = [(512, 2048), (512, 16384), (512, 32768), (1024, 32768)]


def rows_of(kind: str, rows: int, vocab: int, seed: int) -> torch.Tensor:
    """`rows` logit rows: "zipf", "gauss" (standard deviation 5) or "real" (the seed-th slice
    of bench/real_rows.py's model rows, whose vocabulary `vocab` must be)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "real":
        from bench.real_rows import rows as real_rows

        z = real_rows()
        if z.shape[1] != vocab:
            raise SystemExit(f"the real rows have V = {z.shape[1]}: pass --vocab {z.shape[1]}")
        return z[(seed * rows + torch.arange(rows)) % z.shape[0]]
    if kind == "zipf":
        return peaked_logits(rows, vocab, 1.6, g)
    return torch.randn(rows, vocab, generator=g) * 5.0  # the fallback probe's Gaussian rows


def supports(z: torch.Tensor, top_p: float) -> list[torch.Tensor]:
    """Each row's top-p support ids (design order, float64 masses)."""
    probs = z.double().softmax(-1)
    p, order = probs.sort(dim=-1, descending=True, stable=True)
    n = ((p.cumsum(-1) - p) < top_p).sum(-1)
    return [order[r, : int(n[r])] for r in range(z.shape[0])]


def lane_of(ids: torch.Tensor, lanes: int, segment: int) -> torch.Tensor:
    return (ids // segment) * lanes + (ids % segment) % lanes


def count(args: argparse.Namespace) -> list[dict]:
    out = []
    for kind in ("zipf", "gaussian"):
        z = rows_of(kind, args.rows, args.vocab, args.seed)
        for top_p in (0.9, 0.95):
            sup = supports(z, top_p)
            sizes = torch.tensor([len(s) for s in sup], dtype=torch.float64)
            for lanes, segment in args.shape_list:
                most = torch.tensor(
                    [
                        int(torch.bincount(lane_of(s, lanes, segment)).max()) if len(s) else 0
                        for s in sup
                    ]
                )
                lanes_per_row = lanes * -(-args.vocab // segment)
                out.append(
                    {
                        "logits": kind,
                        "top_p": top_p,
                        "lanes": lanes,
                        "segment": segment,
                        "lanes_per_row": lanes_per_row,
                        "rows": args.rows,
                        "support_mean": float(sizes.mean()),
                        "support_max": int(sizes.max()),
                        "lost_rate": float((most >= 3).double().mean()),
                        "lost3_rate": float((most >= 4).double().mean()),
                        "estimate": float((sizes**3 / (6 * lanes_per_row**2)).mean()),
                    }
                )
    return out


def plot_rates(
    rows: list[dict],
    path: pathlib.Path,
    keys: tuple,
    shapes: list,
    labels,
    xlabel: str,
    ylabel: str,
) -> None:
    """Bars of each row group's (logits, top_p) lost_rate per shape, the row's `keys`
    matching a shape (also bench/slot_limits.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    groups = sorted({(r["logits"], r["top_p"]) for r in rows})
    width = 0.8 / len(groups)
    for i, (kind, top_p) in enumerate(groups):
        vals = [
            next(
                r["lost_rate"]
                for r in rows
                if (r["logits"], r["top_p"], *(r[k] for k in keys)) == (kind, top_p, *shape)
            )
            for shape in shapes
        ]
        xs = [j + (i - len(groups) / 2 + 0.5) * width for j in range(len(shapes))]
        ax.bar(xs, [100 * v for v in vals], width, label=f"{kind} top-p {top_p}")
    ax.set_xticks(range(len(shapes)), labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_yscale("symlog", linthresh=0.1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot(rows: list[dict], path: pathlib.Path, shapes: list) -> None:
    plot_rates(
        rows,
        path,
        ("lanes", "segment"),
        shapes,
        [f"{w}x{s // 1024}k" for w, s in shapes],
        "pass-1 shape (lanes x segment tokens)",
        "rows with 3+ support tokens in one lane (%)",
    )


def parse(rows: int, shapes: list | None = None) -> argparse.Namespace:
    """The command line of this count and bench/slot_limits.py; with `shapes`, a --shapes
    option (lanes x segment tokens) defaulting to them, parsed into args.shape_list."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=rows)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results")
    if shapes is not None:
        ap.add_argument(
            "--shapes",
            default=",".join(f"{w}x{s}" for w, s in shapes),
            help="pass-1 shapes, lanes x segment tokens",
        )
    args = ap.parse_args()
    if shapes is not None:
        args.shape_list = [tuple(int(v) for v in x.split("x")) for x in args.shapes.split(",")]
    return args


def main() -> None:
    args = parse(512, SHAPES)
    rows = count(args)
    print(
        f"{'logits':>8} {'top_p':>5} {'shape':>10} {'lanes/row':>9} {'|S| mean':>8} "
        f"{'|S| max':>7} {'lost %':>7} {'~S^3/6L^2 %':>11} {'keep-3 lost %':>13}"
    )
    for r in rows:
        print(
            f"{r['logits']:>8} {r['top_p']:>5} {r['lanes']:>4}x{r['segment']:<5} "
            f"{r['lanes_per_row']:>9} {r['support_mean']:>8.1f} {r['support_max']:>7} "
            f"{100 * r['lost_rate']:>7.2f} {100 * r['estimate']:>11.2f} "
            f"{100 * r['lost3_rate']:>13.2f}"
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "lane_collisions" if args.vocab == 151936 else f"lane_collisions_v{args.vocab}"
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / f"{name}.png", args.shape_list)


if __name__ == "__main__":
    main()
