"""How often pass 1's candidate slots lose a row's support, per segment shape: a CPU count.

A pass-1 segment writes at most KC candidates (its best lane tops within DELTA of its max).
A segment that holds more than KC tokens of a row's support S sets its floor d_c inside S,
as does a lane holding three of them (bench/lane_collisions.py), and the band alone cannot
decide the row: resolve takes the rescue, which reads again the segments whose floors lie
above a lower one, one more segment a round for up to RESCUE_ROUNDS rounds. A row with more
bad segments than that takes the bisection (64-128 passes over the row). Fewer slots make
resolve's candidate block smaller (B = 1 at V = 151936: 75 segments x 8 slots fit a
1024-key block, x 16 need 2048), so this is the price of a smaller block.

For each (segment tokens, KC) it counts, on Zipf rows (the kernel benchmark's generator) and
Gaussian rows (a random-weight model's logits, supports of hundreds of tokens), at top-p 0.9
and 0.95: the rows the band loses (a segment over KC, or a lane with three) and the rows with
more than RESCUE_ROUNDS segments over KC (a lower bound on the bisections: the rescue's reach
also ends at 4096 tokens above its floor).

    python bench/slot_limits.py [--rows 1024] [--vocab 151936]

Prints a table; writes slot_limits.json and slot_limits.png under --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.lane_collisions import lane_of, parse, plot_rates, rows_of, supports
from maskgate.kernels.triton_path import LANES, RESCUE_ROUNDS

# (segment tokens, KC): B = 1's default (75 x 16 at V = 151936) and the smaller blocks timed
# in session 11, then B = 128's default (10 x 128) and a 64-slot variant.
SHAPES = [(2048, 16), (2048, 8), (2560, 16), (4096, 16), (16384, 128), (16384, 64)]


def count(args: argparse.Namespace) -> list[dict]:
    out = []
    for kind in ("zipf", "gaussian"):
        z = rows_of(kind, args.rows, args.vocab, args.seed)
        for top_p in (0.9, 0.95):
            sup = [s for s in supports(z, top_p) if len(s)]
            for segment, kc in SHAPES:
                lost = beyond = 0
                for s in sup:
                    over = int((torch.bincount(s // segment) > kc).sum())
                    three = int(torch.bincount(lane_of(s, LANES, segment)).max()) >= 3
                    lost += over > 0 or three
                    beyond += over > RESCUE_ROUNDS
                n_seg = -(-args.vocab // segment)
                out.append(
                    {
                        "logits": kind,
                        "top_p": top_p,
                        "segment": segment,
                        "kc": kc,
                        "slots": n_seg * kc,
                        "rows": len(sup),
                        "support_max": max(len(s) for s in sup),
                        "lost_rate": lost / len(sup),
                        "beyond_rescue_rate": beyond / len(sup),
                    }
                )
    return out


def plot(rows: list[dict], path: pathlib.Path) -> None:
    plot_rates(
        rows,
        path,
        ("segment", "kc"),
        SHAPES,
        [f"{s}x{kc}" for s, kc in SHAPES],
        "pass-1 segment tokens x candidate slots (KC)",
        "rows the band loses (%)",
    )


def main() -> None:
    args = parse(1024)
    rows = count(args)
    print(
        f"{'logits':>8} {'top_p':>5} {'shape':>10} {'slots':>5} {'|S| max':>7} "
        f"{'lost %':>7} {'>rounds %':>9}"
    )
    for r in rows:
        print(
            f"{r['logits']:>8} {r['top_p']:>5} {r['segment']:>5}x{r['kc']:<4} {r['slots']:>5} "
            f"{r['support_max']:>7} {100 * r['lost_rate']:>7.2f} "
            f"{100 * r['beyond_rescue_rate']:>9.2f}"
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "slot_limits.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "slot_limits.png")


if __name__ == "__main__":
    main()
