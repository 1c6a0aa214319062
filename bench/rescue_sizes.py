"""Which rows the rescue takes and how many keys it gathers: a CPU emulation of pass 1's
segment floors, no kernels.

Pass 1 (band_lanes_kernel) leaves each segment c a floor d_c: the largest token it did not
write, which is a lane's third token or a lane top below the segment's cut (at most KC tops
within DELTA nats of the segment max are written). Resolve decides a row from the tokens
above D = max d_c; when the row's top-p support reaches down to D the band is not enough,
and the rescue lists every token above t, the second-largest floor (one more read of the
segment with the high floor), and picks from them: a second round takes the next floor
when t lies in the support too. This emulates that for a batch size's default shape
(band_config) on the kernel benchmark's Zipf rows (T = 1) and prints, for each rescued row,
its support size, the tokens above t (what the rescue gathers and sorts: a 256-key tier
when they fit, else a 1024-key one) and the rounds it takes. The cut is emulated as the KC
largest tops (the kernel's quartering search may write a few fewer), so the floors can sit
a little low.

    python bench/rescue_sizes.py [--rows 4096] [--vocab 151936] [--batch 256]

Writes rescue_sizes.json and rescue_sizes.png under --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.lane_collisions import rows_of
from maskgate.kernels.triton_path import DELTA, TIERS, band_config


def segment_floors(z: torch.Tensor, segment: int, lanes: int, kc: int) -> torch.Tensor:
    """[B, V] z -> [B, segments] floors d_c, as pass 1 leaves them (two tokens a lane)."""
    rows, vocab = z.shape
    n_seg = -(-vocab // segment)
    pad = torch.full((rows, n_seg * segment - vocab), float("-inf"), dtype=z.dtype)
    tiles = torch.cat([z, pad], 1).view(rows, n_seg, segment // lanes, lanes)
    top3 = torch.topk(tiles, min(3, segment // lanes), dim=2).values
    tops = top3[:, :, :2, :].reshape(rows, n_seg, -1)  # each lane's two largest
    let_go = (
        top3[:, :, 2, :].amax(-1)
        if top3.shape[2] > 2
        else torch.full_like(tops[..., 0], float("-inf"))
    )
    lo = torch.maximum(tops.amax(-1) - DELTA, let_go)
    in_band = (tops >= lo[..., None]).sum(-1)
    kth = torch.sort(tops, dim=-1, descending=True).values[:, :, kc]  # first top past KC
    below = torch.where(tops < lo[..., None], tops, float("-inf")).amax(-1)
    return torch.maximum(let_go, torch.where(in_band > kc, kth, below))


def rescued(z: torch.Tensor, floors: torch.Tensor, top_p: float) -> list[dict]:
    """The rows whose support reaches the row floor: support size, tokens above t, rounds."""
    zs = torch.sort(z, 1, descending=True).values
    p = torch.softmax(zs, 1)
    n_s = ((torch.cumsum(p, 1) - p) < top_p).sum(1)
    z_last = zs.gather(1, (n_s - 1)[:, None])[:, 0]  # the support's smallest z
    order = torch.sort(floors, -1, descending=True).values
    out = []
    for r in (z_last <= order[:, 0]).nonzero().flatten().tolist():
        rounds = 1
        while rounds < order.shape[1] - 1 and z_last[r] <= order[r, rounds]:
            rounds += 1  # t in the support too: the next floor down
        t = order[r, rounds]
        out.append({"support": int(n_s[r]), "above_t": int((z[r] > t).sum()), "rounds": rounds})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch", type=int, default=256, help="the batch size whose shape is used")
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    cfg = band_config(args.vocab, batch=args.batch)
    rows = []
    for first in range(0, args.rows, 256):  # 256 rows at a time: [256, V] float64 sorts
        n = min(256, args.rows - first)
        z = rows_of("zipf", n, args.vocab, args.seed + first).double()
        rows += rescued(z, segment_floors(z, cfg.chunk, cfg.lanes, cfg.kc), args.top_p)
    above = sorted(r["above_t"] for r in rows)
    summary = {
        "vocab": args.vocab,
        "batch": args.batch,
        "segment": cfg.chunk,
        "segments": cfg.n_chunks,
        "kc": cfg.kc,
        "top_p": args.top_p,
        "rows": args.rows,
        "rescued": len(rows),
        "rescued_rate": len(rows) / args.rows,
        "fit_first_tier": sum(a <= TIERS[0] for a in above),
        "fit_512": sum(a <= 512 for a in above),
        "fit_second_tier": sum(a <= TIERS[1] for a in above),
        "two_rounds": sum(r["rounds"] > 1 for r in rows),
    }
    print(
        f"V = {args.vocab}, B = {args.batch}'s shape ({cfg.n_chunks} segments of {cfg.chunk},"
        f" KC {cfg.kc}), top-p {args.top_p}: {len(rows)} of {args.rows} rows rescued"
        f" ({100 * summary['rescued_rate']:.2f}%)"
    )
    print(f"{'|S|':>5} {'above t':>8} {'rounds':>6}")
    for r in rows:
        print(f"{r['support']:>5} {r['above_t']:>8} {r['rounds']:>6}")
    print(
        f"tokens above t: <= {TIERS[0]} in {summary['fit_first_tier']}, <= 512 in "
        f"{summary['fit_512']}, <= {TIERS[1]} in {summary['fit_second_tier']}"
    )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rescue_sizes.json").write_text(json.dumps({**summary, "rows_rescued": rows}, indent=1))
    plot(above, out / "rescue_sizes.png", summary)


def plot(above: list[int], path: pathlib.Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(above, bins=20, color="tab:blue")
    for tier in (TIERS[0], 512, TIERS[1]):
        ax.axvline(tier, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("tokens above the rescue's floor t (keys it gathers and sorts)")
    ax.set_ylabel("rescued rows")
    ax.set_title(
        f"V = {summary['vocab']}, B = {summary['batch']}'s shape: {summary['rescued']} of "
        f"{summary['rows']} Zipf rows rescued",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
