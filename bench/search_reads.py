"""How many reads the whole-row fallback's search takes, on the CPU: the Triton path under the
interpreter (TRITON_INTERPRET=1, set here), one row a call, counting the search's counting
reads (_above3), its listing read (_cut_listed) and the tokens in the bracket that read
lists and sorts. A row read costs the fallback about the same whatever its thresholds, so
the counts are what its search costs; the bracket's size is what the listing read sorts.

    python bench/search_reads.py [--vocab 151936] [--rows 4] [--top-p 0.5,0.9,0.95,0.99]
        [--real .cache/real_rows/smollm2_512.pt --real-rows 8] [--label NAME]
    python bench/search_reads.py --plot BEFORE.json AFTER.json

Rows: flat rows as bench_kernels.py's flat case makes them (N(0, 1) logits at temperature 2),
the same at temperature 1, Gaussian rows of standard deviation 5 at temperature 1 (the
worker benchmark's random-weight models), and with --real a real model's rows whose top-p
0.95 support is past the tiers' 1024 keys (bench/real_rows.py). Every row's support is
checked against the oracle (kernels.reference). About 15 s a row at V = 151936 on a 2-core
machine. Writes search_reads[_LABEL].{json,png} under --out (the mean reads per case);
--plot draws several runs side by side into search_reads.png.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


import maskgate.kernels.triton_fallback as fallback
from bench.real_rows import rows as real_rows
from bench.real_rows import support_sizes
from maskgate import kernels
from maskgate.kernels.conformance import check_result
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.reference import reference
from maskgate.kernels.triton_path import band_config, sample_triton

kernels.interpreter.install()  # tuple reductions on whole blocks, not element by element

READS: list[tuple[str, int]] = []  # ("count", 0) per counting read, ("list", n) per listing


def _scalar(t) -> int:
    return int(t.handle.data.item())


def count_reads() -> None:
    above3, cut_listed = fallback._above3, fallback._cut_listed

    def counted(*args):
        READS.append(("count", 0))
        return above3(*args)

    def listed(*args):
        READS.append(("list", _scalar(args[5])))  # c_lo - c_hi: the bracket's tokens
        return cut_listed(*args)

    fallback._above3, fallback._cut_listed = counted, listed


def run_row(z: torch.Tensor, temp: float, top_p: float, cfg) -> dict:
    one = torch.ones(1)
    inp = check_inputs(
        z[None],
        one * temp,
        torch.full((1,), -1, dtype=torch.int32),
        one * top_p,
        one * 0,
        torch.ones(1, dtype=torch.bool),
        max_mask_tokens=4096,
        seed=torch.arange(1),
    )
    READS.clear()
    res = sample_triton(inp, cfg)
    ref = reference(inp.logits, inp.temperature, inp.top_k, inp.top_p, inp.min_p)
    conf = check_result(res, ref, inp.want_mask, None, 4096)
    listed = [n for kind, n in READS if kind == "list"]
    return {
        "support": int(res.support_sizes[0]),
        "oracle_ok": conf.ok,
        "fallback": bool(res.fallback_rows[0]),
        "count_reads": sum(kind == "count" for kind, _ in READS),
        "listing_reads": len(listed),
        "bracket": listed[0] if listed else None,
    }


def cases(args) -> list[tuple[str, torch.Tensor, float, float]]:
    g = torch.Generator().manual_seed(0)
    out = []
    flat = torch.randn(args.rows, args.vocab, generator=g)
    for p in [float(x) for x in args.top_p.split(",")]:
        out += [(f"flat T=2 p{p}", row, 2.0, p) for row in flat]
    out += [("flat T=1 p0.9", row, 1.0, 0.9) for row in flat]
    gauss = torch.randn(args.rows, args.vocab, generator=g) * 5
    out += [("gauss5 p0.95", row, 1.0, 0.95) for row in gauss]
    if args.real:
        z = real_rows(pathlib.Path(args.real))
        wide = z[support_sizes(z, 0.95) > 1024][: args.real_rows]
        out += [("real wide p0.95", row, 1.0, 0.95) for row in wide]
    return out


def plot(summaries: list[list[dict]], path: pathlib.Path) -> None:
    """Mean counting reads a row per case, one bar a run (several runs side by side)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.5))
    names = list(dict.fromkeys(s["case"] for run in summaries for s in run))
    w = 0.8 / len(summaries)
    for i, run in enumerate(summaries):
        by = {s["case"]: s["count_reads_mean"] for s in run}
        xs = [j + (i - (len(summaries) - 1) / 2) * w for j in range(len(names))]
        ax.bar(xs, [by.get(n, 0) for n in names], w, label=run[0]["label"])
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=7)
    ax.set_ylabel("counting reads a row (mean)")
    ax.set_title("whole-row search under the interpreter")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rows", type=int, default=4, help="rows of each generated kind")
    ap.add_argument("--top-p", default="0.5,0.9,0.95,0.99", help="flat rows at T = 2")
    ap.add_argument("--real", help="a bench/real_rows.py file: its wide rows too")
    ap.add_argument("--real-rows", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128, help="the pass-1 shape of this batch")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="bench/results/search_reads")
    ap.add_argument("--plot", nargs="+", metavar="JSON", help="draw these runs' reads, no run")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    if args.plot:
        runs = [json.loads(pathlib.Path(p).read_text())["summary"] for p in args.plot]
        plot(runs, out / "search_reads.png")
        return
    count_reads()
    rows: list[dict] = []
    for name, z, temp, p in cases(args):
        cfg = band_config(z.shape[0], batch=args.batch)
        rec = {"case": name, **run_row(z, temp, p, cfg)}
        rows.append(rec)
        print(rec, flush=True)
    summary = []
    print(f"{'case':>18} {'rows':>4} {'reads':>5} {'max':>3} {'bracket':>7} {'oracle':>6}")
    for name in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == name]
        brackets = [r["bracket"] for r in rs if r["bracket"] is not None]
        s = {
            "case": name,
            "label": args.label or "this tree",
            "rows": len(rs),
            "count_reads_mean": statistics.mean(r["count_reads"] for r in rs),
            "count_reads_max": max(r["count_reads"] for r in rs),
            "bracket_mean": statistics.mean(brackets) if brackets else None,
            "oracle_ok": all(r["oracle_ok"] for r in rs),
        }
        summary.append(s)
        print(
            f"{name:>18} {s['rows']:>4} {s['count_reads_mean']:>5.2f} {s['count_reads_max']:>3} "
            f"{s['bracket_mean'] or 0:>7.0f} {s['oracle_ok']!s:>6}"
        )
    out.mkdir(parents=True, exist_ok=True)
    stem = "search_reads" + (f"_{args.label}" if args.label else "")
    (out / f"{stem}.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    plot([summary], out / f"{stem}.png")


if __name__ == "__main__":
    main()
