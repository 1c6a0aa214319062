"""Isolation benchmark: what a top-p-only mask stream costs general traffic.

A steady stream of general requests (streaming /generate, no mask) runs alongside a stream of
top-p-only mask requests (return_sampling_mask, top_p 0.95, no top_k), both closed-loop,
through the maskgate gateway, against workers serving random weights shaped like Qwen2.5-1.5B
(vocab 151936, bf16). Three layouts, one after the other:

  sort_all_rows  one `mixed` worker; whenever any row of a decode batch asks for a mask, every
                 row is sorted over the full vocabulary (SGLang's reference;
                 maskgate/kernels/sort_all.py)
  kernel         one `mixed` worker with the row-filtered kernels (kernels.sample)
  isolated       the gateway routes mask requests to a `mask` worker and the rest to a
                 `general` worker: two processes on the same GPU, each with half the KV budget

With `--gpus 2` (a host with two GPUs), each worker owns a card and the layouts become:

  sort_all_rows@2  two `mixed` workers with --mask-impl sort_all_rows, one per GPU; the gateway
                   balances all traffic over both
  kernel@2         the same with the default kernels
  isolated@2       a `general` worker on GPU 0 and a `mask` worker on GPU 1
  general_only     the same general traffic without mask clients, one worker on one GPU: the
                   baseline the isolated layout's general TPOT is held against (target 1.1x)

`--loads light,heavy` runs every layout under each load: light is --mask-clients; heavy puts
top-p masks on a quarter of all clients (--general-clients / 3 mask clients).

For each: general TPOT p50/p99, TTFT p50/p99 and tokens/s, mask tokens/s and total tokens/s
per GPU, over a window after warm-up (definitions in bench/isolation/report.py). Prints a table
and writes bench/results/<stem>.json and <stem>.png.

    python -m bench.pool_isolation --device cuda                        # the H200 run
    python -m bench.pool_isolation --device cuda --gpus 2 --loads light,heavy \
        --stem isolation_dedicated_gpus                                  # two GPUs
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
TWO_GPU_LAYOUTS = ("sort_all_rows@2", "kernel@2", "isolated@2", "general_only")
LOADS = ("light", "heavy")
LAYOUT_OVERHEAD_S = 45  # start-up, warm-up requests and shutdown of one layout, for the time budget


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-1.5b", help="qwen2.5-1.5b (random) or a spec")
    p.add_argument("--ckpt-dir", type=Path, default=None, help="where the checkpoint goes")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--gpus", type=int, choices=[1, 2], default=1, help="cards (2: one a worker)")
    p.add_argument("--layouts", default=None, help="default: every layout of --gpus")
    p.add_argument("--loads", default="light", help="light, heavy or both (comma-separated)")
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
    from maskgate.worker.engine.kv_cache import bytes_per_slot
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
    if layout.endswith("@2") or layout == "general_only":
        return start_dedicated(layout, args, common, per_slot)
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
    return workers, procs.gateway([general_url], [mask_url], args.gateway_procs)


def start_dedicated(
    layout: str, args: argparse.Namespace, common: dict[str, Any], per_slot: int
) -> tuple[list[procs.Proc], procs.Proc]:
    """The layouts where every worker owns a GPU, with the whole KV budget of its card."""
    kw = {**common, "kv_memory_gb": (args.kv_slots + 2.5) * per_slot / 2**30}
    kw["max_num_seqs"] = args.kv_slots
    if layout == "isolated@2":
        workers = [
            procs.worker("general worker", role="general", mask_impl="kernel", gpu=0, **kw),
            procs.worker("mask worker", role="mask", mask_impl="kernel", gpu=1, **kw),
        ]
        general, mask = [workers[0].url], [workers[1].url]
    elif layout == "general_only":
        workers = [procs.worker("general worker", role="general", mask_impl="kernel", gpu=0, **kw)]
        general, mask = [workers[0].url], [workers[0].url]  # no mask client runs
    else:
        impl = layout.removesuffix("@2")
        workers = [
            procs.worker(f"mixed worker {g}", role="mixed", mask_impl=impl, gpu=g, **kw)
            for g in (0, 1)
        ]
        general = mask = [w.url for w in workers]
    for w in workers:
        w.start()
    return workers, procs.gateway(general, mask, args.gateway_procs)


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
    live = [t for t in traffics if t.clients]
    for t in live:
        probe(url, t, timeout_s)
    with ThreadPoolExecutor(16) as threads:
        for burst in ([general] * 8, [general] * 8 + [mask] * 8 * bool(mask.clients)):
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
    gpus = 1 if layout == "general_only" else args.gpus
    res = report.summarise(records, t0, t1, {t.kind: t.max_new_tokens for t in traffics}, gpus)
    wants_mask = any(t.clients for t in traffics if t.want_mask)
    if not res["general"]["tok_s"] or (wants_mask and not res["mask"]["tok_s"]):
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
    known = ALL_LAYOUTS if args.gpus == 1 else TWO_GPU_LAYOUTS
    layouts = [x for x in (args.layouts or ",".join(known)).split(",") if x]
    for x in layouts:
        if x not in known:
            raise SystemExit(f"unknown layout {x!r} for --gpus {args.gpus}: {', '.join(known)}")
    loads = [x for x in args.loads.split(",") if x]
    for x in loads:
        if x not in LOADS:
            raise SystemExit(f"unknown load {x!r}; choose from {', '.join(LOADS)}")
    if args.device == "cuda" and args.gpus == 2:
        import torch

        if torch.cuda.device_count() < 2:
            raise SystemExit(f"--gpus 2 needs two GPUs; this host has {torch.cuda.device_count()}")
    spec, per_slot, facts = model_setup(args)
    print(f"model ready: {spec} ({json.dumps(facts)}) after {time.monotonic() - t_begin:.1f} s")
    mask_clients = {"light": args.mask_clients, "heavy": max(1, args.general_clients // 3)}
    traffic_of = {
        load: [
            Traffic("general", args.general_clients, args.prompt_len, args.general_new_tokens,
                    args.top_p, False, 500),
            Traffic("mask", mask_clients[load], args.prompt_len, args.mask_new_tokens,
                    args.top_p, True, 500),
        ]
        for load in loads
    }  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "facts": facts,
        "traffic": {load: [t.__dict__ for t in ts] for load, ts in traffic_of.items()},
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
        for load in loads:
            for layout in layouts:
                if layout == "general_only" and load != loads[0]:
                    continue  # no mask clients: the same run under every load
                key = layout if load == "light" else f"{layout}+{load}"
                need = LAYOUT_OVERHEAD_S + args.warmup + args.seconds
                if args.budget_s is not None and time.monotonic() - t_begin + need > args.budget_s:
                    print(f"skipping {key}: it would end past --budget-s {args.budget_s}")
                    payload["skipped"].append(key)
                    continue
                ts = traffic_of[load]
                if layout == "general_only":
                    ts = [ts[0], Traffic(**{**ts[1].__dict__, "clients": 0})]
                print(f"layout {key}: starting", flush=True)
                results[key] = run_layout(layout, args, spec, per_slot, ts, pool)
                print(f"layout {key}: {json.dumps(results[key])}", flush=True)
                report.write_json(json_path, payload)  # partial results survive a cut run
    payload["total_s"] = round(time.monotonic() - t_begin, 1)
    report.write_json(json_path, payload)
    print(report.table(results))
    if results:
        title = plot_title(payload["config"], facts)
        report.plot(results, args.out_dir / f"{args.stem}.png", title)
    print(f"wrote {json_path} in {payload['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
