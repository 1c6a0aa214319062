"""How long one request holds the gateway's event loop in the policy path.

Two measurements per body, at the limits: `max_body_bytes` (8 MiB by default) and
`max_batch_items` (4096) prompts, plus the 2.8M-item batch that used to stall the loop for
15 s (now refused by the item cap).

- inline: the cost of each stage if done on the loop, exactly as the policy path calls it:
  Content-Encoding decoding, rule 1 (`parse_body`), the mask check (`check_mask_request`)
  and the re-serialisation of a mask body;
- loop block: the longest the loop actually stalls while the gateway's `BodyChecker` (default
  offload settings: bodies over 1 MiB and mask batches over 256 prompts go to a worker
  process) checks the body, measured by a 1 ms ticker on the loop.

    python -m bench.gateway_policy_cost [--repeats 5] [--out bench/results]

Prints a table (milliseconds: best of the repeats, and the median) and writes
gateway_policy_cost.json and gateway_policy_cost.png under --out. The target is that no
request blocks the loop for more than about 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.plotting import pyplot, save
from maskgate.gateway.config import OffloadConfig
from maskgate.gateway.proxy.bodycheck import BodyChecker, BodyJob
from maskgate.gateway.proxy.encoding import codings, decode_body
from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import (
    PolicyConfig,
    Route,
    check_mask_request,
    is_mask_request,
    parse_body,
)

LIMIT = 8 * 1024 * 1024  # max_body_bytes default
CAP = PolicyConfig().max_batch_items  # the default, 4096
TARGET_MS = 50.0
CFG = PolicyConfig(max_batch_items=CAP, max_mask_ids_per_request=2**62)
SP = {"top_k": 20, "top_p": 0.95, "temperature": 1.0, "max_new_tokens": 64}


def _fill(make: Callable[[int], dict[str, Any]], lo: int = 1, limit: int = LIMIT) -> bytes:
    """The largest body `make(n)` within `limit` (n found by bisection)."""
    hi = lo
    while len(orjson.dumps(make(hi * 2))) <= limit:
        hi *= 2
    lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(orjson.dumps(make(mid))) <= limit:
            lo = mid
        else:
            hi = mid
    return orjson.dumps(make(lo))


def cases() -> list[tuple[str, Route, bytes, str | None]]:
    """(name, route, body, Content-Encoding or None)."""
    prompt = "tok " * 450  # 1.8 KB per prompt: 4096 of them fit in 8 MiB
    chat_text = _fill(
        lambda n: {"model": "m", "messages": [{"role": "user", "content": "x" * n}]}, 1024
    )
    ids = _fill(lambda n: {"input_ids": [12345] * n, "sampling_params": SP}, 1024)
    # The largest body the default offload settings leave on the loop.
    ids_1mib = _fill(lambda n: {"input_ids": [12345] * n, "sampling_params": SP}, 1024, 1 << 20)
    per_item_256 = orjson.dumps(
        {
            "text": ["a"] * 256,
            "return_sampling_mask": True,
            "sampling_params": [dict(SP, top_k=1 + i % 50) for i in range(256)],
        }
    )
    tiny_batch = _fill(lambda n: {"text": [""] * n, "sampling_params": SP}, 1024)
    tiny_mask = _fill(
        lambda n: {"text": [""] * n, "return_sampling_mask": True, "sampling_params": SP}, 1024
    )
    shared = orjson.dumps(
        {"text": [prompt] * CAP, "return_sampling_mask": True, "sampling_params": SP}
    )
    per_item = orjson.dumps(
        {
            "text": [prompt] * CAP,
            "return_sampling_mask": [i % 2 == 0 for i in range(CAP)],
            "sampling_params": [dict(SP, top_k=1 + i % 50) for i in range(CAP)],
        }
    )
    ids_items = _fill(
        lambda n: {
            "input_ids": [[12345] * n for _ in range(CAP)],
            "return_sampling_mask": True,
            "sampling_params": [dict(SP) for _ in range(CAP)],
        }
    )
    completions = orjson.dumps(
        {
            "model": "m",
            "prompt": [prompt] * CAP,
            "return_sampling_mask": True,
            "return_meta_info": True,
            "top_k": 20,
            "max_tokens": 64,
        }
    )
    return [
        ("general chat, one 8 MiB string", Route.CHAT, chat_text, None),
        ("general /generate, 8 MiB of token ids", Route.GENERATE, ids, None),
        ("general /generate, 1 MiB of token ids (on the loop)", Route.GENERATE, ids_1mib, None),
        ("mask /generate, 256 per-item params (on the loop)", Route.GENERATE, per_item_256, None),
        ("general /generate, 8 MiB batch of empty texts", Route.GENERATE, tiny_batch, None),
        ("mask /generate, same batch (refused: item cap)", Route.GENERATE, tiny_mask, None),
        (f"mask /generate, {CAP} x 1.8 KB, shared params", Route.GENERATE, shared, None),
        (f"mask /generate, {CAP} x 1.8 KB, per-item params", Route.GENERATE, per_item, None),
        (f"mask /generate, {CAP} items, 8 MiB of ids", Route.GENERATE, ids_items, None),
        (f"mask completions, {CAP} prompts", Route.COMPLETIONS, completions, None),
        (f"mask /generate, {CAP} x 1.8 KB, gzip", Route.GENERATE, gzip.compress(shared), "gzip"),
    ]


def run_once(route: Route, raw: bytes, encoding: str | None) -> dict[str, float]:
    """The proxy's stages for one body; seconds per stage."""
    t = {"decode": 0.0, "parse": 0.0, "check": 0.0, "serialise": 0.0}
    t0 = time.perf_counter()
    if encoding is not None:
        raw = decode_body(raw, codings([encoding]), LIMIT)
    t1 = time.perf_counter()
    body = parse_body(raw, LIMIT)
    t2 = time.perf_counter()
    t["decode"], t["parse"] = t1 - t0, t2 - t1
    if not is_mask_request(route, body):
        return t
    try:
        out = check_mask_request(route, body, CFG, vocab_size=151936)
    except PolicyError:
        t["check"] = time.perf_counter() - t2
        return t
    t3 = time.perf_counter()
    if route is Route.GENERATE and "rid" not in out:
        out["rid"] = "0123456789abcdef0123456789abcdef"
    orjson.dumps(out)
    t["check"], t["serialise"] = t3 - t2, time.perf_counter() - t3
    return t


async def loop_block(checker: BodyChecker, route: Route, raw: bytes, enc: str | None) -> float:
    """Seconds of the longest stall of a 1 ms ticker while the gateway checks `raw` (its
    Content-Encoding decoded on the loop, as the proxy does, then `BodyChecker.check`)."""
    done = asyncio.Event()
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last - 0.001)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    if enc is not None:
        raw = decode_body(raw, codings([enc]), LIMIT)
    job = BodyJob(route, LIMIT, CFG, 151936, "0123456789abcdef0123456789abcdef", None, None)
    with contextlib.suppress(PolicyError):  # rule 1 raises; the stall is what counts
        await checker.check(job, raw)
    await asyncio.sleep(0.01)
    done.set()
    await task
    return worst


async def measure_blocks(
    all_cases: list[tuple[str, Route, bytes, str | None]], repeats: int
) -> list[list[float]]:
    checker = BodyChecker(OffloadConfig())
    try:
        await loop_block(checker, Route.GENERATE, b'{"text":["a"]}' + b" " * LIMIT, None)  # warm
        return [
            [await loop_block(checker, route, raw, enc) for _ in range(repeats)]
            for _, route, raw, enc in all_cases
        ]
    finally:
        checker.close()


def measure(repeats: int) -> list[dict[str, Any]]:
    rows = []
    all_cases = cases()
    blocks = asyncio.run(measure_blocks(all_cases, repeats))
    for (name, route, raw, encoding), block in zip(all_cases, blocks, strict=True):
        runs = [run_once(route, raw, encoding) for _ in range(repeats)]
        totals = [sum(r.values()) for r in runs]
        best = runs[totals.index(min(totals))]
        rows.append(
            {
                "case": name,
                "bytes": len(raw),
                "stages_ms": {k: round(v * 1e3, 3) for k, v in best.items()},
                "total_ms_best": round(min(totals) * 1e3, 3),
                "total_ms_median": round(statistics.median(totals) * 1e3, 3),
                "loop_block_ms_best": round(min(block) * 1e3, 3),
                "loop_block_ms_median": round(statistics.median(block) * 1e3, 3),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'case':<50} {'MiB':>5} {'decode':>7} {'parse':>7} {'check':>7} {'dumps':>7}"
    print(head + f" {'inline':>7} {'median':>7} | {'block':>7} {'median':>7}")
    for r in rows:
        s = r["stages_ms"]
        print(
            f"{r['case']:<50} {r['bytes'] / 2**20:5.2f} {s['decode']:7.2f} {s['parse']:7.2f} "
            f"{s['check']:7.2f} {s['serialise']:7.2f} {r['total_ms_best']:7.2f} "
            f"{r['total_ms_median']:7.2f} | {r['loop_block_ms_best']:7.2f} "
            f"{r['loop_block_ms_median']:7.2f}"
        )
    print(
        "(milliseconds; inline: the stages if run on the loop, best of the repeats; block: the "
        f"longest loop stall with the gateway's offload; target <= {TARGET_MS:g} ms)"
    )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.5))
    names = [r["case"] for r in rows][::-1]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for stage in ("decode", "parse", "check", "serialise"):
        widths = [r["stages_ms"][stage] for r in rows][::-1]
        ax.barh([v + 0.2 for v in y], widths, height=0.4, left=left, label=f"inline: {stage}")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    blocks = [r["loop_block_ms_median"] for r in rows][::-1]
    ax.barh([v - 0.2 for v in y], blocks, height=0.4, color="black", label="loop block (median)")
    ax.set_yticks(y, names)
    ax.axvline(TARGET_MS, color="red", linestyle="--", label=f"{TARGET_MS:g} ms target")
    ax.set_xlabel("ms (inline stages: best of repeats)")
    ax.set_title("Gateway policy path: cost of one request at the body and item limits")
    ax.legend(loc="lower right")
    save(fig, path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    rows = measure(args.repeats)
    print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "what": "event-loop time per request in the gateway policy path",
        "limits": {"max_body_bytes": LIMIT, "max_batch_items": CAP},
        "target_ms": TARGET_MS,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "repeats": args.repeats,
        "rows": rows,
    }
    (args.out / "gateway_policy_cost.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(rows, args.out / "gateway_policy_cost.png")


if __name__ == "__main__":
    main()
