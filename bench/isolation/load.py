"""Closed-loop streaming clients for the isolation benchmark.

Each client sends one streaming `/generate` request (input_ids, ignore_eos, incremental
output), reads it to the end, and sends the next, until the run ends. Clients are spread over
several processes (`run_clients` is the per-process entry) so that parsing a few thousand SSE
chunks per second never makes the client the bottleneck that TPOT would then measure.

Times are `time.monotonic()` seconds, system-wide on Linux, so the processes' records share
one clock with the parent that cuts the measurement window.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Traffic:
    """One stream of requests: `clients` closed-loop clients sending the same kind of body."""

    kind: str  # "general" or "mask"
    clients: int
    prompt_len: int
    max_new_tokens: int
    top_p: float
    want_mask: bool
    prompt_vocab: int  # prompt ids are drawn from [3, prompt_vocab)


@dataclass
class Record:
    """One finished (or cut) request: its send time and the arrival time of each token."""

    kind: str
    sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, new tokens)
    mask_ids: int = 0  # sum of mask lengths over its tokens (mask traffic)
    mask_tokens: int = 0  # tokens that carried a mask
    truncated: int = 0  # bounded-mode steps whose mask was cut at the cap
    error: str | None = None


def body(traffic: Traffic, rng: random.Random) -> dict[str, Any]:
    ids = [rng.randrange(3, traffic.prompt_vocab) for _ in range(traffic.prompt_len)]
    params: dict[str, Any] = {
        "temperature": 1.0,
        "top_p": traffic.top_p,
        "max_new_tokens": traffic.max_new_tokens,
        "ignore_eos": True,
    }
    out: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": params,
        "stream": True,
        "incremental_streaming_output": True,
    }
    if traffic.want_mask:
        # bounded: a rare step past the cap is flagged, not failed, so throughput stays steady.
        out.update(return_sampling_mask=True, sampling_mask_mode="bounded")
    return out


async def one_request(
    session: aiohttp.ClientSession, url: str, traffic: Traffic, rng: random.Random, rec: Record
) -> None:
    """Fills `rec` as chunks arrive, so a request cut at the end keeps what it got."""
    try:
        async with session.post(url + "/generate", json=body(traffic, rng)) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.monotonic()
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                    return
                n = len(chunk.get("output_ids", []))
                if n:
                    rec.chunks.append((now, n))
                meta = chunk.get("meta_info", {})
                for mask in meta.get("output_token_sampling_mask", []):
                    rec.mask_ids += len(mask)
                    rec.mask_tokens += 1
                rec.truncated += sum(meta.get("output_token_sampling_mask_truncated", []))
    except (TimeoutError, aiohttp.ClientError) as e:
        rec.error = f"{type(e).__name__}: {e}"


async def client_loop(url: str, traffic: Traffic, seed: int, end: float, out: list[Record]) -> None:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < end:
            rec = Record(traffic.kind, time.monotonic())
            out.append(rec)
            await one_request(session, url, traffic, rng, rec)


async def _run(url: str, traffics: list[Traffic], seed: int, start: float, end: float) -> list:
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    records: list[Record] = []
    tasks = []
    for t_i, traffic in enumerate(traffics):
        for c in range(traffic.clients):
            s = seed * 1_000_003 + t_i * 1000 + c
            tasks.append(asyncio.create_task(client_loop(url, traffic, s, end, records)))
    # A request still streaming at `end` is cut: its tokens up to then are recorded.
    _done, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.monotonic()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [asdict(r) for r in records]


def run_clients(
    url: str, traffics: list[Traffic], seed: int, start: float, end: float
) -> list[dict[str, Any]]:
    """Process entry: run the clients from `start` to `end` (monotonic s); the records."""
    return asyncio.run(_run(url, traffics, seed, start, end))
