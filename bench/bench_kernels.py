"""Benchmark kernels.sample (Triton) against (a) a one-pass floor, (b) the sort-based path and
(c) a torch.topk(1024) path, on the issue's grid. Needs CUDA (except --cpu).

  python bench/bench_kernels.py [--quick | --split | --profile | --phases | --cpu]
                                [--variants a,b] [--out DIR]

Prints a table and writes kernels_bench.json, kernels_bench.csv and kernels_bench.png.
Logits: Zipf-shaped peaked rows (kernels.workloads.peaked_logits, alpha 1.6, about 2.7 nats;
the measured mean entropy is recorded) and one flat case (N(0, 1) logits at temperature 2).
Masks are requested for every row, C = 4096, exact mode. Times are medians of
triton.testing.do_bench over four rotating input buffers (so small batches are not timed
out of L2); the 'graph' column replays kernels.sample captured in a CUDA graph, 'steady'
captures 8 samples in one graph and divides (no graph-launch cost), as 'fl_st' does for the
floor. --profile times each launch per --variants pass-1 shape. The fb% column counts
fallback rows over every input buffer (fallback_rate_all; fallback_rate is buffer 0's).
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import json
import pathlib
import statistics
import sys

import torch
import triton

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.cpu_timing import median_times, sample_args
from bench.kernel_baselines import floor_pass, sort_path, topk_path
from maskgate import kernels
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton_path import (
    NBISECT,
    band_config,
    launch_band,
    mask_index,
    sample_triton,
)
from maskgate.kernels.workloads import entropy_nats, flat_logits, peaked_logits

SETTINGS = {  # name: (top_k, top_p, min_p)
    "k50_p0.9": (50, 0.9, 0.0),
    "p0.95": (-1, 0.95, 0.0),
    "minp0.05": (-1, 1.0, 0.05),
}
ALPHA = 1.6
CAP = 4096
N_BUFFERS = 4
GRID_VOCABS = [151936, 32000, 262144]  # the grid, the target vocabulary first
GRID_BATCHES = [128, 1, 8, 32, 512]  # the target batch first
STEADY_CALLS = 8  # samples per graph in the steady-state columns (two rounds of the buffers)
# Pass-1 variants (band_config keyword arguments): the default (band_lanes_kernel, segments
# by batch), the older band_kernel, lanes (l<lanes>), explicit segment sizes (s<tokens>) and
# resolve_kernel warps (r<warps>), pass 1's register limit (n<regs>).
VARIANTS = {
    "default": {},
    "fused": {"fused": True},  # one launch (band_resolve_kernel); the default before session 12
    "split": {"fused": False},  # pass 1 and resolve as two launches (the default)
    "bisect": {"lanes": 0},
    "l256": {"lanes": 256},
    "l512": {"lanes": 512},
    "l1024": {"lanes": 1024},
    "l2048": {"lanes": 2048},
    "l512s2k": {"lanes": 512, "chunk": 2048},
    "l512s8k": {"lanes": 512, "chunk": 8192},
    "l512s32k": {"lanes": 512, "chunk": 32768},
    "l1024s4k": {"lanes": 1024, "chunk": 4096},
    "l1024s16k": {"lanes": 1024, "chunk": 16384},
    "l1024s32k": {"lanes": 1024, "chunk": 32768},
    "l1024s64k": {"lanes": 1024, "chunk": 65536},
    "l2048s64k": {"lanes": 2048, "chunk": 65536},
    "l256s4k": {"lanes": 256, "chunk": 4096},
    "w4": {"warps": 4},
    "w8": {"warps": 8},
    "l1024s32kw16": {"lanes": 1024, "chunk": 32768, "warps": 16},
    "k3": {"keep": 3},
    "l512s32kk3": {"lanes": 512, "chunk": 32768, "keep": 3},
    "nopdl": {"pdl": False},  # resolve and emit launched after the kernel before them ends
    "n0": {"regs": 0},  # pass 1's registers left to the compiler (64 with the 4-step end)
    "n48": {"regs": 48},
    "l512s25k": {"lanes": 512, "chunk": 25600},  # 6 segments a row at V=151936
    "l512s25kk3": {"lanes": 512, "chunk": 25600, "keep": 3},
    "r2": {"resolve_warps": 2},
    "r4": {"resolve_warps": 4},
    # 16 warps (128 registers a thread, one program an SM): twice the threads for the
    # whole-row fallback's reads and sorts, at the cost of spills and wider reductions
    "r16": {"resolve_warps": 16},
    "rr128": {"resolve_regs": 128},  # resolve_kernel capped at 128 registers: 2 programs an SM
    "rrc": {"resolve_regs": 0},  # the compiler's count (255) at any batch, the cap's A/B
    "norace": {"race": False},  # rows nothing truncates read their row in resolve_kernel
    "emit": {"pack": False},  # emit_kernel packs the CSR at every batch size (a third launch)
    # the whole-row fallback's counting reads in parts that waiting rows help with (pack
    # path; session 37, not yet timed): real rows at top-p 0.95 are where it should show
    "shared": {"shared_reads": True},
    # and resolve's extra programs (sm_count a wave) that only help those reads
    "helpers": {"shared_reads": True, "help_waves": 1},
    "helpers2": {"shared_reads": True, "help_waves": 2},
    # the counting reads alone in parts (session 37's), the listing read in one program
    "shared_counts": {"shared_reads": True, "shared_lists": False},
    "helpers_counts": {"shared_reads": True, "shared_lists": False, "help_waves": 1},
    "p1024": {"programs": 1024},  # segments double while a launch keeps 1024 programs
    # Fewer candidate slots a segment: resolve's candidate block halves (B=1: 75 x 8 = 600
    # slots in a 1024 block; B=128: 10 x 64 = 640), at the cost of a higher band floor.
    "kc8": {"kc": 8},
    "kc32": {"kc": 32},
    "kc64": {"kc": 64},
    "kc64r8": {"kc": 64, "resolve_warps": 8},
    "s4kkc16": {"chunk": 4096, "kc": 16},  # B=1: 38 segments x 16 slots
    "noearly": {"early": False},  # the first tier's search always picks 192 or more
    "s2560": {"chunk": 2560},  # B=1: 60 segments of 2560 tokens (32 slots each by the rule)
    # Explicit segments, for small vocabularies at large batches (lanes a row against speed)
    "s2k": {"chunk": 2048},
    "s4k": {"chunk": 4096},
    "s16k": {"chunk": 16384},
    # Segments of any whole number of tiles, for launches that fill whole waves: at B = 128
    # and V = 151936 (792 programs resident at 6 an SM) 10 segments a row make 1.62 waves,
    # 11 (27 tiles) 1.78, 12 (25 tiles) 1.94, 18 (17 tiles) 2.91
    "s13824": {"chunk": 13824},
    "s12800": {"chunk": 12800},
    "s8704": {"chunk": 8704},
    # 1024 lanes (4 a thread) in 5 segments of 30 tiles at V = 151936: 5120 lanes a row, as
    # the default's 10 x 512, in 640 programs instead of 1280 (one wave at 5 an SM)
    "l1024s30k": {"lanes": 1024, "chunk": 30720},
    "l1024s30kn48": {"lanes": 1024, "chunk": 30720, "regs": 48},
    "l1024s30kn56": {"lanes": 1024, "chunk": 30720, "regs": 56},
    "l1024s32kn48": {"lanes": 1024, "chunk": 32768, "regs": 48},
    "l1024s38kn48": {"lanes": 1024, "chunk": 38912, "regs": 48},  # 4 segments, 4096 lanes
    # Lanes that let a band token go read their column again at the end of the segment (three
    # tokens of a row's band in one lane then need no rescue), at the default shape and with
    # fewer, longer segments: 6 (25600 tokens) and 5 (32768) a row at V = 151936. rr is the
    # default threshold (16 since session 20); the variants timed at 32 in session 19 say so.
    # Until session 22 the reread's words went through memory, and these variants' results
    # before it were timed so; by tl.gather since (whose results then were named rrg,
    # rrs32k32g and rrs32k32gnw). rrs32k in session 20's results is rrs32k32.
    "rr0": {"reread": 0},  # no reread at any batch size (the default before session 19)
    "rr8": {"reread": 8},
    "rr16": {"reread": 16},
    "rr32": {"reread": 32},  # the default threshold in session 19
    "rr64": {"reread": 64},  # wide supports (bench/reread_probe.py's Gaussian rows)
    "rr": {"reread": True},
    # Segments of 32768 tokens with the reread at 32 tops and no PDL wait (V = 151936 from
    # 103 rows, 262144 from 64), with the wait; session 22's results name the first default
    # and the shape without it short (the gather, before the long step was made optional)
    "long": {"long_segments": True},
    "longwait": {"long_segments": True, "band_wait": True},
    "rr48": {"reread": 32, "regs": 48},
    "rrs25k": {"reread": 32, "chunk": 25600},
    "rrs32k16": {"reread": 16, "chunk": 32768},
    "rrs32k32": {"reread": 32, "chunk": 32768},
    "rrs32k32np": {"reread": 32, "chunk": 32768, "pdl": False},
    # pass 1 starts once the kernel before it ends (resolve still launches early behind it)
    "nowait": {"band_wait": False},
    "rrs32k32nw": {"reread": 32, "chunk": 32768, "band_wait": False},
    "rrs32k16nw": {"reread": 16, "chunk": 32768, "band_wait": False},
    "rrs32kn48": {"reread": 32, "chunk": 32768, "regs": 48},
    # pass 1's loop reads 1, 2 or 3 tiles ahead of its work (2 at 48 registers by default
    # since session 35, where segments are longer than the tiles read whole), at 40
    # registers a thread (6 programs an SM), 48 (5) or 56 (4)
    "look1": {"look": 1},  # the default before session 35
    "look2": {"look": 2, "regs": 40},
    "look3": {"look": 3, "regs": 40},
    "look2n48": {"look": 2, "regs": 48},
    "look3n48": {"look": 3, "regs": 48},
    "look3n56": {"look": 3, "regs": 56},
    "longlook2": {"long_segments": True, "look": 2},
}


def floor_time(it, rep_ms: int) -> float:
    """The floor is the faster of two chunkings, so it is not handicapped by our choice."""
    return min(bench(lambda c=c: floor_pass(next(it)["logits"], c), rep_ms) for c in (2048, 4096))


def band_pass(
    x: torch.Tensor,
    temp: torch.Tensor,
    variant: str | None = None,
    cfg=None,
    times: torch.Tensor | None = None,
) -> None:
    """Pass 1 of kernels.sample alone, to split its time from the resolve pass: a variant's
    config (or cfg), with its scratch; times: the programs' stamps (bench/pass1_timeline.py)."""
    batch, vocab = x.shape
    if cfg is None:
        cfg = band_config(vocab, batch=batch, **(VARIANTS[variant] if variant else {}))
    cand_key = torch.empty(batch, cfg.ncand, dtype=torch.int64, device=x.device)
    m, s, d = (torch.empty(batch, cfg.n_chunks, device=x.device) for _ in range(3))
    launch_band(x, temp, cand_key, m, s, d, cfg, NBISECT, times=times)


_LOGITS: dict[tuple, torch.Tensor] = {}


# --real: a real model's logit rows (bench/real_rows.py), shuffled once, on the GPU
REAL: dict = {}  # "logits": [N, V] float32 on the GPU, "name": the model's short name


def load_real(path: str) -> torch.Tensor:
    """Loads --real rows into REAL, shuffled once (seed 0), on the GPU; returns them."""
    data = torch.load(path)
    logits = data["logits"].float()
    perm = torch.randperm(logits.shape[0], generator=torch.Generator().manual_seed(0))
    REAL.update(logits=logits[perm].cuda(), name=data["model"].split("-")[0].lower())
    return REAL["logits"]


def make_inputs(batch, vocab, dtype, setting, flat, seed):
    """flat: False (Zipf rows), True (flat rows at temperature 2) or "real" (the --real rows,
    buffer `seed` the seed-th slice of `batch` of them, temperature 1)."""
    dev = "cuda"
    key = (batch, vocab, dtype, flat, seed)
    if key not in _LOGITS:  # the same logits serve every setting
        _LOGITS.clear() if len(_LOGITS) >= 64 else None  # --real at B = 1 cycles 64 buffers
        g = torch.Generator(device=dev).manual_seed(seed)
        if flat == "real":
            rows = REAL["logits"]
            logits = rows[(seed * batch + torch.arange(batch, device=dev)) % rows.shape[0]]
        elif flat:
            logits = flat_logits(batch, vocab, g)
        else:
            logits = peaked_logits(batch, vocab, ALPHA, g)
        _LOGITS[key] = logits.to(dtype)
    logits = _LOGITS[key]
    temp = 2.0 if flat is True else 1.0
    k, p, mp = SETTINGS[setting]
    return {
        "logits": logits,
        "temperature": torch.full((batch,), temp, device=dev),
        "top_k": torch.full((batch,), k, dtype=torch.int32, device=dev),
        "top_p": torch.full((batch,), p, device=dev),
        "min_p": torch.full((batch,), mp, device=dev),
        "want_mask": torch.ones(batch, dtype=torch.bool),
        "seed": torch.arange(batch, dtype=torch.int64, device=dev),
        "step": torch.zeros(batch, dtype=torch.int64, device=dev),
    }


def bench(fn, rep_ms: int) -> float:
    """Median microseconds."""
    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e3


def replay_time(fn, rep_ms: int, calls: int = 1) -> float:
    """fn's launches captured once in a CUDA graph and replayed: GPU time without the host's
    launch overhead (eager launches of these kernels are host-bound below B = 512).

    calls > 1 captures fn that many times back to back (fn rotates its input buffers) and
    returns the time per call: the steady state of a worker whose decode-step graph holds
    the sampler, without the fixed cost of launching a graph (several us, which a single
    call's replay pays whole)."""
    torch.cuda.synchronize()
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
    return bench(graph.replay, rep_ms) / calls


def variant_config(vocab: int, batch: int, variant: str | None):
    """band_config under a VARIANTS entry; None for the default (sample_triton's own)."""
    return band_config(vocab, batch=batch, **VARIANTS[variant]) if variant else None


def graph_time(
    inp_list, rep_ms: int, variant: str | None = None, calls: int = 1, cfg=None
) -> float:
    """kernels.sample launches captured once in a CUDA graph, replayed; calls > 1: that many
    samples in one graph, over the rotating input buffers, time per sample. cfg: a
    BandConfig instead of a variant's."""
    inps = [check_inputs(**_args(b), max_mask_tokens=CAP) for b in inp_list]
    batch, vocab = inps[0].logits.shape
    if cfg is None:
        cfg = variant_config(vocab, batch, variant)
    index = mask_index(inps[0].want_mask, inps[0].logits.device)
    it = itertools.cycle(inps if calls > 1 else inps[:1])
    return replay_time(lambda: sample_triton(next(it), cfg, index=index), rep_ms, calls)


def variant_fallback(inp_list, variant: str) -> float:
    """Share of fallback rows over the input buffers under a pass-1 variant."""
    rows = []
    for b in inp_list:
        inp = check_inputs(**_args(b), max_mask_tokens=CAP)
        batch, vocab = inp.logits.shape
        res = sample_triton(inp, band_config(vocab, batch=batch, **VARIANTS[variant]))
        rows.append(res.fallback_rows)
    return float(torch.cat(rows).float().mean())


def floor_steady_time(inp_list, rep_ms: int, calls: int) -> float:
    """The floor the way graph_time(calls=...) times the sample: calls launches per graph."""
    it = itertools.cycle([b["logits"] for b in inp_list])
    return min(
        replay_time(lambda c=c: floor_pass(next(it), c), rep_ms, calls) for c in (2048, 4096)
    )


def _args(b):
    return {
        k: b[k]
        for k in ("logits", "temperature", "top_k", "top_p", "min_p", "want_mask", "seed", "step")
    }


def run_case(batch, vocab, dtype, setting, flat, rep_ms, variants=()):
    """One grid case; `variants` adds a graph time per named pass-1 variant (graph_us_NAME).
    Real rows take as many buffers as they fill (up to 64), so every row is timed."""
    n_buf = N_BUFFERS
    if flat == "real":
        n_buf = max(N_BUFFERS, min(64, REAL["logits"].shape[0] // batch))
    bufs = [make_inputs(batch, vocab, dtype, setting, flat, seed=i) for i in range(n_buf)]
    it = itertools.cycle(bufs)
    res = kernels.sample(**_args(bufs[0]), max_mask_tokens=CAP)
    every = [kernels.sample(**_args(b), max_mask_tokens=CAP) for b in bufs]
    band = torch.empty(batch, dtype=torch.int64, device="cuda")
    sample_triton(check_inputs(**_args(bufs[0]), max_mask_tokens=CAP), band_sizes=band)
    torch.cuda.synchronize()
    row = {
        "B": batch,
        "V": vocab,
        "dtype": str(dtype).replace("torch.", ""),
        "setting": setting,
        "logits": REAL["name"] if flat == "real" else ("flat_T2" if flat else f"zipf_a{ALPHA}"),
        "entropy_nats": round(
            float(entropy_nats(bufs[0]["logits"].float() / bufs[0]["temperature"][:, None]).mean()),
            2,
        ),
        "support_mean": float(res.support_sizes.float().mean()),
        "band_mean": float(band.float().mean()),
        "band_max": int(band.max()),
        "fallback_rate": float(res.fallback_rows.float().mean()),
        "buffers": n_buf,
        "fallback_rate_all": float(torch.cat([r.fallback_rows for r in every]).float().mean()),
        "support_p99_all": float(
            torch.cat([r.support_sizes for r in every]).double().quantile(0.99)
        ),
        "overflow_rate": float((res.mask_status == 1).float().mean()),
    }
    row["sample_us"] = bench(lambda: kernels.sample(**_args(next(it)), max_mask_tokens=CAP), rep_ms)
    row["graph_us"] = graph_time(bufs, rep_ms)
    for name in variants:
        row[f"graph_us_{name}"] = graph_time(bufs, rep_ms, name)
    row["floor_us"] = floor_time(it, rep_ms)
    steady_calls = max(STEADY_CALLS, n_buf)
    row["steady_us"] = graph_time(bufs, rep_ms, calls=steady_calls)
    row["floor_steady_us"] = floor_steady_time(bufs, rep_ms, steady_calls)
    row["band_us"] = bench(
        lambda: band_pass(*(lambda b: (b["logits"], b["temperature"]))(next(it))), rep_ms
    )
    nbytes = batch * vocab * bufs[0]["logits"].element_size()
    row["sample_GBps"] = nbytes / row["sample_us"] / 1e3
    row["graph_GBps"] = nbytes / row["graph_us"] / 1e3
    row["floor_GBps"] = nbytes / row["floor_us"] / 1e3
    keys = ("logits", "temperature", "top_k", "top_p", "min_p")
    row["sort_us"] = bench(lambda: sort_path(*(next(it)[k] for k in keys)), rep_ms)
    row["topk_us"] = bench(lambda: topk_path(*(next(it)[k] for k in keys)), rep_ms)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the target cases")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rep-ms", type=int, default=40)
    ap.add_argument("--split", action="store_true", help="time pass 1 variants and exit")
    ap.add_argument("--graphs", default="", help="--split: variants to time whole (graph)")
    ap.add_argument(
        "--profile", action="store_true", help="GPU time of each launch of kernels.sample"
    )
    ap.add_argument(
        "--phases", action="store_true", help="cycles resolve spends in each of its phases"
    )
    ap.add_argument("--phase-batches", default="1,128", help="--phases: batch sizes")
    ap.add_argument(
        "--ab",
        metavar="VARIANTS",
        default="",
        help="steady and single-replay times of these variants, alternating, at --batches",
    )
    ap.add_argument("--rounds", type=int, default=3, help="--ab: rounds of each variant")
    ap.add_argument(
        "--buffers",
        type=int,
        default=N_BUFFERS,
        help="--ab: input buffers (more meet rescued rows at their rate, not by luck)",
    )
    ap.add_argument(
        "--plot-only",
        nargs="+",
        metavar="JSON",
        help="redraw the PNG from results files (several shapes: the grid's x floor plot)",
    )
    ap.add_argument("--png", default="kernels_bench.png", help="--plot-only: the file to draw")
    ap.add_argument("--cpu", action="store_true", help="time the CPU torch path instead")
    ap.add_argument(
        "--variants",
        default="",
        help=f"pass-1 variants to add graph times for: {','.join(VARIANTS)}",
    )
    ap.add_argument("--settings", default=",".join(SETTINGS), help="settings to run")
    ap.add_argument("--no-flat", action="store_true", help="leave out the flat case")
    ap.add_argument("--batches", default="", help="instead of the grid: these batch sizes")
    ap.add_argument("--vocabs", default="", help="instead of the grid: these vocabularies")
    ap.add_argument("--dtypes", default="", help="instead of the grid: float32,bfloat16")
    ap.add_argument(
        "--real",
        metavar="PT",
        help="instead of the grid: a real model's rows (bench/real_rows.py) at --batches; "
        "with --cpu, the CPU path on them",
    )
    args = ap.parse_args()
    settings = [x for x in args.settings.split(",") if x]
    variants = [v for v in args.variants.split(",") if v]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        rows = [r for p in args.plot_only for r in json.loads(pathlib.Path(p).read_text())]
        shapes = {(r["V"], r["dtype"]) for r in rows if r["logits"].startswith("zipf")}
        (plot_grid if len(shapes) > 1 else plot)(rows, out / args.png)
        return
    if args.profile:
        kernel_profile(out, variants)
        return
    if args.phases and args.real:
        load_real(args.real)
        for batch in [int(b) for b in args.phase_batches.split(",")]:
            for variant in variants or [""]:
                real_row_cycles(out, batch, variant=variant)
        return
    if args.phases:
        resolve_phases(out, [int(b) for b in args.phase_batches.split(",")])
        return
    if args.ab:
        batches = [int(b) for b in args.batches.split(",") if b] or [128]
        vocab = int(args.vocabs.split(",")[0]) if args.vocabs else 151936
        ab_times(args.rep_ms, out, args.ab.split(","), batches, args.rounds, vocab, args.buffers)
        return
    if args.split:
        graphs = [v for v in args.graphs.split(",") if v]
        split_times(args.rep_ms, out, variants or list(VARIANTS), graphs)
        return
    if args.cpu:
        cpu_bench(out, real=args.real)
        return
    cases = []
    if args.real:
        logits = load_real(args.real)
        batches = [int(b) for b in args.batches.split(",") if b] or [1, 32, 128]
        dtypes = [getattr(torch, d) for d in args.dtypes.split(",") if d] or [torch.float32]
        for dtype, batch, setting in itertools.product(dtypes, batches, settings):
            cases.append((batch, logits.shape[1], dtype, setting, "real"))
    elif args.batches or args.vocabs or args.dtypes:  # a slice of the grid (or other batches)
        batches = [int(b) for b in args.batches.split(",") if b] or sorted(GRID_BATCHES)
        vocabs = [int(v) for v in args.vocabs.split(",") if v] or GRID_VOCABS
        dtypes = [getattr(torch, d) for d in args.dtypes.split(",") if d] or [torch.float32]
        for dtype, vocab, batch, setting in itertools.product(dtypes, vocabs, batches, settings):
            cases.append((batch, vocab, dtype, setting, False))
        if not args.no_flat and torch.float32 in dtypes and 151936 in vocabs:
            for batch in [b for b in batches if b in (1, 128)]:  # the grid's flat cases
                cases.append((batch, 151936, torch.float32, "p0.95", True))
                cases.append((batch, 151936, torch.float32, "minp0.05", True))
    elif args.quick:
        for batch, setting in itertools.product([1, 128], settings):
            cases.append((batch, 151936, torch.float32, setting, False))
        for setting in settings:
            cases.append((128, 151936, torch.bfloat16, setting, False))
        if not args.no_flat:
            cases.append((128, 151936, torch.float32, "p0.95", True))
    else:  # the target cases first, so a run cut short still has them
        for vocab, batch, setting in itertools.product(GRID_VOCABS, GRID_BATCHES, SETTINGS):
            cases.append((batch, vocab, torch.float32, setting, False))
        for batch in (1, 128):
            cases.append((batch, 151936, torch.float32, "p0.95", True))
            cases.append((batch, 151936, torch.float32, "minp0.05", True))
        for vocab, batch, setting in itertools.product(GRID_VOCABS, sorted(GRID_BATCHES), SETTINGS):
            cases.append((batch, vocab, torch.bfloat16, setting, False))
    rows = []
    header = (
        f"{'B':>4} {'V':>7} {'dtype':>8} {'setting':>9} {'logits':>9} {'H':>5} "
        f"{'|S|':>7} {'band':>7} {'fb%':>5} {'sample':>8} {'graph':>8} {'floor':>7} "
        f"{'x_floor':>7} {'steady':>7} {'fl_st':>6} {'x_st':>5} {'sort':>8} {'x_sort':>7} "
        f"{'topk':>8} {'GB/s':>6}"
    )
    print(header)
    for batch, vocab, dtype, setting, flat in cases:
        r = run_case(batch, vocab, dtype, setting, flat, args.rep_ms, variants)
        rows.append(r)
        save(rows, out)
        print(
            f"{r['B']:>4} {r['V']:>7} {r['dtype']:>8} {r['setting']:>9} {r['logits']:>9} "
            f"{r['entropy_nats']:>5} {r['support_mean']:>7.1f} {r['band_mean']:>7.1f} "
            f"{100 * r['fallback_rate_all']:>5.1f} {r['sample_us']:>8.1f} {r['graph_us']:>8.1f} "
            f"{r['floor_us']:>7.1f} {r['graph_us'] / r['floor_us']:>7.2f} "
            f"{r['steady_us']:>7.1f} {r['floor_steady_us']:>6.1f} "
            f"{r['steady_us'] / r['floor_steady_us']:>5.2f} "
            f"{r.get('sort_us', float('nan')):>8.1f} "
            f"{r.get('sort_us', float('nan')) / r['sample_us']:>7.1f} "
            f"{r.get('topk_us', float('nan')):>8.1f} {r['graph_GBps']:>6.0f}"
            + "".join(f" {v}={r[f'graph_us_{v}']:.1f}" for v in variants),
            flush=True,
        )
    plot(rows, out / "kernels_bench.png")
    target = [
        r
        for r in rows
        if r["B"] == 128
        and r["V"] == 151936
        and r["dtype"] == "float32"
        and r["logits"].startswith("zipf")
    ]
    if target:
        print("targets at B=128, V=151936, fp32 (zipf):")
        for r in target:
            print(
                f"  {r['setting']}: sample/floor={r['sample_us'] / r['floor_us']:.2f} "
                f"graph/floor={r['graph_us'] / r['floor_us']:.2f} "
                f"steady/floor_steady={r['steady_us'] / r['floor_steady_us']:.2f} "
                f"sort/sample={r.get('sort_us', float('nan')) / r['sample_us']:.1f} "
                f"sort/graph={r.get('sort_us', float('nan')) / r['graph_us']:.1f}"
            )
    b1 = [
        r["graph_us"]
        for r in rows
        if r["B"] == 1
        and r["V"] == 151936
        and r["dtype"] == "float32"
        and r["logits"].startswith("zipf")
    ]
    if b1:
        print(f"B=1 V=151936 fp32 graph us: median {statistics.median(b1):.1f}")


def same_csr(a, b) -> bool:
    """Whether two SampleResults hold the same masks (offsets and the ids they cover; the
    rest of mask_ids is scratch)."""
    n = int(a.mask_offsets[-1])
    return torch.equal(a.mask_offsets, b.mask_offsets) and torch.equal(
        a.mask_ids[:n], b.mask_ids[:n]
    )


def ab_times(
    rep_ms: int,
    out: pathlib.Path,
    variants: list[str],
    batches: list[int],
    rounds: int,
    vocab: int = 151936,
    buffers: int = N_BUFFERS,
) -> None:
    """Variants compared in one process (V = vocab, fp32, top-p 0.95, Zipf rows in
    `buffers` input buffers, each steady graph cycling through all of them): each
    round times every variant's steady sample in turn, so drift between runs and machines
    (as large as the changes at B = 1) does not enter the comparison; then a single replay
    per variant, each variant's fallback rows and band size (median candidates listed above
    the band floor) per buffer, and whether every variant gives the same tokens and CSR.
    Writes kernels_ab.json and .png."""
    rows = []

    def record(**row) -> None:
        rows.append(row)
        (out / "kernels_ab.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps(row), flush=True)

    for batch in batches:
        bufs = [make_inputs(batch, vocab, torch.float32, "p0.95", False, i) for i in range(buffers)]
        results = []
        for v in variants:
            inp = check_inputs(**_args(bufs[0]), max_mask_tokens=CAP)
            results.append(sample_triton(inp, band_config(vocab, batch=batch, **VARIANTS[v])))
        same = all(
            torch.equal(r.tokens, results[0].tokens) and same_csr(r, results[0]) for r in results
        )
        record(B=batch, V=vocab, what="same_result", value=same)
        for (i, b), v in itertools.product(enumerate(bufs), variants):
            cfg = band_config(vocab, batch=batch, **VARIANTS[v])
            band = torch.empty(batch, dtype=torch.int64, device="cuda")
            res = sample_triton(check_inputs(**_args(b), max_mask_tokens=CAP), cfg, band_sizes=band)
            record(
                B=batch,
                what="fallback_rows",
                variant=v,
                buf=i,
                rows=res.fallback_rows.nonzero().flatten().tolist(),
                band_median=float(band.double().median()),
                support_max=int(res.support_sizes.max()),
            )
        calls = max(STEADY_CALLS, len(bufs))
        for rnd in range(rounds):
            for v in variants:
                us = graph_time(bufs, rep_ms, v, calls=calls)
                record(B=batch, what="steady_us", variant=v, round=rnd, us=us)
            # the one-pass floor in the same rounds, so each A/B run states the target ratio
            us = floor_steady_time(bufs, rep_ms, calls)
            record(B=batch, what="floor_steady_us", round=rnd, us=us)
        for v in variants:
            record(B=batch, what="replay_us", variant=v, us=graph_time(bufs, rep_ms, v))
    print_ab(rows)
    plot_ab(rows, out / "kernels_ab.png")


def print_ab(rows: list[dict]) -> None:
    """A table of ab_times' rows: each variant's steady time per batch size (median of the
    rounds, and their range) against the floor's median in the same rounds."""
    floors = [r for r in rows if r["what"] == "floor_steady_us"]
    steady = [r for r in rows if r["what"] == "steady_us"]
    print(
        f"{'B':>5} {'variant':>16} {'steady_us':>10} {'range':>15} {'floor_us':>9} {'x_floor':>8}"
    )
    for b in dict.fromkeys(r["B"] for r in steady):
        floor = statistics.median(r["us"] for r in floors if r["B"] == b)
        for v in dict.fromkeys(r["variant"] for r in steady):
            times = [r["us"] for r in steady if r["B"] == b and r["variant"] == v]
            med = statistics.median(times)
            span = f"{min(times):.2f}-{max(times):.2f}"
            print(f"{b:>5} {v:>16} {med:>10.2f} {span:>15} {floor:>9.2f} {med / floor:>8.2f}")


def plot_ab(rows: list[dict], path: pathlib.Path) -> None:
    """Bars of each variant's median steady time per batch size (ab_times' rows), beside the
    one-pass floor's median in the same rounds, with the 1.5x-floor target dashed."""
    steady = [r for r in rows if r["what"] == "steady_us"]
    floors = [r for r in rows if r["what"] == "floor_steady_us"]
    variants = list(dict.fromkeys(r["variant"] for r in steady))
    batches = list(dict.fromkeys(r["B"] for r in steady))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    bars = variants + (["one-pass floor"] if floors else [])
    width = 0.8 / len(bars)
    for j, v in enumerate(bars):
        picked = floors if j == len(variants) else [r for r in steady if r["variant"] == v]
        times = [[r["us"] for r in picked if r["B"] == b] for b in batches]
        med = [statistics.median(t) if t else float("nan") for t in times]
        style = {"color": "0.6", "hatch": "//"} if j == len(variants) else {}
        ax.bar([i + j * width for i in range(len(batches))], med, width, label=v, **style)
        if j == len(variants):
            for i, m in enumerate(med):
                left, right = i - width / 2, i + 0.8 - width / 2
                ax.plot(
                    [left, right],
                    [1.5 * m] * 2,
                    "k--",
                    lw=1,
                    label="1.5x floor" if i == 0 else None,
                )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(batches))], [f"B={b}" for b in batches])
    ax.set_ylabel("us per sample (steady, median of rounds)")
    vocab = next((r["V"] for r in rows if "V" in r), 151936)
    ax.set_title(f"kernels.sample variants, V={vocab} fp32 top-p 0.95")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def split_times(rep_ms: int, out: pathlib.Path, variants: list[str], graphs: list[str]) -> None:
    """Where the time goes at V=151936 (fp32 at B=1 and 128, bf16 at B=128): the floor and
    pass 1 alone per variant first, then the whole sample (graph) per `graphs` variant.
    Each figure is printed and saved as soon as it is measured (compiling resolve_kernel
    takes the device tens of seconds per variant). Writes kernels_split.json."""
    cases = [(128, torch.float32), (1, torch.float32), (128, torch.bfloat16)]
    rows = []
    bufs = {}
    for batch, dtype in cases:
        bufs[batch, dtype] = [
            make_inputs(batch, 151936, dtype, "p0.95", False, i) for i in range(4)
        ]
        rows.append({"B": batch, "dtype": str(dtype).replace("torch.", ""), "V": 151936})

    def record(row: dict, key: str, value: float) -> None:
        row[key] = value
        (out / "kernels_split.json").write_text(json.dumps(rows, indent=1))
        print(f"split B={row['B']} {row['dtype']} {key} {value:.4g}", flush=True)

    for (batch, dtype), row in zip(cases, rows, strict=True):
        it = itertools.cycle(bufs[batch, dtype])
        record(row, "floor_us", floor_time(it, rep_ms))
        x0 = bufs[batch, dtype][0]["logits"]
        floor_graph = min(
            replay_time(lambda c=c, x0=x0: floor_pass(x0, c), rep_ms) for c in (2048, 4096)
        )
        record(row, "floor_graph_us", floor_graph)
        record(row, "floor_steady_us", floor_steady_time(bufs[batch, dtype], rep_ms, STEADY_CALLS))
        for name in variants:
            it = itertools.cycle(bufs[batch, dtype])
            record(
                row,
                f"pass1_us_{name}",
                replay_time(
                    lambda n=name, it=it: band_pass(
                        *(lambda b: (b["logits"], b["temperature"]))(next(it)), n
                    ),
                    rep_ms,
                    STEADY_CALLS,
                ),
            )
    for name in graphs:
        for (batch, dtype), row in zip(cases, rows, strict=True):
            record(row, f"fallback_rate_{name}", variant_fallback(bufs[batch, dtype], name))
            record(
                row,
                f"steady_us_{name}",
                graph_time(bufs[batch, dtype], rep_ms, name, calls=STEADY_CALLS),
            )


def kernel_profile(out: pathlib.Path, variants: list[str], calls: int = 50) -> None:
    """GPU time of each kernel kernels.sample launches (torch.profiler, eager calls), at
    V=151936 for B=1 and 128 in fp32 and B=128 in bf16, top-p 0.95, per pass-1 variant (the
    default when none is named). Unlike graph replays this splits the sample into its
    launches, without the gaps between them. Writes kernels_profile.json."""
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for variant in variants or ["default"]:
        for batch, dtype in [(1, torch.float32), (128, torch.float32), (128, torch.bfloat16)]:
            b = make_inputs(batch, 151936, dtype, "p0.95", False, 0)
            inp = check_inputs(**_args(b), max_mask_tokens=CAP)
            cfg = band_config(151936, batch=batch, **VARIANTS[variant])
            index = mask_index(inp.want_mask, inp.logits.device)
            for _ in range(3):
                res = sample_triton(inp, cfg, index=index)
            fallback = float(res.fallback_rows.float().mean())
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    sample_triton(inp, cfg, index=index)
                torch.cuda.synchronize()
            for ev in prof.key_averages():
                if ev.device_type.name == "CUDA" and ev.count >= calls:
                    us = ev.device_time_total / ev.count
                    rows.append(
                        {
                            "variant": variant,
                            "B": batch,
                            "dtype": str(dtype).replace("torch.", ""),
                            "kernel": ev.key,
                            "count_per_call": ev.count / calls,
                            "us": us,
                            "fallback_rate": fallback,
                        }
                    )
                    print(
                        f"profile {variant} B={batch} {dtype} {ev.key[:50]:<50} {us:8.2f} us "
                        f"(fallback rows {fallback:.3f})",
                        flush=True,
                    )
    (out / "kernels_profile.json").write_text(json.dumps(rows, indent=1))


# The tier sort (best_sorted) in four steps: "search" (the quartering threshold search), "rank"
# (the scan and the floor), "gather" (the scatter to scratch and the block load back), "sort".
PHASE_NAMES = (
    "stats",
    "keys",
    "search",
    "rank",
    "gather",
    "sort",
    "decide",
    "draw",
    "slot",
    "exit",
)


# Rows the first tier leaves undecided (the rescued ones): from the first tier's draw on, the
# second tier (or its skip), the rescue's read, its pick, its decision, then its draw and slot.
RESCUE_PHASE_NAMES = ("tier2", "rescue_read", "rescue_pick", "rescue_decide", "draw_slot")


def resolve_phases(out: pathlib.Path, batches: list[int], calls: int = 20) -> None:
    """Cycles each row's resolve spends per phase (the SM's %clock64, stamped by resolve_row
    with TIMING), medians over rows and calls, at V=151936 fp32 top-p 0.95 (B=1 takes the
    fused launch). resolve is one program per row and latency-bound, so this is where its
    time goes. Batches past one wave (B=1024: about 8 rows per SM, a few at a time)
    show what a program pays when an earlier one on its SM has already fetched the code.
    Rows the rescue takes (B=256 has three in buffer 0) also get the rescue's phases, over
    those rows only. Writes kernels_phases.json."""
    from maskgate.kernels.triton_resolve import MAIN_STAMPS, PHASES

    rows = []
    for batch in batches:
        b = make_inputs(batch, 151936, torch.float32, "p0.95", False, 0)
        inp = check_inputs(**_args(b), max_mask_tokens=CAP)
        index = mask_index(inp.want_mask, inp.logits.device)
        stamps = torch.zeros(batch, PHASES.value, dtype=torch.int64, device="cuda")
        deltas, rescue = [], []
        for i in range(calls + 2):
            stamps.zero_()
            res = sample_triton(inp, index=index, phase_cycles=stamps)
            if i < 2:  # the first calls compile and warm the caches
                continue
            st = stamps.cpu()
            deltas.append(st[:, : MAIN_STAMPS.value].diff(dim=1))
            r = st[res.fallback_rows.cpu() & (st[:, -1] > 0)]  # rescued: every stamp written
            if len(r):
                order = (8, 11, 12, 13, 14, 9)  # draw, tier 2, read, pick, decision, slot
                rescue.append(
                    torch.stack([r[:, j] - r[:, i] for i, j in itertools.pairwise(order)], 1)
                )
        d = torch.cat(deltas).double().median(dim=0).values.tolist()
        row = {"B": batch, "total_cycles": sum(d), **dict(zip(PHASE_NAMES, d, strict=True))}
        line = " ".join(f"{k}={v:.0f}" for k, v in zip(PHASE_NAMES, d, strict=True))
        if rescue:
            rd = torch.cat(rescue).double().median(dim=0).values.tolist()
            row["rescued_rows"] = len(rescue[0])
            row["rescue"] = dict(zip(RESCUE_PHASE_NAMES, rd, strict=True))
            line += " | rescued rows: " + " ".join(
                f"{k}={v:.0f}" for k, v in zip(RESCUE_PHASE_NAMES, rd, strict=True)
            )
        rows.append(row)
        print(
            f"phases B={batch}: {line} total={sum(d):.0f} cycles "
            f"({sum(d) / 1980:.1f} us at 1.98 GHz)",
            flush=True,
        )
    (out / "kernels_phases.json").write_text(json.dumps(rows, indent=1))


def real_row_cycles(
    out: pathlib.Path, batch: int, setting: str = "p0.95", calls: int = 5, variant: str = ""
) -> None:
    """Each --real row's resolve cycles (entry to exit stamp, median over calls) at `batch`
    rows a launch, over every buffer the rows fill, with its support size and whether it
    took the rescue (its stamps written) or the fallback at all: which rows hold a launch,
    and by how much. Prints the slowest 20; writes real_row_cycles.json
    (real_row_cycles_VARIANT.json for a variant of VARIANTS)."""
    from maskgate.kernels.triton_resolve import MAIN_STAMPS, PHASES

    n_buf = REAL["logits"].shape[0] // batch
    vocab = REAL["logits"].shape[1]
    cfg = variant_config(vocab, batch, variant)
    print(f"# resolve stamps, B = {batch}, variant {variant or 'default'}", flush=True)
    recs = []
    for buf in range(n_buf):
        b = make_inputs(batch, vocab, torch.float32, setting, "real", buf)
        inp = check_inputs(**_args(b), max_mask_tokens=CAP)
        index = mask_index(inp.want_mask, inp.logits.device)
        stamps = torch.zeros(batch, PHASES.value, dtype=torch.int64, device="cuda")
        totals = []
        for i in range(calls + 1):
            stamps.zero_()
            res = sample_triton(inp, cfg, index=index, phase_cycles=stamps)
            st = stamps.cpu()
            if i:  # the first call compiles
                totals.append(st[:, MAIN_STAMPS.value - 1] - st[:, 0])
        cyc = torch.stack(totals).double().median(dim=0).values
        for r in range(batch):
            recs.append(
                {
                    "buffer": buf,
                    "row": r,
                    "support": int(res.support_sizes[r]),
                    "fallback": bool(res.fallback_rows[r]),
                    "rescue_stamped": bool(st[r, 14] > 0),
                    "cycles": float(cyc[r]),
                    "parts": row_parts(st[r].tolist()),
                }
            )
    recs.sort(key=lambda d: -d["cycles"])
    for d in recs[:20]:
        parts = " ".join(f"{k}={v}" for k, v in d["parts"].items())
        print(
            f"buffer {d['buffer']:>2} row {d['row']:>3} |S| {d['support']:>5} "
            f"fallback {d['fallback']!s:>5} rescue stamps {d['rescue_stamped']!s:>5} "
            f"{d['cycles']:>9.0f} cycles ({d['cycles'] / 1980:.1f} us at 1.98 GHz) {parts}",
            flush=True,
        )
    plain = [d["cycles"] for d in recs if not d["fallback"]]
    print(f"rows without the fallback: median {statistics.median(plain):.0f} cycles")
    name = f"real_row_cycles_{variant}.json" if variant else "real_row_cycles.json"
    (out / name).write_text(json.dumps(recs, indent=1))


MAIN_STAMPS_EXIT = 10  # resolve_row's exit stamp
# resolve_row's fallback stamps: 16 ends the draw (over the row, or over the sorted list), 17
# the gather's read (a bounded row over the block counts the token's position before it), 18
# the sort after it.
FALLBACK_PARTS = (("search", 15), ("draw", 16), ("read", 17), ("gather_sort", 18))


def row_parts(st: list[int]) -> dict[str, int]:
    """One row's resolve stamps (the last call's) as cycles per part: the tiers (to the second
    tier's end), the rescue (to its last stamp written), and the whole-row fallback's parts
    of FALLBACK_PARTS (each only when stamped, in the order run), then the rest to the
    exit."""
    parts = {"tiers": st[11] - st[0]} if st[11] else {}
    at = max(st[11:15])
    if at and at > st[11]:
        parts["rescue"] = at - st[11]
    stamped = [(st[i], name) for name, i in FALLBACK_PARTS if st[i]]
    for t, name in sorted(stamped):  # in the order the row ran them
        parts[name] = t - at
        at = t
    if at:
        parts["end"] = st[MAIN_STAMPS_EXIT] - at
    return parts


def cpu_bench(out: pathlib.Path, repeats: int = 7, real: str | None = None) -> None:
    """The CPU torch path (the worker's path without CUDA): median wall and CPU time. With
    `real` (a bench/real_rows.py file), on those rows, the first B of a fixed shuffle."""
    rows = []
    vocabs = [32000, 49152]
    if real:
        data = torch.load(real)
        shuffled = data["logits"].float()
        shuffled = shuffled[
            torch.randperm(len(shuffled), generator=torch.Generator().manual_seed(0))
        ]
        vocabs = [shuffled.shape[1]]
    print(f"{'B':>4} {'V':>6} {'setting':>9} {'|S|':>6} {'fb%':>5} {'wall_ms':>8} {'cpu_ms':>7}")
    for vocab, batch, setting in itertools.product(vocabs, [1, 8, 16, 64], SETTINGS):
        g = torch.Generator().manual_seed(batch)
        logits = shuffled[:batch] if real else peaked_logits(batch, vocab, ALPHA, g)
        args = sample_args(logits, *SETTINGS[setting])
        res = kernels.sample(*args, max_mask_tokens=CAP)
        call = functools.partial(kernels.sample, *args, max_mask_tokens=CAP)
        wall_ms, cpu_ms = median_times(call, repeats)
        row = {
            "B": batch,
            "V": vocab,
            "setting": setting,
            "logits": data["model"] if real else f"zipf_a{ALPHA}",
            "threads": torch.get_num_threads(),
            "support_mean": float(res.support_sizes.float().mean()),
            "fallback_rate": float(res.fallback_rows.float().mean()),
            "wall_ms": wall_ms,
            "cpu_ms": cpu_ms,
        }
        rows.append(row)
        print(
            f"{batch:>4} {vocab:>6} {setting:>9} {row['support_mean']:>6.1f} "
            f"{100 * row['fallback_rate']:>5.1f} {row['wall_ms']:>8.1f} {row['cpu_ms']:>7.1f}"
        )
    name = "kernels_cpu_bench_real" if real else "kernels_cpu_bench"
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (vocab, setting), group in itertools.groupby(rows, key=lambda r: (r["V"], r["setting"])):
        group = list(group)
        ax.plot(
            [r["B"] for r in group],
            [r["wall_ms"] for r in group],
            marker="o",
            label=f"V={vocab} {setting}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch rows")
    ax.set_ylabel("median wall time (ms)")
    ax.set_title(f"kernels.sample, CPU torch path, {rows[0]['logits']} rows")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=120)


def save(rows, out: pathlib.Path) -> None:
    """Written after every case, so a run cut short still leaves its numbers."""
    (out / "kernels_bench.json").write_text(json.dumps(rows, indent=1))
    with open(out / "kernels_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)


def _settings_figure(rows):
    """One panel per setting the rows have (a run of one setting draws one), sharing the y
    axis; returns the figure, its axes and their settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    fig, axes = plt.subplots(
        1, len(settings), figsize=(5 * len(settings), 4), sharey=True, squeeze=False
    )
    return fig, list(axes[0]), settings


def _save_settings_figure(fig, axes, ylabel: str, path) -> None:
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch rows")
    axes[0].set_ylabel(ylabel)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_grid(rows, path) -> None:
    """The grid at a glance: steady time over the steady floor against B, one panel per
    setting, one line per (V, dtype), Zipf rows."""
    zipf = [r for r in rows if r["logits"].startswith("zipf")]
    shapes = sorted({(r["V"], r["dtype"]) for r in zipf})
    fig, axes, settings = _settings_figure(zipf)
    for ax, setting in zip(axes, settings, strict=True):
        for vocab, dtype in shapes:
            rs = sorted(
                (r for r in zipf if (r["V"], r["dtype"], r["setting"]) == (vocab, dtype, setting)),
                key=lambda r: r["B"],
            )
            ratio = [r["steady_us"] / r["floor_steady_us"] for r in rs]
            ax.plot([r["B"] for r in rs], ratio, marker="o", label=f"V={vocab} {dtype}")
        ax.axhline(1.5, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"Zipf rows, {setting}")
    _save_settings_figure(fig, axes, "steady time / steady one-pass floor", path)


def plot(rows, path) -> None:
    # Zipf rows when the run has them, else a real model's (--real)
    zipf = [r for r in rows if r["logits"].startswith("zipf")] or [
        r for r in rows if not r["logits"].startswith("flat")
    ]
    if not zipf:
        return
    # the target vocabulary in fp32 when the run has it, else the first (V, dtype) it has
    shapes = [(r["V"], r["dtype"]) for r in zipf]
    vocab, dtype = (151936, "float32") if (151936, "float32") in shapes else shapes[0]
    sel = [r for r in zipf if r["V"] == vocab and r["dtype"] == dtype]
    fig, axes, settings = _settings_figure(sel)
    for ax, setting in zip(axes, settings, strict=True):
        rs = sorted((r for r in sel if r["setting"] == setting), key=lambda r: r["B"])
        bs = [r["B"] for r in rs]
        for key, label in [
            ("sample_us", "maskgate.kernels.sample"),
            ("graph_us", "kernels.sample (graph)"),
            ("steady_us", f"kernels.sample (steady, {STEADY_CALLS} a graph)"),
            ("floor_us", "(a) one-pass floor"),
            ("floor_steady_us", "(a) floor (steady)"),
            ("sort_us", "(b) sort path"),
            ("topk_us", "(c) topk(1024)"),
        ]:
            ax.plot(bs, [r.get(key, float("nan")) for r in rs], marker="o", label=label)
        ax.set_yscale("log")
        ax.set_title(f"{zipf[0]['logits']} V={vocab} {dtype} {setting}")
    _save_settings_figure(fig, axes, "median time (us)", path)
    if any(k.startswith("graph_us_") for r in sel for k in r):
        plot_variants(sel, path.with_name(path.stem + "_bars.png"))


def plot_variants(rows, path) -> None:
    """--variants: bars of the default's and each variant's graph time, one group a
    (setting, B), on a linear scale (the variants differ by a few percent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = dict.fromkeys(k for r in rows for k in r if k.startswith("graph_us_"))
    names = ["graph_us", *variants]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(names)
    for j, key in enumerate(names):
        ys = [r.get(key, float("nan")) for r in rows]
        label = "default" if key == "graph_us" else key[len("graph_us_") :]
        ax.bar([i + j * width for i in range(len(rows))], ys, width, label=label)
    ticks = [f"{r['setting']} B={r['B']}" for r in rows]
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], ticks)
    ax.set_ylabel("us per sample (graph, median)")
    ax.set_title(
        f"kernels.sample variants, {rows[0]['logits']} V={rows[0]['V']} {rows[0]['dtype']}"
    )
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
