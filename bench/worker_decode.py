"""Worker decode throughput: ModelRunner with and without masks vs transformers' generate.

Random weights shaped like Qwen2.5-1.5B (vocab 151936) and Llama-3.2-1B, bfloat16. For each
batch size, B prompts of --prompt-len random tokens are prefilled, then every setting decodes
--steps timed tokens per row (after --warmup untimed ones) from the same starting position:

  masks_off        top_k=50, top_p=0.9, no masks      (the baseline the mask cost is against)
  topk_topp_masks  top_k=50, top_p=0.9, masks
  top_p_off        top_p=0.9 only, no masks
  top_p_masks      top_p=0.9 only, masks              (the case SGLang reverted)

Throughput is rows x steps / wall time of ModelRunner.run (forward, kernels.sample, and the
host copy of tokens, log-probs and masks). Each (batch, setting) is measured --repeats times
(default 3), the settings interleaved and their order rotated each round so that drift of the
GPU's clocks or of the host hits every setting alike; every figure of a row is the median over
its repeats, and the row keeps the spread (`tokens_per_s_runs`, `spread` = (max - min) /
median). `sampler_ms` is the mean sampler time per step (device time on CUDA: StepStats'
mask_seconds), `forward_ms` the forward alone over the same rows. transformers runs once. transformers' `generate` runs the same weights
with a logits processor that builds the same masks the way the reference does (a full sort
of every row, then host copies), at the same batch; its decode rate is taken from the
difference of two runs (--steps + --warmup and --warmup new tokens), so prefill cancels.
The lm_head is scaled so a top-p 0.9 mask holds ~100 of 151936 ids (see random_weights.py).

The runner's fused Triton kernels (maskgate/worker/model/triton_*.py) are on by default on CUDA;
`--fused off` measures the torch path instead, and `--fused both` measures both in one run
(the unfused runner's rows are `maskgate-unfused`, and the table gains a column with the
fused speed-up), so a before/after comparison shares the GPU, weights and prompts.

    python -m bench.worker_decode                          # both models, batch 1/16/64/128
    python -m bench.worker_decode --models qwen2.5-1.5b --batches 64 --no-hf
    python -m bench.worker_decode --models llama-3.2-1b --batches 1,64,128 --fused both

`--logprobs` measures the cost of SGLang's return_logprob (the raw-distribution log-prob of
each token, optionally with its top 5) with masks on, at T = 1 and T = 0.7, instead of the
settings above, into worker_decode_logprobs.{json,md,png}:

    python -m bench.worker_decode --logprobs --models qwen2.5-1.5b --batches 64
    python -m bench.worker_decode --logprobs --device cpu --models smoke --batches 64 --steps 4

`--engine` measures the whole engine loop instead (Scheduler + Engine.step + ModelRunner, as
the server runs it, without the HTTP layer): the overlap schedule off and on (docs/worker.md,
"Overlap"), masks off and top-p 0.9 masks, into worker_decode_overlap.{json,md,png}. The
rate counts the tokens the engine committed during the timed steps; each row also has, from
the engine's metrics, the sampler's device time per step, its fallback rows per step, and the
engine thread's time per step split into its own work (`host_ms`) and its wait for the
device's results (`wait_ms`; near 0 when the host sets the pace), and the run's median, 90th
percentile and longest step (`step_p50_ms`, `step_p90_ms`, `step_max_ms`: a run slow in every
step against one with a few stalls). Once the runner is ready
the heap is frozen, as the worker does (docs/worker.md, "Garbage collection"):

    python -m bench.worker_decode --engine --models llama-3.2-1b,qwen2.5-1.5b --batches 1,64,128
    python -m bench.worker_decode --engine --device cpu --models smoke --batches 1,4 --steps 4 \
        --out worker_decode_smoke

Every row also gives the step against its memory floor: the bytes a decode step must read
(every weight once, the K/V of every row's context) over the device's measured copy
bandwidth (`floor_ms`, `step_over_floor`).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from bench.plotting import pyplot, save
from bench.shapes import LLAMA32_1B, LOGIT_STD, QWEN25_15B
from maskgate.worker.engine.batch import RowWork, SamplingParams
from maskgate.worker.engine.engine import freeze_heap
from maskgate.worker.model import ModelConfig, load
from maskgate.worker.model.loader import build
from maskgate.worker.model.random_weights import random_hf_weights
from maskgate.worker.runner.runner import ModelRunner

SHAPES: dict[str, dict[str, Any]] = {"qwen2.5-1.5b": QWEN25_15B, "llama-3.2-1b": LLAMA32_1B}
# Not a real shape: for `--device cpu --models smoke`, a check that the script runs.
SHAPES["smoke"] = {**SHAPES["qwen2.5-1.5b"], "vocab_size": 4096, "hidden_size": 64}
SHAPES["smoke"].update(intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
SETTINGS: dict[str, tuple[int, float, bool]] = {  # name -> (top_k, top_p, want_mask)
    "masks_off": (50, 0.9, False),
    "topk_topp_masks": (50, 0.9, True),
    "top_p_off": (-1, 0.9, False),
    "top_p_masks": (-1, 0.9, True),
}
# --logprobs: the cost of return_logprob at top-k 50 + top-p 0.9 with masks on, at T = 1
# (the log-probs read the logits as they are) and at T = 0.7 (they scale them first).
# name -> (top_k, top_p, want_mask, temperature, raw log-probs: -1 off, else top count).
LOGPROB_SETTINGS: dict[str, tuple[int, float, bool, float, int]] = {
    "masks_t1": (50, 0.9, True, 1.0, -1),
    "masks_t1_logprob": (50, 0.9, True, 1.0, 0),
    "masks_t1_logprob_top5": (50, 0.9, True, 1.0, 5),
    "masks_t07": (50, 0.9, True, 0.7, -1),
    "masks_t07_logprob": (50, 0.9, True, 0.7, 0),
}
LOGPROB_PAIRS = (
    ("masks_t1", "masks_t1_logprob"),
    ("masks_t1", "masks_t1_logprob_top5"),
    ("masks_t07", "masks_t07_logprob"),
)
# --engine: name -> (overlap schedule, top_k, top_p, want_mask).
ENGINE_SETTINGS: dict[str, tuple[bool, int, float, bool]] = {
    "overlap_off_masks_off": (False, -1, 0.9, False),
    "overlap_on_masks_off": (True, -1, 0.9, False),
    "overlap_off_top_p_masks": (False, -1, 0.9, True),
    "overlap_on_top_p_masks": (True, -1, 0.9, True),
}
HF_SETTINGS = ("topk_topp_masks", "top_p_masks")
MASK_PAIRS = (("masks_off", "topk_topp_masks"), ("top_p_off", "top_p_masks"))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_model(name: str, device: str) -> tuple[Any, dict[str, torch.Tensor]]:
    raw = SHAPES[name]
    weights = random_hf_weights(
        ModelConfig.from_hf(raw), seed=0, logit_std=LOGIT_STD, device=device, dtype=torch.bfloat16
    )
    tokenizer = load("tiny-random").tokenizer  # unused by decoding; the runner needs ids only
    eos = frozenset({0})  # unused: the benchmark never stops early
    loaded = build(name, raw, weights, tokenizer, eos, torch.device(device), torch.bfloat16)
    return loaded, weights


def copy_bandwidth(device: str) -> float:
    """Bytes per second a large device-to-device copy moves (each byte read once and written
    once): the measured ceiling for a step that must read its weights and K/V."""
    n = (1 << 30) if device == "cuda" else (64 << 20)
    src = torch.zeros(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    return 2 * n * reps / (time.perf_counter() - t0)


def bytes_per_step(runner: ModelRunner, batch: int, context: int) -> int:
    """What a decode step must read at least: every weight once (a tied embedding once; an
    untied one only its `batch` rows) and the K/V of `context` positions of every row."""
    model, cfg = runner.model, runner.config
    weights = sum(p.nbytes for p in {id(p): p for p in model.parameters()}.values())
    emb = model.embed_tokens.weight
    if emb is not model.lm_head.weight:
        weights -= emb.nbytes - batch * emb.shape[1] * emb.itemsize
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    return weights + batch * context * per_token * emb.itemsize


def decode(runner: ModelRunner, batch: int, setting: str, args: argparse.Namespace) -> dict:
    """Prefill `batch` rows, then time args.steps decode steps of every row."""
    if setting in LOGPROB_SETTINGS:
        top_k, top_p, want, temperature, logprobs = LOGPROB_SETTINGS[setting]
    else:
        (top_k, top_p, want), temperature, logprobs = SETTINGS[setting], 1.0, -1
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    want_lp, top_lp = logprobs >= 0, max(logprobs, 0)
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(10, 1000, (batch, args.prompt_len), generator=gen).tolist()
    rows = [RowWork(i, p, 0, sample=True, params=params) for i, p in enumerate(prompts)]
    results, _ = runner.run(rows)
    tokens = [r.token for r in results if r is not None]
    mask_s = 0.0
    mask_ids = overflows = fallbacks = 0
    t0 = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync(args.device)
            t0, mask_s, mask_ids, overflows, fallbacks = time.perf_counter(), 0.0, 0, 0, 0
        pos = args.prompt_len + step
        rows = [
            RowWork(
                i,
                [tokens[i]],
                pos,
                True,
                params,
                want_mask=want,
                step=step,
                want_logprob=want_lp,
                top_logprobs=top_lp,
            )
            for i in range(batch)
        ]
        results, stats = runner.run(rows)
        tokens = [r.token for r in results if r is not None]
        mask_s += stats.mask_seconds
        fallbacks += stats.num_fallback_rows
        mask_ids += sum(len(r.mask) for r in results if r is not None and r.mask)
        overflows += sum(r.mask_status == 1 for r in results if r is not None)
    wall = time.perf_counter() - t0
    # Where the step goes: the forward alone (graph replay + lm_head; no sampler, no host
    # results) over the same rows, rewriting the last step's K/V.
    sync(args.device)
    t1 = time.perf_counter()
    for _ in range(args.steps):
        runner.logits(rows)
    sync(args.device)
    forward = time.perf_counter() - t1
    context = args.prompt_len + args.warmup + args.steps // 2  # the timed steps' mean
    floor_ms = 1000 * bytes_per_step(runner, batch, context) / args.copy_bandwidth
    return {
        "tokens_per_s": batch * args.steps / wall,
        "step_ms": 1000 * wall / args.steps,
        "forward_ms": 1000 * forward / args.steps,
        "sampler_share": mask_s / wall,
        "sampler_ms": 1000 * mask_s / args.steps,
        "mean_mask_len": mask_ids / (batch * args.steps) if want else 0.0,
        "overflows": overflows,
        "fallback_rows": fallbacks,  # rows the sampler sent down its slow full pass
        "floor_ms": floor_ms,  # bytes read per step / measured copy bandwidth
        "step_over_floor": 1000 * wall / args.steps / floor_ms,
    }


def engine_decode(runner: ModelRunner, batch: int, setting: str, args: argparse.Namespace) -> dict:
    """`batch` sequences through Scheduler + Engine.step: prefill, args.warmup steps, then
    args.steps timed steps; the rate is the tokens committed while timed."""
    from maskgate.worker.engine.engine import Engine
    from maskgate.worker.engine.scheduler import Scheduler
    from maskgate.worker.engine.sequence import Sequence, StopRule
    from maskgate.worker.metrics import WorkerMetrics

    overlap, top_k, top_p, want = ENGINE_SETTINGS[setting]
    sched = Scheduler(
        runner,
        max_num_seqs=batch,
        max_prefill_tokens=batch * args.prompt_len,
        max_mask_tokens=runner.max_mask_tokens,
    )
    metrics = WorkerMetrics()
    engine = Engine(runner, sched, metrics, overlap=overlap)
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(10, 1000, (batch, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    rule = StopRule(args.warmup + args.steps + 4, ignore_eos=True)
    seqs = [Sequence(f"s{i}", p, params, rule, want_mask=want) for i, p in enumerate(prompts)]
    engine.submit(seqs)
    engine._drain_inbox(block=False)
    for _ in range(1 + args.warmup):  # the prefill step, then warm-up decode steps
        engine.step()
    sync(args.device)
    before = sum(len(s.output_ids) for s in seqs)
    totals0 = _engine_totals(metrics)
    ends = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
        ends.append(time.perf_counter())
    wall = ends[-1] - t0
    steps_ms = sorted(1000 * (b - a) for a, b in zip([t0, *ends], ends, strict=False))
    tokens = sum(len(s.output_ids) for s in seqs) - before
    engine.finish_step()
    mask_s, fallbacks, step_s, wait_s = (
        b - a for a, b in zip(totals0, _engine_totals(metrics), strict=True)
    )
    for s in seqs:  # free the slots for the next measurement
        sched.abort(s)
    context = args.prompt_len + args.warmup + args.steps // 2
    floor_ms = 1000 * bytes_per_step(runner, batch, context) / args.copy_bandwidth
    step_ms = 1000 * wall / args.steps
    return {
        "tokens_per_s": tokens / wall,
        "step_ms": step_ms,
        # The sampler's device time per step with mask rows (CUDA events; 0 with masks off)
        # and the rows it could not decide in its band, per step: where mask cost comes from
        # once overlap hides the host work.
        "sampler_ms": 1000 * mask_s / args.steps,
        "fallback_rows_per_step": fallbacks / args.steps,
        # The engine thread's time per step, apart from (host_ms) and waiting for (wait_ms)
        # the device's results: wait_ms near 0 means the host, not the GPU, sets the pace.
        "host_ms": 1000 * (step_s - wait_s) / args.steps,
        "wait_ms": 1000 * wait_s / args.steps,
        # The run's step times: a run slow in every step moves the median, a few stalls only
        # the maximum.
        "step_p50_ms": steps_ms[len(steps_ms) // 2],
        "step_p90_ms": steps_ms[int(0.9 * (len(steps_ms) - 1))],
        "step_max_ms": steps_ms[-1],
        "floor_ms": floor_ms,
        "step_over_floor": step_ms / floor_ms,
    }


def _engine_totals(metrics: Any) -> tuple[float, ...]:
    """(sampler seconds of the steps with mask rows, fallback rows, step seconds, device-wait
    seconds) the engine recorded."""
    get = metrics.registry.get_sample_value
    names = (
        "mask_kernel_seconds_sum",
        "sampler_fallback_rows_total",
        "step_seconds_sum",
        "step_device_wait_seconds_sum",
    )
    return tuple(get(f"maskgate_worker_{n}") or 0.0 for n in names)


def hf_decode(hf: Any, batch: int, setting: str, args: argparse.Namespace) -> dict:
    """transformers generate with a sort-based mask processor; decode tokens/s."""
    from transformers import LogitsProcessor, LogitsProcessorList

    top_k, top_p, _ = SETTINGS[setting]

    class SortMasks(LogitsProcessor):
        """The reference way: sort each full row, keep the top-k / top-p prefix, copy ids out."""

        def __init__(self) -> None:
            self.num_ids = 0

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            z, idx = scores.float().sort(dim=-1, descending=True)
            if top_k > 0:
                z[:, top_k:] = float("-inf")
            p = z.softmax(dim=-1)
            keep = (p.cumsum(dim=-1) - p) < top_p
            counts = keep.sum(dim=-1).tolist()
            ids = idx[keep].tolist()
            self.num_ids += len(ids)
            assert sum(counts) == len(ids)
            return scores

    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(10, 1000, (batch, args.prompt_len), generator=gen).to(args.device)
    times = []
    # The first run only warms up (kernel selection, allocator); then the two timed runs.
    for new in (2, args.warmup, args.warmup + args.steps):
        proc = SortMasks()
        sync(args.device)
        t0 = time.perf_counter()
        hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=top_k if top_k > 0 else 0,
            top_p=top_p,
            max_new_tokens=new,
            min_new_tokens=new,
            logits_processor=LogitsProcessorList([proc]),
            pad_token_id=0,
            eos_token_id=None,
        )
        sync(args.device)
        times.append(time.perf_counter() - t0)
    wall = times[2] - times[1]
    return {"tokens_per_s": batch * args.steps / wall, "step_ms": 1000 * wall / args.steps}


def guarded(fn: Any, *args: Any) -> dict:
    """One measurement; a failure is recorded in the results instead of ending the run."""
    try:
        return fn(*args)
    except Exception as e:
        traceback.print_exc()
        return {"tokens_per_s": None, "error": f"{type(e).__name__}: {e}"[:500]}


def measure(
    fn: Any, runner: Any, batch: int, settings: list[str], args: argparse.Namespace
) -> dict:
    """args.repeats rounds over `settings`, rotated one place each round; setting -> the
    median row (see aggregate)."""
    runs: dict[str, list[dict]] = {s: [] for s in settings}
    for rep in range(args.repeats):
        k = rep % len(settings)
        for setting in settings[k:] + settings[:k]:
            runs[setting].append(guarded(fn, runner, batch, setting, args))
            rate = runs[setting][-1].get("tokens_per_s")
            # progress, so a run cut short still shows how far it got and at what rate
            print(f"  batch {batch} {setting} repeat {rep + 1}: {rate or 0:.0f} tok/s", flush=True)
    return {s: aggregate(runs[s]) for s in settings}


def aggregate(runs: list[dict]) -> dict:
    """The median of every figure over the repeats, with the spread of the throughput; a
    failed repeat fails the row (its error is kept)."""
    failed = [r for r in runs if r.get("tokens_per_s") is None]
    if failed:
        return {**failed[0], "repeats": len(runs)}
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rates = [r["tokens_per_s"] for r in runs]
    row["repeats"] = len(runs)
    row["tokens_per_s_runs"] = rates
    row["spread"] = (max(rates) - min(rates)) / row["tokens_per_s"]
    return row


def bench_model(name: str, args: argparse.Namespace, out: list[dict]) -> None:
    t0 = time.perf_counter()
    loaded, weights = make_model(name, args.device)
    max_len = args.prompt_len + args.warmup + args.steps + 1
    print(f"[{name}] built in {time.perf_counter() - t0:.1f} s", flush=True)
    # (impl name, fused kernels): the main runner first, then the torch path for comparison.
    runs = [("maskgate", args.fused != "off")]
    if args.fused == "both":
        runs.append(("maskgate-unfused", False))
    for impl, fused in runs:
        t0 = time.perf_counter()
        runner = ModelRunner(
            loaded, max_num_slots=max(args.batches), max_model_len=max_len, fused_kernels=fused
        )
        # The runner compiles every sampler and model kernel variant before its first step.
        print(f"[{name}] {impl} runner ready in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.engine:
            freeze_heap()  # as the worker does once it is ready (docs/worker.md)
        fn = engine_decode if args.engine else decode
        for batch in args.batches:
            for setting, result in measure(fn, runner, batch, args.settings, args).items():
                row = {"model": name, "impl": impl, "batch": batch, "setting": setting}
                row["fused"] = runner.fused
                out.append({**row, **result})
                print(json.dumps(out[-1]), flush=True)
        del runner
        gc.unfreeze()
    if args.eager:
        # The effect of decode CUDA graphs: the same runner code with graphs off.
        eager = ModelRunner(
            loaded,
            max_num_slots=max(args.batches),
            max_model_len=max_len,
            cuda_graphs=False,
            fused_kernels=args.fused != "off",
        )
        for batch in args.batches:
            row = {"model": name, "impl": "maskgate-eager", "batch": batch, "setting": "masks_off"}
            result = measure(decode, eager, batch, ["masks_off"], args)["masks_off"]
            out.append({**row, **result})
            print(json.dumps(out[-1]), flush=True)
        del eager
    if args.hf:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.for_model(**SHAPES[name])
        with torch.device(args.device):
            hf = AutoModelForCausalLM.from_config(
                hf_config, dtype=torch.bfloat16, attn_implementation="sdpa"
            ).eval()
        hf.load_state_dict(weights, strict=False)
        hf.tie_weights()
        for batch in args.batches:
            for setting in (s for s in HF_SETTINGS if s in args.settings):
                row = {"model": name, "impl": "transformers", "batch": batch, "setting": setting}
                out.append({**row, **guarded(hf_decode, hf, batch, setting, args)})
                print(json.dumps(out[-1]), flush=True)
        del hf
    del loaded, weights
    if args.device == "cuda":
        torch.cuda.empty_cache()


def _ratio(a: float | None, b: float | None, fmt: str, cost: bool = False) -> str:
    """a / b formatted; cost: the share of throughput lost going from a to b."""
    if not a or not b:
        return "-"
    return fmt.format(1 - b / a if cost else a / b)


def summarize(rows: list[dict]) -> list[str]:
    get = {(r["model"], r["impl"], r["batch"], r["setting"]): r["tokens_per_s"] for r in rows}
    lines = [
        "| model | batch | runner | masks off | top-k+top-p masks | top-p off | top-p masks "
        "| mask cost (top-k+top-p / top-p) | vs transformers (top-k+top-p / top-p) "
        "| graphs speed-up | fused speed-up (top-k+top-p / top-p masks) "
        "| top-p masks ms/step (forward / sampler / whole) | step / memory floor "
        "(masks off / top-p masks) | spread (worst setting) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ms = {(r["model"], r["impl"], r["batch"], r["setting"]): r for r in rows}
    impls = [i for i in ("maskgate", "maskgate-unfused") if any(r["impl"] == i for r in rows)]
    for model in dict.fromkeys(r["model"] for r in rows):
        for batch in sorted({r["batch"] for r in rows if r["model"] == model}):
            hf = {s: get.get((model, "transformers", batch, s)) for s in HF_SETTINGS}
            unfused = {s: get.get((model, "maskgate-unfused", batch, s)) for s in SETTINGS}
            for impl in impls:
                ours = {s: get.get((model, impl, batch, s)) for s in SETTINGS}
                cost = " / ".join(
                    _ratio(ours[off], ours[m], "{:.1%}", cost=True) for off, m in MASK_PAIRS
                )
                speed = " / ".join(_ratio(ours[s], hf[s], "{:.2f}x") for s in HF_SETTINGS)
                cells = [f"{ours[s]:.0f}" if ours[s] else "-" for s in SETTINGS]
                graphs = "-"
                fused = "-"
                if impl == "maskgate":
                    eager = get.get((model, "maskgate-eager", batch, "masks_off"))
                    graphs = _ratio(ours["masks_off"], eager, "{:.2f}x")
                    fused = " / ".join(_ratio(ours[s], unfused[s], "{:.2f}x") for s in HF_SETTINGS)
                r = ms.get((model, impl, batch, "top_p_masks"), {})
                split = "-"
                if r.get("forward_ms") and r.get("step_ms"):
                    sampler = f"{r['sampler_ms']:.2f}" if "sampler_ms" in r else "-"
                    split = f"{r['forward_ms']:.2f} / {sampler} / {r['step_ms']:.2f}"
                spreads = [
                    ms[(model, impl, batch, s)].get("spread")
                    for s in SETTINGS
                    if (model, impl, batch, s) in ms
                ]
                spread = max((x for x in spreads if x is not None), default=None)
                worst = "-" if spread is None else f"{spread:.1%}"
                floor = " / ".join(
                    f"{x:.2f}x"
                    if (x := ms.get((model, impl, batch, s), {}).get("step_over_floor"))
                    else "-"
                    for s in ("masks_off", "top_p_masks")
                )
                lines.append(
                    f"| {model} | {batch} | {impl} | {' | '.join(cells)} | {cost} | {speed} "
                    f"| {graphs} | {fused} | {split} | {floor} | {worst} |"
                )
    return lines


def summarize_engine(rows: list[dict]) -> list[str]:
    """--engine: decode tokens/s of the engine loop, the overlap schedule off / on."""
    get = {(r["model"], r["batch"], r["setting"]): r for r in rows}
    lines = [
        "| model | batch | masks off (overlap off / on) | top-p masks (overlap off / on) "
        "| overlap gain (masks off / top-p masks) | top-p mask cost (overlap off / on) "
        "| step ms, overlap on (masks off / top-p masks) | memory floor ms "
        "| step / floor, overlap on (masks off / top-p masks) "
        "| top-p masks, overlap on: sampler ms / fallback rows per step "
        "| overlap on, host / device-wait ms per step (masks off; top-p masks) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        for batch in sorted({r["batch"] for r in rows if r["model"] == model}):
            r = {n: get.get((model, batch, n), {}) for n in ENGINE_SETTINGS}
            rate = {n: r[n].get("tokens_per_s") for n in ENGINE_SETTINGS}

            def pair(a: str, b: str, key: str = "tokens_per_s", fmt: str = "{:.0f}") -> str:
                x, y = r[a].get(key), r[b].get(key)  # noqa: B023
                return " / ".join("-" if v is None else fmt.format(v) for v in (x, y))

            gain = " / ".join(
                _ratio(rate[f"overlap_on_{m}"], rate[f"overlap_off_{m}"], "{:.2f}x")
                for m in ("masks_off", "top_p_masks")
            )
            cost = " / ".join(
                _ratio(
                    rate[f"overlap_{o}_masks_off"], rate[f"overlap_{o}_top_p_masks"], "{:.1%}", True
                )
                for o in ("off", "on")
            )
            floor = r["overlap_on_masks_off"].get("floor_ms")
            lines.append(
                f"| {model} | {batch} | {pair('overlap_off_masks_off', 'overlap_on_masks_off')} "
                f"| {pair('overlap_off_top_p_masks', 'overlap_on_top_p_masks')} | {gain} | {cost} "
                f"| {pair('overlap_on_masks_off', 'overlap_on_top_p_masks', 'step_ms', '{:.2f}')} "
                f"| {'-' if floor is None else f'{floor:.2f}'} "
                f"| {pair('overlap_on_masks_off', 'overlap_on_top_p_masks', 'step_over_floor', '{:.2f}x')} "
                f"| {sampler(r['overlap_on_top_p_masks'])} "
                f"| {host(r['overlap_on_masks_off'])}; {host(r['overlap_on_top_p_masks'])} |"
            )
    return lines


def sampler(row: dict) -> str:
    """An engine row's sampler time and fallback rows per step ("-" where not recorded)."""
    if "sampler_ms" not in row:
        return "-"
    return f"{row['sampler_ms']:.3f} / {row['fallback_rows_per_step']:.2f}"


def host(row: dict) -> str:
    """An engine row's host and device-wait time per step ("-" where not recorded)."""
    if "host_ms" not in row:
        return "-"
    return f"{row['host_ms']:.2f} / {row['wait_ms']:.2f}"


def summarize_logprobs(rows: list[dict]) -> list[str]:
    """--logprobs: decode tokens/s with masks on, return_logprob off and on, and its cost."""
    names = list(LOGPROB_SETTINGS)
    get = {(r["model"], r["batch"], r["setting"]): r for r in rows}
    lines = [
        "| model | batch | "
        + " | ".join(names)
        + " | logprob cost T=1 | top-5 cost T=1 | logprob cost T=0.7 "
        + "| step ms T=1 (off / on) |",
        "|---|---|" + "---|" * (len(names) + 4),
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        for batch in sorted({r["batch"] for r in rows if r["model"] == model}):
            rate = {n: get.get((model, batch, n), {}).get("tokens_per_s") for n in names}
            cells = [f"{rate[n]:.0f}" if rate[n] else "-" for n in names]
            costs = [_ratio(rate[a], rate[b], "{:.1%}", cost=True) for a, b in LOGPROB_PAIRS]
            off = get.get((model, batch, "masks_t1"), {}).get("step_ms")
            on = get.get((model, batch, "masks_t1_logprob"), {}).get("step_ms")
            split = f"{off:.2f} / {on:.2f}" if off is not None and on is not None else "-"
            lines.append(
                f"| {model} | {batch} | {' | '.join(cells)} | {' | '.join(costs)} | {split} |"
            )
    return lines


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        series = [("maskgate", s) for s in [*SETTINGS, *LOGPROB_SETTINGS, *ENGINE_SETTINGS]]
        series.append(("maskgate-eager", "masks_off"))
        series += [("maskgate-unfused", s) for s in SETTINGS]
        series += [("transformers", s) for s in HF_SETTINGS]
        for impl, setting in series:
            pts = sorted(
                (r["batch"], r["tokens_per_s"], r.get("tokens_per_s_runs") or [r["tokens_per_s"]])
                for r in rows
                if (r["model"], r["impl"], r["setting"]) == (model, impl, setting)
                and r["tokens_per_s"]
            )
            if pts:
                style = "--" if impl != "maskgate" else "-"
                xs, ys, runs = zip(*pts, strict=True)
                # Bars: the lowest and highest of the repeats around their median.
                err = [
                    [y - min(r) for y, r in zip(ys, runs, strict=True)],
                    [max(r) - y for y, r in zip(ys, runs, strict=True)],
                ]
                ax.errorbar(
                    xs, ys, yerr=err, fmt=style, marker="o", capsize=2, label=f"{impl} {setting}"
                )
        ax.set(title=f"{model} decode", xlabel="batch", ylabel="tokens/s")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-1.5b,llama-3.2-1b")
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="measurements of each (batch, setting), settings interleaved; rows report the "
        "median and the spread",
    )
    ap.add_argument("--no-hf", dest="hf", action="store_false")
    ap.add_argument("--no-eager", dest="eager", action="store_false")
    ap.add_argument(
        "--fused",
        choices=("on", "off", "both"),
        default="on",
        help="the runner's fused Triton kernels: on (the default runner), off (the torch "
        "path), or both (also run the torch path, as `maskgate-unfused`: before/after)",
    )
    ap.add_argument(
        "--settings", default=",".join(SETTINGS), help=f"a subset of {','.join(SETTINGS)}"
    )
    ap.add_argument(
        "--logprobs",
        action="store_true",
        help="measure return_logprob off / on with masks on (settings "
        f"{','.join(LOGPROB_SETTINGS)}) instead; writes worker_decode_logprobs.*",
    )
    ap.add_argument(
        "--engine",
        action="store_true",
        help="measure the engine loop, the overlap schedule off / on, masks off / top-p masks "
        f"(settings {','.join(ENGINE_SETTINGS)}) instead; writes worker_decode_overlap.*",
    )
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script only")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.copy_bandwidth = 0.0  # measured before the first model
    if args.repeats < 1:
        sys.exit("--repeats must be >= 1")
    args.settings = [x for x in args.settings.split(",") if x]
    if args.engine:
        args.settings = list(ENGINE_SETTINGS)
    unknown = sorted(set(args.settings) - set(SETTINGS) - set(ENGINE_SETTINGS))
    if unknown:
        sys.exit(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    stem = "worker_decode"
    if args.logprobs:  # transformers and the eager runner have no log-prob counterpart here
        args.settings, args.hf, args.eager = list(LOGPROB_SETTINGS), False, False
        stem = "worker_decode_logprobs"
    if args.engine:  # the engine loop has no transformers or eager counterpart here
        args.hf, args.eager = False, False
        stem = "worker_decode_overlap"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench.worker_decode needs a CUDA GPU (or --device cpu for a smoke run)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    args.copy_bandwidth = copy_bandwidth(args.device)
    print(f"device copy bandwidth: {args.copy_bandwidth / 1e9:.0f} GB/s", flush=True)
    meta = {"gpu": gpu, "torch": torch.__version__, "triton": _triton_version(), "args": vars(args)}
    for name in args.models.split(","):
        bench_model(name, args, rows)
        # Written after each model, so a run cut short still leaves its results.
        (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        table = tabulate(rows, args)
        (out_dir / f"{stem}.md").write_text("\n".join(table) + "\n")
        print("\n".join(table), flush=True)
    plot(rows, out_dir / f"{stem}.png")


def tabulate(rows: list[dict], args: argparse.Namespace) -> list[str]:
    if args.logprobs:
        return summarize_logprobs(rows)
    return summarize_engine(rows) if args.engine else summarize(rows)


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


if __name__ == "__main__":
    main()
