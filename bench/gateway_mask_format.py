"""The gateway's mask path with `lists` vs `packed` answers, on the CPU.

Every answer is a `/generate` mask answer of 64 tokens with 100-id masks (a top-p 0.9 mask at
a 152k vocabulary), from a fixed-response upstream that answers packed when the request asks
`sampling_mask_format: "packed"` (as a maskgate worker does) and lists otherwise. Three
processes: the upstream (a bare asyncio server sending canned bytes), the gateway
(`python -m maskgate.gateway --workers 1`) and the load generator (keep-alive asyncio
connections). Each round measures, for both formats, the upstream directly and through the
gateway, at concurrency 1 (latency: the gateway's added p50 is its p50 minus the direct p50)
and at `--concurrency` (requests/s); medians over the rounds are kept. Also the in-process
cost of the answer check alone (`maskcheck.finish_mask_response`, microseconds per answer).

    python -m bench.gateway_mask_format [--seconds 4] [--rounds 3] [--concurrency 16]

The gateway's CPU time (user + system) over each run, divided by the requests it answered,
gives its requests/s per core: on a machine shared with other work, the wall-clock rate moves
with the neighbours, its CPU time per request far less.

Prints a table and writes gateway_mask_format.json and gateway_mask_format.png under --out.
The target: packed answers at least 1.5x the requests/s of lists per gateway core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson

from bench.gateway import procs
from bench.gateway.machine import versions
from bench.plotting import pyplot, save
from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.proxy import packed as packing
from maskgate.gateway.proxy.maskcheck import finish_mask_response

TOKENS, IDS_PER_TOKEN, VOCAB = 64, 100, 151_936
TARGET = 1.5
FORMATS = ("lists", "packed")


def answers() -> dict[str, bytes]:
    """The canned answer bodies, by format."""
    rng = random.Random(0)
    masks = [rng.sample(range(VOCAB), IDS_PER_TOKEN) for _ in range(TOKENS)]
    meta: dict[str, Any] = {
        "id": "bench",
        "finish_reason": {"type": "length", "length": TOKENS},
        "prompt_tokens": 32,
        "completion_tokens": TOKENS,
        "output_token_sampling_mask": masks,
        "output_token_sampling_logprobs": [-1.25] * TOKENS,
        "output_token_sampling_mask_length": TOKENS,
    }
    answer = {"text": "y" * TOKENS, "output_ids": [m[0] for m in masks], "meta_info": meta}
    lists = orjson.dumps(answer)
    packing.to_packed(meta)
    return {"lists": lists, "packed": orjson.dumps(answer)}


def request(fmt: str) -> bytes:
    body = orjson.dumps(
        {
            "text": "The capital of France is",
            "sampling_params": {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": TOKENS},
            "return_sampling_mask": True,
            "sampling_mask_format": fmt,
        }
    )
    head = (
        "POST /generate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


class _Upstream(asyncio.Protocol):
    """Keep-alive HTTP/1.1: canned answers, parsed only as far as choosing one needs."""

    canned: ClassVar[dict[str, bytes]] = {}

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].decode("latin-1").lower()
            size = 0
            for line in head.split("\r\n")[1:]:
                if line.startswith("content-length:"):
                    size = int(line.split(":", 1)[1])
            if len(self.buf) < end + 4 + size:
                return
            body = self.buf[end + 4 : end + 4 + size]
            self.buf = self.buf[end + 4 + size :]
            self.transport.write(self.canned[_choose(head, body)])


def _choose(head: str, body: bytes) -> str:
    if head.startswith("get /get_model_info"):
        return "info"
    if head.startswith("get "):
        return "ok"
    if head.startswith("post /generate"):
        return "packed" if b'"packed"' in body else "lists"
    return "chat"


def serve_upstream(port: int) -> None:
    bodies = answers()
    _Upstream.canned = {name: _response(b) for name, b in bodies.items()}
    _Upstream.canned["info"] = _response(orjson.dumps({"vocab_size": VOCAB}))
    _Upstream.canned["ok"] = _response(b"")
    _Upstream.canned["chat"] = _response(b'{"choices": []}')

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Upstream, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


async def _connection(
    port: int, req: bytes, until: float, warm_until: float, lat: list[float], done: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while (t0 := time.perf_counter()) < until:
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            size = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    size = int(line.split(b":", 1)[1])
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            await reader.readexactly(size)
            done[0] += 1
            if t0 >= warm_until:
                lat.append(time.perf_counter() - t0)
    finally:
        writer.close()


def load(port: int, fmt: str, concurrency: int, seconds: float) -> dict[str, float]:
    """One measurement in this (load-generator) process."""

    done = [0]  # every answer, warm-up included (the gateway's CPU time covers them all)

    async def main() -> list[float]:
        lat: list[float] = []
        start = time.perf_counter()
        warm, until = start + 0.5, start + 0.5 + seconds
        req = request(fmt)
        await asyncio.gather(
            *(_connection(port, req, until, warm, lat, done) for _ in range(concurrency))
        )
        return lat

    lat = sorted(asyncio.run(main()))
    return {
        "requests": done[0],
        "rps": len(lat) / seconds,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
    }


def check_cost_us(repeats: int = 300) -> dict[str, float]:
    """In-process: microseconds per answer of the gateway's mask check, by format."""
    bodies = answers()
    metrics = GatewayMetrics()
    out = {}
    for fmt in FORMATS:
        want = (fmt == "packed",)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            finish_mask_response("generate", bodies[fmt], "mask", metrics, want, VOCAB)
            times.append(time.perf_counter() - t0)
        out[fmt] = statistics.median(times) * 1e6
    return out


def _cpu_s(gw: procs.Proxy) -> float:
    """CPU seconds (user + system) of the gateway's process tree so far."""
    return sum(sum(p.cpu_times()[:2]) for p in gw.processes())


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    port = procs.free_port()
    upstream = ctx.Process(target=serve_upstream, args=(port,), daemon=True)
    upstream.start()
    url = f"http://127.0.0.1:{port}"
    gw = procs.gateway(url, args.cpus, workers=1, access_log=False).start()
    targets = {"direct": port, "gateway": gw.port}
    rows: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    try:
        with ctx.Pool(1) as pool:
            for _ in range(args.rounds):
                for fmt in FORMATS:
                    for target, p in targets.items():
                        for c in (1, args.concurrency):
                            cpu0 = _cpu_s(gw) if target == "gateway" else 0.0
                            r = pool.apply(load, (p, fmt, c, args.seconds))
                            if target == "gateway":
                                r["cpu_us"] = (_cpu_s(gw) - cpu0) / r["requests"] * 1e6
                            rows.setdefault((target, fmt, c), []).append(r)
    finally:
        gw.stop()
        upstream.terminate()
    out = []
    for (target, fmt, c), runs in rows.items():
        best = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
        out.append(
            {
                "target": target,
                "format": fmt,
                "concurrency": c,
                **best,
                "rps_all": [r["rps"] for r in runs],
                "cpu_us_all": [r["cpu_us"] for r in runs if "cpu_us" in r],
            }
        )
    return out


def summarise(rows: list[dict[str, Any]], c: int, cost: dict[str, float]) -> dict[str, Any]:
    def get(target: str, fmt: str, conc: int, key: str) -> float:
        row = next(
            r for r in rows if (r["target"], r["format"], r["concurrency"]) == (target, fmt, conc)
        )
        return float(row[key])

    summary: dict[str, Any] = {"check_us_per_answer": cost}
    for fmt in FORMATS:
        summary[fmt] = {
            "gateway_rps": get("gateway", fmt, c, "rps"),
            "direct_rps": get("direct", fmt, c, "rps"),
            "added_p50_ms": get("gateway", fmt, 1, "p50_ms") - get("direct", fmt, 1, "p50_ms"),
            "answer_bytes": len(answers()[fmt]),
        }

    # The ratio of each round (both formats measured back to back), then the median: the
    # machine's drift between rounds cancels out.
    def runs(fmt: str, key: str) -> list[float]:
        return next(
            r[key]
            for r in rows
            if (r["target"], r["format"], r["concurrency"]) == ("gateway", fmt, c)
        )

    ratios = [
        p / q for p, q in zip(runs("packed", "rps_all"), runs("lists", "rps_all"), strict=True)
    ]
    summary["packed_over_lists_rps_rounds"] = ratios
    summary["packed_over_lists_rps"] = statistics.median(ratios)
    # The gateway's CPU time per request: its requests/s per core, which other load on a
    # shared machine moves far less than the wall-clock rate.
    for fmt in FORMATS:
        cpu = statistics.median(runs(fmt, "cpu_us_all"))
        summary[fmt] |= {"cpu_us_per_request": cpu, "rps_per_core": 1e6 / cpu}
    summary["packed_over_lists_rps_per_core"] = (
        summary["packed"]["rps_per_core"] / summary["lists"]["rps_per_core"]
    )
    summary["target_met"] = summary["packed_over_lists_rps_per_core"] >= TARGET
    return summary


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"{'target':8} {'format':7} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["target"], r["format"])):
        print(
            f"{r['target']:8} {r['format']:7} {r['concurrency']:>4} {r['rps']:>8.0f} "
            f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}"
        )
    for fmt in FORMATS:
        s = summary[fmt]
        print(
            f"{fmt}: gateway {s['gateway_rps']:.0f} req/s ({s['rps_per_core']:.0f} per core, "
            f"{s['cpu_us_per_request']:.0f} us CPU each), added p50 {s['added_p50_ms']:.2f} ms, "
            f"answer {s['answer_bytes']} B, check {summary['check_us_per_answer'][fmt]:.0f} us"
        )
    print(f"packed / lists req/s per core: {summary['packed_over_lists_rps_per_core']:.2f}x")
    met = "met" if summary["target_met"] else "NOT met"
    rounds = ", ".join(f"{r:.2f}" for r in summary["packed_over_lists_rps_rounds"])
    print(
        f"packed / lists req/s: {summary['packed_over_lists_rps']:.2f}x, median of the rounds "
        f"({rounds}) ({met}, {TARGET}x)"
    )


def plot(summary: dict[str, Any], title: str, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    panels = (
        ("rps_per_core", "requests/s per gateway core (CPU time)"),
        ("added_p50_ms", "added p50 (ms, concurrency 1)"),
    )
    for ax, (key, label) in zip(axes, panels, strict=False):
        ax.bar(FORMATS, [summary[f][key] for f in FORMATS], color=["tab:gray", "tab:blue"])
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    cost = summary["check_us_per_answer"]
    axes[2].bar(FORMATS, [cost[f] for f in FORMATS], color=["tab:gray", "tab:blue"])
    axes[2].set_title("answer check (us per answer, in-process)", fontsize=9)
    axes[2].grid(axis="y", alpha=0.3)
    save(fig, path, title, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--cpus", default="0,1", help="taskset CPUs for the gateway")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    cost = check_cost_us()
    rows = measure(args)
    summary = summarise(rows, args.concurrency, cost)
    print_table(rows, summary)
    title = (
        f"gateway mask path: /generate answers of {TOKENS} tokens x {IDS_PER_TOKEN} ids, "
        f"lists vs packed (c={args.concurrency}, {platform.machine()}, "
        f"{multiprocessing.cpu_count()} CPUs)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "what": title,
        "config": vars(args) | {"out": str(args.out)},
        "versions": versions(),
        "target_packed_over_lists": TARGET,
        "summary": summary,
        "rows": rows,
    }
    (args.out / "gateway_mask_format.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(summary, title, args.out / "gateway_mask_format.png")


if __name__ == "__main__":
    main()
