"""Which rows leave kernels.sample's band path, and which way they leave it.

Rows the band cannot decide are counted as fallback rows, and they take one of two ways out:

  rescue     round r reads again the segments whose floors lie above t_r, the (r+1)-th
             largest segment floor below the row's (up to RESCUE_ROUNDS rounds), and lists
             every token above t_r; it decides when S lies above t_r, at most RESCUE_TIERS x
             T2 (4096) tokens lie above it and S fits in T2 (1024);
  bisection  otherwise: a threshold bisection over the whole row (64-128 passes, slow).

This draws Gaussian logits (a random-weight model's rows: its lm_head gives logits of about
--std standard deviation), samples them with top-p and masks on, and for every fallback row
reruns pass 1 for the segment floors and predicts the way out from the counts above them.
Under the interpreter (CPU) it also counts the bisections that actually ran.
--config-batch picks the pass-1 shape the worker would use at that batch size. On CPU it
runs the Triton path under TRITON_INTERPRET=1 (about 4 s a row at V = 128256).

    TRITON_INTERPRET=1 python bench/fallback_probe.py --rows 128 --config-batch 128
    python bench/fallback_probe.py --device cuda --rows 4096 --config-batch 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from maskgate import kernels
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton_path import (
    RESCUE_ROUNDS,
    RESCUE_TIERS,
    TIERS,
    band_config,
    launch_band,
    sample_triton,
)

if os.environ.get("TRITON_INTERPRET") == "1":
    kernels.interpreter.install()  # tuple reductions on whole blocks, not element by element


def rescue_round(
    z: torch.Tensor, floors: torch.Tensor, support: int, rounds: int = RESCUE_ROUNDS
) -> tuple[int, list[int]]:
    """The rescue round predicted to decide one fallback row (0: none, the row is read
    whole), and the tokens above each round's floor: round r lists every token above the
    (r+1)-th largest segment floor and decides when the support lies above it, at most
    RESCUE_TIERS x T2 tokens do, and the support fits in T2."""
    distinct = sorted(set(floors.tolist()), reverse=True)[1 : rounds + 1]
    above = [int((z > t).sum()) for t in distinct]
    for r, n in enumerate(above):
        if n > RESCUE_TIERS * TIERS[1]:
            break
        if support < n and support <= TIERS[1]:
            return r + 1, above
    return 0, above


def way_out(z: torch.Tensor, floors: torch.Tensor, support: int) -> tuple[str, list[int]]:
    """The predicted way out of one fallback row, and the tokens above each round's floor."""
    r, above = rescue_round(z, floors, support)
    return (f"rescue, round {r}" if r else "bisection"), above


def probe(args: argparse.Namespace) -> dict:
    dev = torch.device(args.device)
    rows, vocab = args.rows, args.vocab
    gen = torch.Generator().manual_seed(args.seed)
    z = torch.randn(rows, vocab, generator=gen) * args.std
    numbers = list(range(rows))  # each sampled row's number in the draw
    if args.only:  # these rows of the draw alone
        numbers = [int(r) for r in args.only.split(",")]
        z = z[numbers]
        rows = len(numbers)
    z = z.to(dev)
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
    bisections = []
    if dev.type == "cpu":  # the interpreter runs resolve_row as Python: count the bisections
        import maskgate.kernels.triton_resolve as resolve

        bisect = resolve.fallback_support

        def counted(*a: object) -> object:
            bisections.append(1)
            return bisect(*a)

        resolve.fallback_support = counted
    res = sample_triton(inp, cfg)
    fallback = res.fallback_rows.bool().cpu()
    # Pass 1 again, for the segment floors the rescue works from.
    cand_key = torch.empty(rows, cfg.ncand, dtype=torch.int64, device=dev)
    m_c, s_c, d_c = (torch.empty(rows, cfg.n_chunks, device=dev) for _ in range(3))
    launch_band(z, ones, cand_key, m_c, s_c, d_c, cfg)
    d_c, z = d_c.cpu(), z.cpu()
    out = []
    for r in fallback.nonzero().squeeze(1).tolist():
        way, above = way_out(z[r], d_c[r], int(support[r]))
        out.append(
            {
                "row": numbers[r],
                "support": int(support[r]),
                "listed": int((z[r] > d_c[r].max()).sum()),
                "above_t": above,
                "way": way,
            }
        )
    return {
        "bisections_observed": len(bisections) if dev.type == "cpu" else None,
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
    ap.add_argument("--only", default="", help="rows of the draw to sample alone: 52,60")
    ap.add_argument("--out", default="", help="a JSON file for the results")
    args = ap.parse_args()
    result = probe(args)
    ways = [f["way"] for f in result["fallback_rows"]]
    rescued = sum(w.startswith("rescue") for w in ways)
    print(
        f"config {result['config']}\n"
        f"rows {result['rows']}  support mean {result['support_mean']:.1f} max "
        f"{result['support_max']}  fallback {len(ways)}  rescue {rescued}  "
        f"bisection {ways.count('bisection')} (observed: {result['bisections_observed']})"
    )
    print(f"{'row':>5} {'|S|':>5} {'listed':>7} {'above each round floor':>24}  way")
    for f in result["fallback_rows"]:
        above = ",".join(map(str, f["above_t"]))
        print(f"{f['row']:>5} {f['support']:>5} {f['listed']:>7} {above:>24}  {f['way']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
