"""Seeded random batches through the Triton path (a band shrunk to 64-token chunks of 8
candidates, so most rows take the rescue or the whole-row fallback) and the torch path,
each against the float64 oracle, and the two paths' tokens and masks against each other on
every row the oracle does not flag as ambiguous. The batches come from
kernels.workloads.random_batch. The Triton path runs in Triton's interpreter, on the CPU
(about 10 s a batch of 12 rows at V = 200-700 on a 2-core machine).

    .venv/bin/python bench/kernel_fuzz.py --batches 40             # seeds 100..139
    .venv/bin/python bench/kernel_fuzz.py --batches 8 --vocab 1500,4000 --first-seed 900

CI runs three of these batches (tests/unit/kernels/test_kernels_interpreter.py). Writes
bench/results/kernel_fuzz.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def run_batch(seed: int, vocab_range: tuple[int, int] = (200, 700)) -> dict:
    """One random batch: its oracle check and where the two paths disagree."""
    from maskgate.kernels.conformance import check_result
    from maskgate.kernels.inputs import check_inputs
    from maskgate.kernels.reference import reference
    from maskgate.kernels.torch_path import sample_torch
    from maskgate.kernels.triton_path import band_config, sample_triton
    from maskgate.kernels.workloads import random_batch

    batch = random_batch(seed, vocab_range)
    inp = check_inputs(**batch)
    x = batch["logits"]
    tri = sample_triton(inp, band_config(x.shape[1], chunk=64, kc=8, lanes=16))
    cpu = sample_torch(inp)
    args = [batch[k] for k in ("temperature", "top_k", "top_p", "min_p")]
    ref = reference(x.float(), *args)
    rep = check_result(tri, ref, batch["want_mask"], batch["bounded"], batch["max_mask_tokens"])
    sure = ~ref.ambiguous
    rows = range(x.shape[0])
    mask_rows = tri.mask_rows.tolist()
    tri_masks, cpu_masks = tri.masks(), cpu.masks()
    return {
        "seed": seed,
        "vocab": x.shape[1],
        "rows": x.shape[0],
        "ok": rep.ok,
        "errors": rep.errors,
        "fallback": int(tri.fallback_rows.sum()),
        "ambiguous": int(ref.ambiguous.sum()),
        "token_diff": [r for r in rows if sure[r] and int(tri.tokens[r]) != int(cpu.tokens[r])],
        "mask_diff": [
            r for i, r in enumerate(mask_rows) if sure[r] and tri_masks[i] != cpu_masks[i]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--vocab", default="200,700", help="V is drawn from [lo, hi)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    lo, hi = (int(v) for v in args.vocab.split(","))
    runs = []
    print(f"{'seed':>6} {'V':>5} {'rows':>4} {'fallback':>8} {'ambiguous':>9} oracle  diffs")
    for seed in range(args.first_seed, args.first_seed + args.batches):
        r = run_batch(seed, (lo, hi))
        runs.append(r)
        diffs = len(r["token_diff"]) + len(r["mask_diff"])
        print(
            f"{seed:>6} {r['vocab']:>5} {r['rows']:>4} {r['fallback']:>8} {r['ambiguous']:>9} "
            f"{'ok' if r['ok'] else 'FAIL':>6} {diffs:>6}",
            flush=True,
        )
    total = {k: sum(r[k] for r in runs) for k in ("rows", "fallback", "ambiguous")}
    total["failed_batches"] = [r["seed"] for r in runs if not r["ok"]]
    total["rows_differing"] = sum(len(r["token_diff"]) + len(r["mask_diff"]) for r in runs)
    print(json.dumps(total))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_fuzz.json").write_text(json.dumps({"total": total, "batches": runs}, indent=1))


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    from maskgate import kernels

    kernels.interpreter.install()  # tuple reductions on whole blocks, not element by element
    main()
