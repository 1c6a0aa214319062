"""Worker decode over HTTP: tokens/s with masks off, as lists and packed; answer bytes per token.

One worker process per model (`maskgate worker`) on random weights shaped like Qwen2.5-1.5B
and Llama-3.2-1B (bench/isolation/checkpoint.py; prompts go as input_ids), its
`--max-num-seqs` the largest batch. For each batch B, B concurrent clients each send
`/generate` requests back to back
(top-p 0.9, temperature 1, `--max-new-tokens` with ignore_eos, prompts of `--prompt-len`
random ids) for `--seconds`, once per setting:

  off     no masks
  lists   return_sampling_mask, sampling_mask_format "lists" (the default)
  packed  return_sampling_mask, sampling_mask_format "packed"

tokens/s is completion tokens received / wall time (the answers' bytes are read, not parsed:
every answer holds `--max-new-tokens` tokens); bytes/token is answer bytes / tokens. Settings
are interleaved and their order rotated over `--rounds`; the median round is kept. The cost of
a format is 1 - its tokens/s over `off`'s (the target for packed: at most 5% at batches 64
and 128 on a GPU).

    python -m bench.worker_http                                      # both models, 64/128, ~8 min
    python -m bench.worker_http --models llama-3.2-1b --stem worker_http_llama   # one, ~4 min
    python -m bench.worker_http --device cpu --models smoke --batches 4 --seconds 3   # smoke

Prints a table and writes {--stem}.json and {--stem}.png (worker_http by default) under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.isolation import checkpoint
from bench.isolation.procs import worker
from bench.plotting import pyplot, save

MODELS = {"qwen2.5-1.5b": checkpoint.QWEN25_15B, "llama-3.2-1b": checkpoint.LLAMA32_1B}
SETTINGS = ("off", "lists", "packed")
TARGET_COST = 0.05


def body(setting: str, rng: random.Random, args: argparse.Namespace) -> bytes:
    req: dict[str, Any] = {
        "input_ids": [rng.randrange(1, 500) for _ in range(args.prompt_len)],
        "sampling_params": {
            "temperature": 1.0,
            "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": True,
        },
    }
    if setting != "off":
        req["return_sampling_mask"] = True
        req["sampling_mask_format"] = setting
    return orjson.dumps(req)


async def _client(
    session: aiohttp.ClientSession, url: str, setting: str, seed: int, until: float,
    args: argparse.Namespace, out: list[int],
) -> None:  # fmt: skip
    rng = random.Random(seed)
    while time.monotonic() < until:
        async with session.post(url, data=body(setting, rng, args)) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise SystemExit(f"{setting}: HTTP {resp.status}: {raw[:500]!r}")
        out.append(len(raw))


async def run_setting(url: str, setting: str, batch: int, args: argparse.Namespace) -> dict:
    sizes: list[int] = []
    timeout = aiohttp.ClientTimeout(total=None)
    conn = aiohttp.TCPConnector(limit=batch)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        start = time.monotonic()
        until = start + args.seconds
        await asyncio.gather(
            *(_client(session, url, setting, i, until, args, sizes) for i in range(batch))
        )
        wall = time.monotonic() - start
    tokens = len(sizes) * args.max_new_tokens
    return {
        "answers": len(sizes),
        "tokens_per_s": tokens / wall,
        "bytes_per_token": sum(sizes) / tokens if tokens else 0.0,
    }


def check_answer(url: str, args: argparse.Namespace) -> None:
    """One packed answer, read whole: it holds --max-new-tokens tokens and packed masks."""

    async def one() -> Any:
        data = body("packed", random.Random(0), args)
        async with aiohttp.ClientSession() as s, s.post(url, data=data) as r:
            return await r.json()

    meta = asyncio.run(one())["meta_info"]
    assert meta["completion_tokens"] == args.max_new_tokens, meta
    assert "output_token_sampling_mask_ids" in meta


def measure_model(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One worker (`max_num_seqs` the largest batch) for every batch of this model: batch B
    is B concurrent clients."""
    if name == "smoke":
        spec, vocab = "tiny-random", None
    else:
        path = args.ckpt_dir / f"maskgate-{name}-random"
        checkpoint.write_checkpoint(path, args.device, MODELS[name])
        spec, vocab = str(path), MODELS[name]["vocab_size"]
    proc = worker(
        f"worker-{name}", model=spec, role="mixed", device=args.device, mask_impl="kernel",
        kv_memory_gb=args.kv_memory_gb, max_model_len=args.prompt_len + args.max_new_tokens + 8,
        max_num_seqs=max(args.batches), cpu_threads=None,
    ).start()  # fmt: skip
    rows = []
    try:
        proc.wait_ready(time.monotonic() + args.start_timeout_s)
        url = proc.url + "/generate"
        check_answer(url, args)
        for batch in args.batches:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
            for r in range(args.rounds):
                for setting in SETTINGS[r % 3 :] + SETTINGS[: r % 3]:
                    runs[setting].append(asyncio.run(run_setting(url, setting, batch, args)))
            rows += _rows(name, vocab, batch, runs)
    finally:
        proc.stop()
    return rows


def _rows(
    name: str, vocab: int | None, batch: int, runs: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The median round of each setting, with its cost against masks off."""
    off = statistics.median(x["tokens_per_s"] for x in runs["off"])
    rows = []
    for setting in SETTINGS:
        mid = sorted(runs[setting], key=lambda x: x["tokens_per_s"])[len(runs[setting]) // 2]
        rows.append(
            {
                "model": name, "vocab_size": vocab, "batch": batch, "setting": setting,
                **mid, "cost_vs_off": 1 - mid["tokens_per_s"] / off,
                "tokens_per_s_runs": [x["tokens_per_s"] for x in runs[setting]],
            }
        )  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'model':14} {'batch':>5} {'setting':8} {'tok/s':>9} {'B/token':>8} {'cost':>7}")
    for r in rows:
        print(
            f"{r['model']:14} {r['batch']:>5} {r['setting']:8} {r['tokens_per_s']:>9.0f} "
            f"{r['bytes_per_token']:>8.0f} {r['cost_vs_off'] * 100:>6.1f}%"
        )


def plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    groups = sorted({(r["model"], r["batch"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(SETTINGS)
    for i, setting in enumerate(SETTINGS):
        pick = [next(r for r in rows if (r["model"], r["batch"], r["setting"]) == (*g, setting))
                for g in groups]  # fmt: skip
        xs = [j + i * width for j in range(len(groups))]
        axes[0].bar(xs, [r["tokens_per_s"] for r in pick], width, label=setting)
        axes[1].bar(xs, [r["bytes_per_token"] for r in pick], width, label=setting)
    labels = [f"{m}\nB={b}" for m, b in groups]
    for ax, name in zip(axes, ("tokens/s", "answer bytes per token"), strict=True):
        ax.set_xticks([j + width for j in range(len(groups))], labels, fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, path, title, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-1.5b,llama-3.2-1b", help="or smoke (CPU)")
    ap.add_argument("--batches", default="64,128")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--kv-memory-gb", type=float, default=8.0)
    ap.add_argument("--start-timeout-s", type=float, default=900.0)
    ap.add_argument("--ckpt-dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--stem", default="worker_http", help="result file names")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    rows = [r for m in args.models.split(",") for r in measure_model(m, args)]
    print_table(rows)
    device = args.device
    if device == "cuda":
        import torch

        device = torch.cuda.get_device_name(0)
    title = (
        f"worker over HTTP on {device}: top-p {args.top_p}, {args.max_new_tokens} new tokens, "
        "masks off / lists / packed"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    doc = {"what": title, "device": device, "config": config, "target_cost": TARGET_COST,
           "rows": rows}  # fmt: skip
    (args.out / f"{args.stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(rows, title, args.out / f"{args.stem}.png")


if __name__ == "__main__":
    main()
