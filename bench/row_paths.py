"""Which path each real row takes in resolve, on the CPU: the Triton path under the
interpreter (TRITON_INTERPRET=1, set here) at one batch size's pass-1 shape, one row a call,
counting the rescue's rounds (gather_above calls), the whole-row fallback's search reads
(_above3, _level_ids3), its bracket's listing read (_cut_listed), the read that lists S after
the search (fallback_gather: none when the bracket's read listed S too) and whether it ran
at all. Rows come
from bench/real_rows.py; top-p only.

    python bench/row_paths.py [--wide 6] [--mid 6] [--top-p 0.95] [--batch 128]
        [--rows .cache/real_rows/smollm2_512.pt --buffers 0,1]

--wide picks rows whose support is past the tiers' 1024 keys, --mid rows of 300-1024 tokens,
from the file's rows in order, or with --buffers from those launches of --batch rows in the
order bench_kernels.py --real times them (the rows shuffled once, seed 0; buffer b is the
b-th slice of --batch rows). Each row's support is checked against the oracle
(kernels.reference). About 30 s a row on a 2-core machine. Writes row_paths.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


import maskgate.kernels.triton_fallback as fallback
import maskgate.kernels.triton_resolve as resolve
from bench.real_rows import DEFAULT_PATH, support_sizes
from bench.real_rows import rows as real_rows
from maskgate import kernels
from maskgate.kernels.conformance import check_result
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.reference import reference
from maskgate.kernels.triton_path import band_config, sample_triton

kernels.interpreter.install()  # tuple reductions on whole blocks, not element by element

CALLS: dict[str, int] = {}
# resolve_row runs as Python under the interpreter, so the module names it calls can be wrapped
COUNTED = {
    fallback: ("_above3", "_level_ids3", "_cut_listed"),
    resolve: ("gather_above", "fallback_support", "fallback_gather"),
}


def counting(name: str, f):
    def counted(*args):
        CALLS[name] = CALLS.get(name, 0) + 1
        return f(*args)

    return counted


def count_calls() -> None:
    for module, names in COUNTED.items():
        for name in names:
            setattr(module, name, counting(name, getattr(module, name)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wide", type=int, default=6)
    ap.add_argument("--mid", type=int, default=6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--batch", type=int, default=128, help="the pass-1 shape of this batch size")
    ap.add_argument("--rows", type=pathlib.Path, default=DEFAULT_PATH, help="real_rows.py file")
    ap.add_argument("--buffers", default="", help="e.g. 0,1: those launches' rows only")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    count_calls()
    z = real_rows(args.rows)
    s = support_sizes(z, args.top_p)
    order = torch.arange(z.shape[0])
    if args.buffers:  # bench_kernels.load_real's shuffle, then make_inputs' slices
        perm = torch.randperm(z.shape[0], generator=torch.Generator().manual_seed(0))
        order = torch.cat(
            [perm[b * args.batch : (b + 1) * args.batch] for b in map(int, args.buffers.split(","))]
        )
    wide = order[s[order] > 1024][: args.wide].tolist()
    pick = wide + order[(s[order] > 300) & (s[order] <= 1024)][: args.mid].tolist()
    cfg = band_config(z.shape[1], batch=args.batch)
    one = torch.ones(1)
    out = []
    print(
        f"{'row':>5} {'|S|':>5} {'fallback':>8} {'rounds':>6} {'search reads':>12} "
        f"{'S read':>6} {'whole row':>9} {'oracle':>6}"
    )
    for r in pick:
        CALLS.clear()
        inp = check_inputs(
            z[r : r + 1],
            one,
            torch.full((1,), -1, dtype=torch.int32),
            one * args.top_p,
            one * 0,
            torch.ones(1, dtype=torch.bool),
            max_mask_tokens=4096,
            seed=torch.arange(1),
        )
        t0 = time.perf_counter()
        res = sample_triton(inp, cfg)
        ref = reference(inp.logits, one, inp.top_k, inp.top_p, inp.min_p)
        conf = check_result(res, ref, inp.want_mask, None, 4096)
        rec = {
            "row": r,
            "support": int(s[r]),
            "kernel_support": int(res.support_sizes[0]),
            "oracle_ok": conf.ok,
            "fallback": bool(res.fallback_rows[0]),
            "rescue_rounds": CALLS.get("gather_above", 0),
            "search_reads": CALLS.get("_above3", 0) + CALLS.get("_level_ids3", 0),
            "listing_reads": CALLS.get("_cut_listed", 0),
            "s_reads": CALLS.get("fallback_gather", 0),
            "whole_row": CALLS.get("fallback_support", 0) > 0,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        out.append(rec)
        print(
            f"{r:>5} {rec['support']:>5} {rec['fallback']!s:>8} {rec['rescue_rounds']:>6} "
            f"{rec['search_reads']:>12} {rec['s_reads']:>6} {rec['whole_row']!s:>9} "
            f"{rec['oracle_ok']!s:>6}",
            flush=True,
        )
    path = pathlib.Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "row_paths.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
