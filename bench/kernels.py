"""Times kernels.sample's CUDA path against a one-pass read of the logits and the sort path.

    python -m bench.kernels [--batches 1,128] [--rounds 3] [--tree PATH ...] [--out DIR]

The case is the kernels' target: V = 151936, fp32, Zipf rows (alpha 1.6, about 2.7 nats),
top-p 0.95, a mask on every row (C = 4096, exact mode). Per batch size B:

  steady   kernels.sample captured 8 times in one CUDA graph over 4 rotating input buffers
           (so small batches are not timed out of L2), the replay's median over 8: the cost
           inside a worker's decode-step graph, without the fixed cost of a graph launch
  floor    the same for one read of the logits (a segment max and sum-exp, nothing else),
           the faster of 2048- and 4096-token programs: the memory floor
  replay   one sample in its own graph, replayed (the launch cost included)
  sort     the sort-based mask path (full sort, cumsum, masks, draw, CSR), eager, on the
           current tree only; sort / replay is the ">= 50x" figure of docs/kernels.md

--tree PATH times another source tree's kernels too (a checkout of an older commit), in a
process of its own with PYTHONPATH=PATH, alternating with this tree round by round, so one
GPU call compares before and after. A tree whose package is `kernels` (before the
maskgate namespace) works as well as one with `maskgate/kernels`, and one whose kernels are
flat modules (triton_path.py) as well as one with triton/ and cpu/ folders.

Prints a table and writes DIR/kernels_sample.json and DIR/kernels_sample.png (DIR:
bench/results).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import statistics
import subprocess
import sys

import torch
import triton
import triton.language as tl

from bench.plotting import pyplot, save
from maskgate.kernels.triton.config import FP_FUSION

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 151936
ALPHA = 1.6
TOP_P = 0.95
CAP = 4096
BUFFERS = 4
CALLS = 8  # samples per graph in the steady columns (two rounds of the buffers)


@triton.jit
def _floor_kernel(x_ptr, m_ptr, s_ptr, stride_x, vocab, n_chunks, CHUNK: tl.constexpr):
    """One read of the logits: chunk max and sum-exp, nothing else (the memory floor)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + ids, mask=ids < vocab, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(m_ptr + row * n_chunks + chunk, m)
    tl.store(s_ptr + row * n_chunks + chunk, tl.sum(tl.exp(x - m), axis=0))


def floor_pass(x: torch.Tensor, chunk: int) -> None:
    batch, vocab = x.shape
    n_chunks = triton.cdiv(vocab, chunk)
    m = torch.empty(batch, n_chunks, device=x.device)
    s = torch.empty_like(m)
    _floor_kernel[(batch, n_chunks)](
        x, m, s, x.stride(0), vocab, n_chunks, CHUNK=chunk, num_warps=8, enable_fp_fusion=FP_FUSION
    )


def sort_path(x, temp, top_k, top_p, min_p):
    """The sort-based mask path: full sort, cumsum, masks, draw, nonzero into CSR."""
    z = x.float() / temp[:, None]
    vals, order = torch.sort(z, dim=1, descending=True)
    probs = torch.softmax(vals, dim=1)
    pos = torch.arange(z.shape[1], device=z.device)[None, :]
    keep = pos < torch.where(top_k > 0, top_k, z.shape[1])[:, None]
    kept = probs * keep
    kept = kept / kept.sum(dim=1, keepdim=True)
    keep &= (torch.cumsum(kept, dim=1) - kept) < top_p[:, None]
    keep &= probs >= min_p[:, None] * probs[:, :1]
    pick = torch.multinomial(probs * keep, 1)
    token = order.gather(1, pick)
    rows, cols = keep.nonzero(as_tuple=True)
    offsets = torch.cumsum(torch.bincount(rows, minlength=z.shape[0]), 0)
    return token, order[rows, cols], offsets


def zipf_logits(batch: int, seed: int) -> torch.Tensor:
    """[B, V] float32 Zipf-shaped rows on the GPU: z_r = -alpha ln(rank r), the ranks
    permuted at random over the vocabulary, plus N(0, 0.1) jitter."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    ranks = torch.arange(1, VOCAB + 1, dtype=torch.float32, device="cuda")
    base = -ALPHA * torch.log(ranks)
    perm = torch.argsort(torch.rand(batch, VOCAB, generator=g, device="cuda"), dim=1)
    return base[perm] + 0.1 * torch.randn(batch, VOCAB, generator=g, device="cuda")


def kernels_package(tree: pathlib.Path) -> str:
    """The import name of a tree's kernels: maskgate.kernels, or kernels in older trees."""
    if (tree / "maskgate" / "kernels").is_dir():
        return "maskgate.kernels"
    if (tree / "kernels").is_dir():
        return "kernels"
    raise SystemExit(f"{tree}: neither maskgate/kernels nor kernels/ (not a maskgate tree)")


def launch_module(tree: pathlib.Path) -> str:
    """The module of a tree's kernels that holds sample_triton and mask_index: triton.launch,
    or triton_path in trees from before the kernels' triton/ and cpu/ folders."""
    kernels = tree / kernels_package(tree).replace(".", "/")
    return "triton.launch" if (kernels / "triton" / "launch.py").is_file() else "triton_path"


def tree_label(tree: pathlib.Path) -> str:
    """How results name a tree: `this tree`, or its path inside this one, or its folder name;
    never a machine's absolute path."""
    tree = tree.resolve()
    if tree == ROOT:
        return "this tree"
    return str(tree.relative_to(ROOT)) if tree.is_relative_to(ROOT) else tree.name


def bench_us(fn, rep_ms: int) -> float:
    """fn's median time in microseconds (triton.testing.do_bench)."""
    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e3


def graph_us(fn, rep_ms: int, calls: int) -> float:
    """fn captured `calls` times in one CUDA graph (fn rotates its inputs), replayed: us a call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return bench_us(graph.replay, rep_ms) / calls


def time_tree(tree: pathlib.Path, batches: list[int], rep_ms: int, sort: bool) -> list[dict]:
    """One round at every batch size, with the kernels of `tree` (imported by this process:
    the caller runs it with PYTHONPATH=tree)."""
    package = kernels_package(tree)
    inputs = importlib.import_module(f"{package}.inputs")
    path = importlib.import_module(f"{package}.{launch_module(tree)}")
    origin = pathlib.Path(path.__file__).resolve()
    if not origin.is_relative_to(tree.resolve()):
        raise SystemExit(f"imported {origin}, not {tree}'s kernels: is PYTHONPATH={tree}?")
    return [time_batch(path, inputs, tree, batch, rep_ms, sort) for batch in batches]


def time_batch(path, inputs, tree: pathlib.Path, batch: int, rep_ms: int, sort: bool) -> dict:
    """One batch size's row of time_tree (path, inputs: the tree's launch module and inputs)."""
    dev = "cuda"
    per_row = (
        torch.ones(batch, device=dev),  # temperature
        torch.full((batch,), -1, dtype=torch.int32, device=dev),  # top-k off
        torch.full((batch,), TOP_P, device=dev),
        torch.zeros(batch, device=dev),  # min-p off
    )
    want = torch.ones(batch, dtype=torch.bool)
    seed = torch.arange(batch, dtype=torch.int64, device=dev)
    step = torch.zeros(batch, dtype=torch.int64, device=dev)
    logits = [zipf_logits(batch, i) for i in range(BUFFERS)]
    inps = [
        inputs.check_inputs(x, *per_row, want, max_mask_tokens=CAP, seed=seed, step=step)
        for x in logits
    ]
    index = path.mask_index(want, torch.device(dev))
    results = [path.sample_triton(inp, index=index) for inp in inps]
    turn = iter(range(1 << 62))

    def sample() -> None:
        path.sample_triton(inps[next(turn) % len(inps)], index=index)

    def floor(chunk: int) -> None:
        floor_pass(logits[next(turn) % len(logits)], chunk)

    row = {
        "B": batch,
        "V": VOCAB,
        "tree": tree_label(tree),
        "steady_us": graph_us(sample, rep_ms, CALLS),
        "floor_steady_us": min(graph_us(lambda c=c: floor(c), rep_ms, CALLS) for c in (2048, 4096)),
        "replay_us": graph_us(lambda: path.sample_triton(inps[0], index=index), rep_ms, 1),
        "fallback_rows": int(sum(int(r.fallback_rows.sum()) for r in results)),
        "support_mean": float(torch.cat([r.support_sizes for r in results]).float().mean()),
    }
    if sort:
        row["sort_us"] = bench_us(lambda: sort_path(logits[0], *per_row), rep_ms)
    return row


def child(args: argparse.Namespace) -> None:
    """The timing process of one tree and round: prints its rows as one JSON line."""
    rows = time_tree(pathlib.Path(args.child), args.batches, args.rep_ms, args.sort)
    print(json.dumps(rows))


def run_round(tree: pathlib.Path, args: argparse.Namespace, sort: bool) -> list[dict]:
    """time_tree in a fresh process that imports `tree`'s kernels (cwd and PYTHONPATH the
    tree). This file is loaded by path, so its own name cannot shadow an old tree's
    `kernels` package."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('kernel_timing', {str(__file__)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "mod.main(sys.argv[1:])\n"
    )
    argv = ["--child", str(tree), "--batches", ",".join(map(str, args.batches))]
    argv += ["--rep-ms", str(args.rep_ms)] + (["--sort"] if sort else [])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"timing {tree} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(rows: list[dict], trees: list[str]) -> list[dict]:
    """Per tree and B: the rounds' steady times (min, median, max) and the rest."""
    out = []
    for tree in trees:
        for batch in sorted({r["B"] for r in rows}):
            mine = [r for r in rows if r["tree"] == tree and r["B"] == batch]
            steady = [r["steady_us"] for r in mine]
            floor = statistics.median(r["floor_steady_us"] for r in mine)
            sorts = [r["sort_us"] for r in mine if "sort_us" in r]
            replay = statistics.median(r["replay_us"] for r in mine)
            out.append(
                {
                    "tree": tree,
                    "B": batch,
                    "steady_us": statistics.median(steady),
                    "steady_min_us": min(steady),
                    "steady_max_us": max(steady),
                    "floor_steady_us": floor,
                    "x_floor": statistics.median(steady) / floor,
                    "replay_us": replay,
                    "sort_us": statistics.median(sorts) if sorts else None,
                    "sort_over_replay": statistics.median(sorts) / replay if sorts else None,
                    "fallback_rows": mine[0]["fallback_rows"],
                    "support_mean": mine[0]["support_mean"],
                }
            )
    return out


def print_table(summary: list[dict]) -> None:
    print(f"V={VOCAB} fp32 Zipf rows (alpha {ALPHA}), top-p {TOP_P}, masks on every row, C={CAP}")
    head = "tree                          B  steady us (min-max)      floor  x floor  replay"
    print(head + "    sort  sort/replay  fallback")
    for s in summary:
        sort = f"{s['sort_us']:7.0f}  {s['sort_over_replay']:10.1f}x" if s["sort_us"] else " " * 20
        print(
            f"{s['tree'][-28:]:28} {s['B']:4d}  {s['steady_us']:7.2f} "
            f"({s['steady_min_us']:.2f}-{s['steady_max_us']:.2f})  {s['floor_steady_us']:6.2f} "
            f"{s['x_floor']:7.2f}x {s['replay_us']:7.2f}  {sort}  {s['fallback_rows']:8d}"
        )


def plot(summary: list[dict], path: pathlib.Path) -> None:
    """Steady us per B, one bar per tree, the floor and 1.5x the floor as lines."""
    plt = pyplot()
    if plt is None:
        return
    batches = sorted({s["B"] for s in summary})
    trees = list(dict.fromkeys(s["tree"] for s in summary))
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        mine = [s for s in summary if s["B"] == batch]
        names = [pathlib.Path(t).name or t for t in trees]
        ax.bar(names, [s["steady_us"] for s in mine], color="tab:blue")
        floor = mine[0]["floor_steady_us"]
        ax.axhline(floor, color="black", lw=1, label=f"one-pass floor {floor:.1f} us")
        ax.axhline(1.5 * floor, color="grey", ls="--", lw=1, label="1.5x floor")
        ax.set_title(f"B = {batch}, V = {VOCAB}, fp32")
        ax.set_ylabel("kernels.sample steady us")
        ax.legend(fontsize=8)
    save(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 128])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per tree, alternating")
    ap.add_argument("--tree", action="append", default=[], help="another tree to time too")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench's time per measurement")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sort", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench.kernels needs CUDA")
    trees = [ROOT] + [pathlib.Path(t).resolve() for t in args.tree]
    for tree in trees:
        kernels_package(tree)  # fail before any timing
    rows: list[dict] = []
    for rnd in range(args.rounds):
        for tree in trees:
            got = run_round(tree, args, sort=rnd == 0 and tree == ROOT)
            for r in got:
                r["round"] = rnd
                print(json.dumps(r), flush=True)
            rows += got
    summary = summarise(rows, [tree_label(t) for t in trees])
    print_table(summary)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "args": {"batches": args.batches, "rounds": args.rounds, "rep_ms": args.rep_ms},
        "trees": [tree_label(t) for t in trees],
    }
    (out / "kernels_sample.json").write_text(
        json.dumps({**meta, "summary": summary, "rounds": rows}, indent=1)
    )
    plot(summary, out / "kernels_sample.png")


if __name__ == "__main__":
    main()
