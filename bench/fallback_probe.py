"""Which rows leave kernels.sample's band path, and which way they leave it.

Rows the band cannot decide are counted as fallback rows, and they take one of two ways out:

  rescue     one more read of the row lists every token above t, the second-largest segment
             floor; it decides when at most T2 (1024) tokens lie above t;
  bisection  otherwise: a threshold bisection over the whole row (64-128 passes, slow).

This draws Gaussian logits (a random-weight model's rows: its lm_head gives logits of about
--std standard deviation), samples them with top-p and masks on, and for every fallback row
reruns pass 1 to find t and counts the tokens above it. More than T2 means the bisection for
certain; at most T2 means the rescue can take the row ("rescue" below), though a row it
leaves undecided still goes on to the bisection.
--config-batch picks the pass-1 shape the worker would use at that batch size. On CPU it
runs the Triton path under TRITON_INTERPRET=1 (about 4 s a row at V = 128256).

    TRITON_INTERPRET=1 python bench/fallback_probe.py --rows 128 --config-batch 128
    python bench/fallback_probe.py --device cuda --rows 4096 --config-batch 128
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.inputs import check_inputs
from kernels.triton_path import TIERS, band_config, launch_band, sample_triton


def probe(args: argparse.Namespace) -> dict:
    dev = torch.device(args.device)
    rows, vocab = args.rows, args.vocab
    gen = torch.Generator().manual_seed(args.seed)
    z = (torch.randn(rows, vocab, generator=gen) * args.std).to(dev)
    probs = z.double().softmax(-1)
    sorted_p, _ = probs.sort(-1, descending=True)
    support = ((sorted_p.cumsum(-1) - sorted_p) < args.top_p).sum(-1).cpu()
    cfg = band_config(vocab, batch=args.config_batch)
    ones = torch.ones(rows, device=dev)
    inp = check_inputs(
        z,
        ones,
        torch.full((rows,), -1, dtype=torch.int32, device=dev),
        ones * args.top_p,
        ones * 0.0,
        torch.ones(rows, dtype=torch.bool),
        max_mask_tokens=4096,
        seed=torch.arange(rows, device=dev),
        step=torch.zeros(rows, dtype=torch.int64, device=dev),
    )
    res = sample_triton(inp, cfg)
    fallback = res.fallback_rows.bool().cpu()
    # Pass 1 again, for the segment floors the rescue works from.
    cand_key = torch.empty(rows, cfg.ncand, dtype=torch.int64, device=dev)
    m_c, s_c, d_c = (torch.empty(rows, cfg.n_chunks, device=dev) for _ in range(3))
    launch_band(z, ones, cand_key, m_c, s_c, d_c, cfg)
    d_c, z = d_c.cpu(), z.cpu()
    out = []
    for r in fallback.nonzero().squeeze(1).tolist():
        floors = d_c[r].clone()
        floors[int(floors.argmax())] = float("-inf")
        t = floors.max().item()
        above = int((z[r] > t).sum())
        out.append(
            {
                "row": r,
                "support": int(support[r]),
                "listed": int((z[r] > d_c[r].max()).sum()),
                "above_t": above,
                "way": "rescue" if above <= TIERS[1] else "bisection",
            }
        )
    return {
        "config": cfg.__dict__,
        "args": vars(args),
        "rows": rows,
        "support_mean": float(support.double().mean()),
        "support_max": int(support.max()),
        "fallback_rows": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--std", type=float, default=5.0)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--config-batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="", help="a JSON file for the results")
    args = ap.parse_args()
    result = probe(args)
    ways = [f["way"] for f in result["fallback_rows"]]
    print(
        f"config {result['config']}\n"
        f"rows {result['rows']}  support mean {result['support_mean']:.1f} max "
        f"{result['support_max']}  fallback {len(ways)}  rescue {ways.count('rescue')}  "
        f"bisection {ways.count('bisection')}"
    )
    print(f"{'row':>5} {'|S|':>5} {'listed':>7} {'above t':>8}  way")
    for f in result["fallback_rows"]:
        print(f"{f['row']:>5} {f['support']:>5} {f['listed']:>7} {f['above_t']:>8}  {f['way']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
