"""How often pass 1's end-of-segment reread runs, and which rows it keeps from the rescue: a
CPU count on Zipf rows (the kernel benchmark's generator) and Gaussian rows (a random-weight
model's logits, whose top-p supports reach hundreds of tokens), no kernels.

A pass-1 lane keeps its two largest tokens and d, the largest it let go. A segment whose
d_lanes (the max of d) lies within DELTA of its max sets its band floor there, and a row
whose support reaches below the highest such floor takes the rescue in resolve. With
reread, a segment whose floor has fewer than `below` lane tops above it reads its collided
lanes again, and their floor drops to their fourth token. For each segment shape and
threshold this prints the share of segments that read again and the rows left to the
rescue (the KC slot limit is modelled; float64, T = 1, top-p 0.95), and how those rows get
out: the rescue round that decides each (rounds 1/2/3) or the whole-row fallback, which
reads the row several times in one program (about 1 ms a row on the H200).

    python bench/reread_probe.py [--rows 1024] [--shapes 16384:128,25600:256,32768:256]
                                 [--kinds zipf,gauss] [--thresholds 0,8,16,32]
                                 [--vocab 151936]

Writes reread_probe.json and reread_probe.png under --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.fallback_probe import rescue_round
from bench.lane_collisions import rows_of
from maskgate.kernels.triton_path import RESCUE_ROUNDS

VOCAB, LANES, DELTA, TOP_P = 151936, 512, 12.0, 0.95
THRESHOLDS = (0, 8, 16, 32, 64, 1 << 30)  # 0: no reread; 1 << 30: every collided segment
MANY = 8  # collided lanes: a segment that reads again with more must choose among them


def support_floor(z: torch.Tensor) -> torch.Tensor:
    """The z of each row's last support token (top-p, design order)."""
    ps, order = z.softmax(-1).sort(dim=-1, descending=True, stable=True)
    n = ((ps.cumsum(-1) - ps) < TOP_P).sum(-1)
    return z.gather(1, order).gather(1, (n - 1).unsqueeze(1)).squeeze(1)


def probe(
    z: torch.Tensor, seg: int, kc: int, thresholds: tuple[int, ...] = THRESHOLDS
) -> dict[int, tuple[int, float, int, int, list[int]]]:
    """Per threshold: (rows left to the rescue, share of segments read again, segments read
    again, those of them with more than MANY collided lanes, the rescued rows' ways out:
    how many the whole-row fallback takes, then rounds 1..RESCUE_ROUNDS)."""
    rows = z.shape[0]
    vocab = z.shape[1]
    nseg = -(-vocab // seg)
    pad = torch.full((rows, nseg * seg - vocab), float("-inf"), dtype=z.dtype)
    lanes = torch.cat([z, pad], 1).view(rows, nseg, seg // LANES, LANES)
    t1, t2, d3, d4 = lanes.topk(4, dim=2).values.unbind(2)
    tops = torch.cat([t1, t2], -1)
    lo0 = t1.amax(-1) - DELTA
    kth = tops.topk(kc + 1, -1).values[..., kc]  # the largest top left out past KC slots
    neg = torch.tensor(float("-inf"), dtype=z.dtype)

    def floor(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d_lanes = d.amax(-1)
        lo = torch.maximum(lo0, d_lanes)
        n_lo = (tops >= lo.unsqueeze(-1)).sum(-1)
        left = torch.where(tops < lo.unsqueeze(-1), tops, neg).amax(-1)
        d_c = torch.maximum(d_lanes, torch.where(n_lo > kc, kth, left))
        return d_c, n_lo, d_lanes

    zlast = support_floor(z)
    support = (z >= zlast.unsqueeze(1)).sum(-1)
    _, n_lo, d_lanes = floor(d3)
    out = {}
    for below in thresholds:
        again = (d_lanes >= lo0) & (n_lo < below)
        collided = d3 >= lo0.unsqueeze(-1)
        d_c2 = floor(torch.where(again.unsqueeze(-1) & collided, d4, d3))[0]
        many = int((again & (collided.sum(-1) > MANY)).sum())
        rescued = (d_c2.amax(-1) >= zlast).nonzero().flatten().tolist()
        ways = [0] * (RESCUE_ROUNDS + 1)
        for r in rescued:
            ways[rescue_round(z[r], d_c2[r], int(support[r]))[0]] += 1
        out[below] = (len(rescued), float(again.double().mean()), int(again.sum()), many, ways)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--shapes", default="16384:128,25600:256,32768:256", help="segment:KC,...")
    ap.add_argument("--kinds", default="zipf,gauss")
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument(
        "--thresholds", default=",".join(map(str, THRESHOLDS)), help="0 off, 1073741824 all"
    )
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    thresholds = tuple(int(v) for v in args.thresholds.split(","))
    results = []
    print(
        f"{'rows':>6} {'segment':>8} {'KC':>4} {'below':>6} {'rescued rows':>13} "
        f"{'read again':>11} {f'of them > {MANY} lanes':>17} {'rounds':>9} {'whole row':>9}"
    )
    for kind in args.kinds.split(","):
        for shape in args.shapes.split(","):
            seg, kc = (int(v) for v in shape.split(":"))
            totals = {b: [0, 0.0, 0, 0, [0] * (RESCUE_ROUNDS + 1)] for b in thresholds}
            batches = 4
            for seed in range(batches):
                z = rows_of(kind, args.rows // batches, args.vocab, seed).double()
                for below, (rescued, share, again, many, ways) in probe(
                    z, seg, kc, thresholds
                ).items():
                    totals[below][0] += rescued
                    totals[below][1] += share / batches
                    totals[below][2] += again
                    totals[below][3] += many
                    totals[below][4] = [a + b for a, b in zip(totals[below][4], ways, strict=True)]
            for below, (rescued, share, again, many, ways) in totals.items():
                label = "off" if below == 0 else ("all" if below >= 1 << 30 else str(below))
                print(
                    f"{kind:>6} {seg:>8} {kc:>4} {label:>6} {rescued:>13} {share:>10.2%} "
                    f"{f'{many} of {again}':>17} {'/'.join(map(str, ways[1:])):>9} {ways[0]:>9}"
                )
                results.append(
                    {
                        "kind": kind,
                        "vocab": args.vocab,
                        "segment": seg,
                        "kc": kc,
                        "below": label,
                        "rows": args.rows,
                        "rescued_rows": rescued,
                        "segments_read_again": share,
                        "segments_read_again_n": again,
                        f"of_them_over_{MANY}_collided_lanes": many,
                        "rescue_rounds": ways[1:],
                        "whole_row": ways[0],
                    }
                )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reread_probe.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "reread_probe.png")


def plot(results: list[dict], path: pathlib.Path) -> None:
    """Rows left to the rescue against the share of segments read again, a line a shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["kind"] for r in results})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for seg in sorted({r["segment"] for r in results}):
            pts = [r for r in results if r["kind"] == kind and r["segment"] == seg]
            xs = [100 * r["segments_read_again"] for r in pts]
            ax.plot(xs, [r["rescued_rows"] for r in pts], "o-", label=f"{seg}-token segments")
            for r, x in zip(pts, xs, strict=True):
                ax.annotate(r["below"], (x, r["rescued_rows"]), fontsize=7)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlabel("segments read again (%)")
        ax.set_ylabel(f"rows left to the rescue (of {pts[0]['rows']})")
        ax.set_title(f"{kind} rows, top-p {TOP_P}: threshold 'below' on each point")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
