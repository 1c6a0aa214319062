"""Worker prefill: time to first token of a GRPO-like load, the prefix cache off and on.

--prompts distinct prompts of --prompt-len random tokens, each sampled --samples times (GRPO's
group), all submitted at once to a Scheduler + ModelRunner (the engine's loop without its
thread), with `max_prefill_tokens` of prompt a step. The figure is the time until every
sequence has its first token (`ttft_all_ms`), with the median sequence's (`ttft_p50_ms`),
the steps taken and the prompt tokens the forwards computed. With the cache, each group's
prompt is computed once and its other samples copy its K/V (docs/worker.md, "Prefix cache").

Random weights of a real shape (bench/shapes.py), bfloat16. Each setting runs --repeats times,
interleaved; every figure is the median over the repeats.

    python -m bench.worker_prefill                                   # both models, 16 x 8 x 1k
    python -m bench.worker_prefill --models llama-3.2-1b --repeats 5
    # a check that the script runs, on the CPU (a tiny shape; --out keeps bench/results/ as it is)
    python -m bench.worker_prefill --device cpu --models smoke --prompts 2 --samples 4 \\
        --prompt-len 64 --out worker_prefill_smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.plotting import pyplot, save
from bench.worker_decode import make_model, sync
from maskgate.worker.engine.batch import SamplingParams
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.engine.sequence import Sequence, StopRule
from maskgate.worker.runner.runner import ModelRunner

SETTINGS = {"cache_off": False, "cache_on": True}


def grpo_load(args: argparse.Namespace) -> list[Sequence]:
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 1000, (args.prompts, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(temperature=1.0, top_p=0.9)
    return [
        Sequence(f"p{p}-{j}", prompt, params, StopRule(1, ignore_eos=True))
        for p, prompt in enumerate(prompts)
        for j in range(args.samples)
    ]


def prefill(runner: ModelRunner, cache: bool, args: argparse.Namespace) -> dict[str, Any]:
    """All sequences in at t0, stepped until each has its first token."""
    sched = Scheduler(
        runner,
        max_num_seqs=runner.max_num_slots,
        max_prefill_tokens=args.max_prefill_tokens,
        max_mask_tokens=runner.max_mask_tokens,
        prefix_cache=cache,
    )
    seqs = grpo_load(args)
    sync(args.device)
    t0 = time.monotonic()
    for s in seqs:
        s.arrival = t0
        sched.add(s)
    steps = computed = 0
    while sched.has_work():
        batch = sched.schedule()
        computed += sum(len(r.token_ids) for _, r in batch)
        results, _ = runner.run([r for _, r in batch])
        sched.postprocess(batch, results)
        steps += 1
    ttft = sorted(1000 * ((s.first_token_time or t0) - t0) for s in seqs)
    return {
        "ttft_all_ms": ttft[-1],
        "ttft_p50_ms": statistics.median(ttft),
        "steps": steps,
        "prompt_tokens_computed": computed,  # max_new_tokens 1: no decode rows
        "cached_tokens": sum(s.num_cached for s in seqs),
    }


def bench_model(name: str, args: argparse.Namespace, out: list[dict]) -> None:
    loaded, _ = make_model(name, args.device)
    runner = ModelRunner(
        loaded, max_num_slots=args.prompts * args.samples, max_model_len=args.prompt_len + 2
    )
    prefill(runner, True, args)  # warm-up: kernels, allocator, cuBLAS plans
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for rep in range(args.repeats):
        order = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
        for setting in order:
            runs[setting].append(prefill(runner, SETTINGS[setting], args))
            print(f"  {name} {setting} repeat {rep + 1}: {runs[setting][-1]}", flush=True)
    for setting, rs in runs.items():
        row = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        row["ttft_all_ms_runs"] = [r["ttft_all_ms"] for r in rs]
        out.append({"model": name, "setting": setting, **row})
    del runner, loaded
    if args.device == "cuda":
        torch.cuda.empty_cache()


def summarize(rows: list[dict], args: argparse.Namespace) -> list[str]:
    lines = [
        f"GRPO-like prefill: {args.prompts} prompts x {args.samples} samples, "
        f"{args.prompt_len}-token prompts, max_prefill_tokens {args.max_prefill_tokens}",
        "",
        "| model | setting | time to all first tokens (ms) | median TTFT (ms) | steps "
        "| prompt tokens computed | cached tokens | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    get = {(r["model"], r["setting"]): r for r in rows}
    for r in rows:
        off = get.get((r["model"], "cache_off"), {}).get("ttft_all_ms")
        speed = f"{off / r['ttft_all_ms']:.2f}x" if off and r["ttft_all_ms"] else "-"
        lines.append(
            f"| {r['model']} | {r['setting']} | {r['ttft_all_ms']:.1f} | {r['ttft_p50_ms']:.1f} "
            f"| {r['steps']:.0f} | {r['prompt_tokens_computed']:.0f} | {r['cached_tokens']:.0f} "
            f"| {speed} |"
        )
    return lines


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(2.5 + 2 * len(models), 4))
    width = 0.38
    for k, setting in enumerate(SETTINGS):
        ys = [
            next(r["ttft_all_ms"] for r in rows if (r["model"], r["setting"]) == (m, setting))
            for m in models
        ]
        ax.bar([i + (k - 0.5) * width for i in range(len(models))], ys, width, label=setting)
    ax.set_xticks(range(len(models)), models)
    ax.set(ylabel="time to all first tokens (ms)", title="GRPO-like prefill")
    ax.legend()
    save(fig, path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.2-1b,qwen2.5-1.5b")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--max-prefill-tokens", type=int, default=2048, help="the worker's default")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script only")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench.worker_prefill needs a CUDA GPU (or --device cpu for a smoke run)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    meta = {"gpu": gpu, "torch": torch.__version__, "args": vars(args)}
    rows: list[dict] = []
    for name in args.models.split(","):
        bench_model(name, args, rows)
        (out_dir / "worker_prefill.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        table = summarize(rows, args)
        (out_dir / "worker_prefill.md").write_text("\n".join(table) + "\n")
        print("\n".join(table), flush=True)
    plot(rows, out_dir / "worker_prefill.png")


if __name__ == "__main__":
    main()
