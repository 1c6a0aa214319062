"""Isolation benchmark (issue 6): what a top-p-only mask stream costs general traffic.

A steady stream of general requests (streaming /generate, no mask) runs alongside a stream of
top-p-only mask requests (return_sampling_mask, top_p 0.95, no top_k), both closed-loop,
through the maskgate gateway, against workers serving random weights shaped like Qwen2.5-1.5B
(vocab 151936, bf16). Three layouts, one after the other:

  sort_all_rows  one `mixed` worker; whenever any row of a decode batch asks for a mask, every
                 row is sorted over the full vocabulary (SGLang's reference; maskgate/worker/sort_all.py)
  kernel         one `mixed` worker with the row-filtered kernels (kernels.sample)
  isolated       the gateway routes mask requests to a `mask` worker and the rest to a
                 `general` worker: two processes on the same GPU, each with half the KV budget

For each: general TPOT p50/p99, TTFT p50/p99 and tokens/s, and mask tokens/s, over a window
after warm-up (definitions in bench/isolation/report.py). Prints a table and writes
bench/results/isolation.json and isolation.png.

    python -m bench.pool_isolation --device cuda                        # the H200 run
    python -m bench.pool_isolation --model tiny-random --device cpu --seconds 3 --warmup 2 \
        --general-clients 4 --mask-clients 2 --stem isolation_cpu_smoke  # a dry run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.isolation import procs, report
from bench.isolation.load import Traffic, run_clients

ALL_LAYOUTS = ("sort_all_rows", "kernel", "isolated")
LAYOUT_OVERHEAD_S = 45  # start-up, warm-up requests and shutdown of one layout, for the time budget


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-1.5b", help="qwen2.5-1.5b (random) or a spec")
    p.add_argument("--ckpt-dir", type=Path, default=None, help="where the checkpoint goes")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--layouts", default=",".join(ALL_LAYOUTS))
    p.add_argument("--general-clients", type=int, default=32)
    p.add_argument("--mask-clients", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--general-new-tokens", type=int, default=128)
    p.add_argument("--mask-new-tokens", type=int, default=128)
    p.add_argument("--top-p", type=float, default=0.95, help="of both streams")
    p.add_argument("--seconds", type=float, default=30, help="measurement window per layout")
    p.add_argument("--warmup", type=float, default=8, help="seconds of load before the window")
    p.add_argument("--kv-slots", type=int, default=64, help="sequences the mixed KV budget holds")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--load-procs", type=int, default=4, help="client processes")
    p.add_argument("--gateway-procs", type=int, default=2)
    p.add_argument("--cpu-threads", type=int, default=None, help="per worker (CPU runs)")
    p.add_argument("--budget-s", type=float, default=None, help="skip layouts that would end later")
    p.add_argument("--ready-timeout", type=float, default=150)
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--stem", default="isolation")
    p.add_argument("--replot", type=Path, help="redraw the table and plot of a results JSON")
    return p.parse_args(argv)


def model_setup(args: argparse.Namespace) -> tuple[str, int, dict[str, Any]]:
    """(worker model spec, KV bytes per slot, facts for the report)."""
    import torch

    from bench.isolation.checkpoint import QWEN25_15B, write_checkpoint
    from maskgate.worker.kv_cache import bytes_per_slot
    from maskgate.worker.model.config import ModelConfig
    from maskgate.worker.model.tiny_random import CONFIG as TINY

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    facts: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch.")}
    if args.model == "qwen2.5-1.5b":
        path = args.ckpt_dir or Path(tempfile.gettempdir()) / "maskgate-qwen2.5-1.5b-random"
        facts["checkpoint_write_s"] = round(write_checkpoint(path, args.device), 1)
        spec, raw = str(path), QWEN25_15B
    elif args.model == "tiny-random":
        spec, raw = "tiny-random", TINY
    else:
        spec, raw = args.model, json.loads((Path(args.model) / "config.json").read_text())
    facts["vocab_size"] = raw["vocab_size"]
    per_slot = bytes_per_slot(ModelConfig.from_hf(raw), args.max_model_len, dtype)
    if args.device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_count"] = torch.cuda.device_count()
    return spec, per_slot, facts


def start_layout(
    layout: str, args: argparse.Namespace, spec: str, per_slot: int
) -> tuple[list[procs.Proc], procs.Proc]:
    """Start the workers and the gateway of `layout` (not yet waited for)."""
    # Half a slot of slack so each isolated worker's half holds exactly kv_slots / 2 sequences
    # (plus the scratch slot every KV cache keeps).
    total_gb = (args.kv_slots + 2.5) * per_slot / 2**30
    common = {
        "model": spec,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "cpu_threads": args.cpu_threads,
    }
    if layout == "isolated":
        half = args.kv_slots // 2
        kw = {**common, "mask_impl": "kernel", "kv_memory_gb": total_gb / 2, "max_num_seqs": half}
        workers = [
            procs.worker("mask worker", role="mask", **kw),
            procs.worker("general worker", role="general", **kw),
        ]
        mask_url, general_url = workers[0].url, workers[1].url
    else:
        kw = {**common, "mask_impl": layout, "kv_memory_gb": total_gb}
        workers = [procs.worker("mixed worker", role="mixed", max_num_seqs=args.kv_slots, **kw)]
        mask_url = general_url = workers[0].url
    for w in workers:
        w.start()
    return workers, procs.gateway(general_url, mask_url, args.gateway_procs)


def probe(url: str, traffic: Traffic, timeout_s: float, seed: int = 0) -> None:
    """One short request; a mask request must come back with masks."""
    body: dict[str, Any] = {
        "input_ids": list(range(3 + seed, 3 + seed + min(16, traffic.prompt_len))),
        "sampling_params": {"temperature": 1.0, "top_p": traffic.top_p, "max_new_tokens": 8},
    }
    if traffic.want_mask:
        body["return_sampling_mask"] = True
    req = urllib.request.Request(
        url + "/generate",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        answer = json.loads(resp.read())
    if traffic.want_mask and not answer["meta_info"].get("output_token_sampling_mask"):
        raise SystemExit(f"probe: the mask request came back without masks: {answer}")


def warm(url: str, traffics: list[Traffic], timeout_s: float) -> None:
    """Pay JIT compiles before the load: one request of each kind, then bursts of 8 at once.

    A first batch of one row and later batches of many can need different Triton
    specialisations (a length-1 per-row tensor sliced out of a wider one is not 16-byte
    aligned); a compile in the middle of the window stalls every stream for tens of seconds.
    """
    general, mask = traffics
    for t in traffics:
        probe(url, t, timeout_s)
    with ThreadPoolExecutor(16) as threads:
        for burst in ([general] * 8, [general] * 8 + [mask] * 8):
            futures = [threads.submit(probe, url, t, timeout_s, i) for i, t in enumerate(burst)]
            for f in futures:
                f.result()


def split(traffic: Traffic, parts: int) -> list[Traffic]:
    """Spread the clients of one stream over `parts` processes."""
    base, extra = divmod(traffic.clients, parts)
    fields = {k: getattr(traffic, k) for k in traffic.__dataclass_fields__ if k != "clients"}
    return [Traffic(clients=base + (i < extra), **fields) for i in range(parts)]


def run_layout(
    layout: str,
    args: argparse.Namespace,
    spec: str,
    per_slot: int,
    traffics: list[Traffic],
    pool: ProcessPoolExecutor,
) -> dict[str, Any]:
    t_start = time.monotonic()
    workers, gw = start_layout(layout, args, spec, per_slot)
    everything = [*workers, gw]
    try:
        deadline = time.monotonic() + args.ready_timeout
        for w in workers:
            w.wait_ready(deadline)
        gw.start().wait_ready(deadline)
        ready_s = time.monotonic() - t_start
        warm(gw.url, traffics, args.ready_timeout)
        setup_s = time.monotonic() - t_start
        per_proc = list(zip(*(split(t, args.load_procs) for t in traffics), strict=True))
        start = time.monotonic() + 0.5
        t0 = start + args.warmup
        t1 = t0 + args.seconds
        futures = [
            pool.submit(run_clients, gw.url, [t for t in ts if t.clients], i, start, t1)
            for i, ts in enumerate(per_proc)
        ]
        records = [r for f in futures for r in f.result()]
    finally:
        for p in everything:
            p.stop()
    res = report.summarise(records, t0, t1, {t.kind: t.max_new_tokens for t in traffics})
    if not res["general"]["tok_s"] or not res["mask"]["tok_s"]:  # say why in the results
        res["log_tails"] = {p.name: p.tail(2000) for p in everything}
    res["ready_s"] = round(ready_s, 1)
    res["setup_s"] = round(setup_s, 1)
    res["processes"] = [w.name for w in workers]
    return res


def plot_title(config: dict[str, Any], facts: dict[str, Any]) -> str:
    return (
        f"{config['general_clients']} general + {config['mask_clients']} top-p "
        f"{config['top_p']} mask clients, closed loop; {facts.get('gpu', config['device'])}, "
        f"random {config['model']} {facts['dtype']}, {config['seconds']:.0f} s window"
    )


def replot(path: Path) -> int:
    payload = json.loads(path.read_text())
    print(report.table(payload["results"]))
    title = plot_title(payload["config"], payload["facts"])
    report.plot(payload["results"], path.with_suffix(".png"), title)
    print(f"wrote {path.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        return replot(args.replot)
    t_begin = time.monotonic()
    layouts = [x for x in args.layouts.split(",") if x]
    for x in layouts:
        if x not in ALL_LAYOUTS:
            raise SystemExit(f"unknown layout {x!r}; choose from {', '.join(ALL_LAYOUTS)}")
    spec, per_slot, facts = model_setup(args)
    print(f"model ready: {spec} ({json.dumps(facts)}) after {time.monotonic() - t_begin:.1f} s")
    traffics = [
        Traffic("general", args.general_clients, args.prompt_len, args.general_new_tokens,
                args.top_p, False, 500),
        Traffic("mask", args.mask_clients, args.prompt_len, args.mask_new_tokens,
                args.top_p, True, 500),
    ]  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "facts": facts,
        "traffic": [t.__dict__ for t in traffics],
        "results": {},
        "skipped": [],
    }
    payload["config"].pop("out_dir")
    payload["config"].pop("ckpt_dir")
    payload["config"].pop("replot")
    results: dict[str, dict[str, Any]] = payload["results"]
    json_path = args.out_dir / f"{args.stem}.json"
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.load_procs, mp_context=ctx) as pool:
        list(pool.map(time.sleep, [0.0] * args.load_procs))  # start the client processes now
        for layout in layouts:
            need = LAYOUT_OVERHEAD_S + args.warmup + args.seconds
            if args.budget_s is not None and time.monotonic() - t_begin + need > args.budget_s:
                print(f"skipping {layout}: it would end past --budget-s {args.budget_s}")
                payload["skipped"].append(layout)
                continue
            print(f"layout {layout}: starting", flush=True)
            results[layout] = run_layout(layout, args, spec, per_slot, traffics, pool)
            print(f"layout {layout}: {json.dumps(results[layout])}", flush=True)
            report.write_json(json_path, payload)  # partial results survive a cut run
    payload["total_s"] = round(time.monotonic() - t_begin, 1)
    report.write_json(json_path, payload)
    print(report.table(results))
    if results:
        title = plot_title(payload["config"], facts)
        try:
            report.plot(results, args.out_dir / f"{args.stem}.png", title)
        except ImportError as e:  # the JSON is the result; the plot can be redrawn from it
            print(f"no plot: {e}")
    print(f"wrote {json_path} in {payload['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
