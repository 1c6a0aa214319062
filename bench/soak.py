"""Soak: mixed traffic at 80% of the measured maximum, with 1% of upstream answers faulted.

Set-up: the real gateway (`python -m maskgate.gateway --config FILE`) in front of two general and two
mask upstreams, each a `tests/fakes/fault_upstream.py` process. Traffic: general
chat (JSON and SSE) and mask requests (/generate JSON and SSE, chat JSON), all valid.

1. Maximum: a closed loop at --concurrency for --measure-s seconds gives a ceiling; open-loop
   steps up to it (--step-s each) find the highest rate the harness sustains, no faults.
2. Soak: an open loop at --rate-fraction of that maximum for --duration-s seconds (arrivals on
   a fixed schedule; latency runs from the scheduled time, so a stall is not hidden). Every
   upstream faults --fault-rate of its answers: half retryable (503 before the headers, a
   connection reset before any byte), half not (a 500, or the connection dropped
   mid-answer or mid-stream).

Reported: the client error rate next to the rate of non-retryable faults the upstreams
injected (they must match: retryable faults are absorbed by retries), the p99 latency of the
first and last minute, and the gateway's RSS and open fds at the start and the end.

    .venv/bin/python -m bench.soak                      # 10 minutes (plus ~1 min set-up)
    .venv/bin/python -m bench.soak --duration-s 60      # a quick look

The gateway and the fake upstream run from `git archive` of --rev (default HEAD), so edits
to the working tree during a run cannot leak into it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.plotting import pyplot, save

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_PATH = "tests/fakes/fault_upstream.py"
GATEWAY_PATHS = ("maskgate/__init__.py", "maskgate/gateway", "maskgate/protocol")
RESULTS = REPO / "bench" / "results"
RETRYABLE, NON_RETRYABLE = ("503", "reset"), ("500", "abort")
OPEN_LOOP_CONNECTIONS = 256
P99_LIMIT_S = 0.25  # "sustained": no queue builds up, p99 stays under this
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=60)  # a stuck request counts as an error

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
# (weight, path, body): ~70% general, ~30% mask; a quarter of all requests stream.
MIX: list[tuple[float, str, dict[str, Any]]] = [
    (0.50, "/v1/chat/completions", CHAT),
    (0.20, "/v1/chat/completions", {**CHAT, "stream": True}),
    (
        0.15,
        "/generate",
        {
            "text": "hi",
            "return_sampling_mask": True,
            "sampling_params": {"top_k": 8, "max_new_tokens": 8},
        },
    ),
    (
        0.05,
        "/generate",
        {
            "text": "hi",
            "return_sampling_mask": True,
            "stream": True,
            "sampling_params": {"top_p": 0.9, "max_new_tokens": 8},
        },
    ),
    (
        0.10,
        "/v1/chat/completions",
        {**CHAT, "return_sampling_mask": True, "return_meta_info": True, "top_p": 0.9},
    ),
]


def snapshot(rev: str, into: Path) -> str:
    """Export the gateway's packages (`maskgate.gateway` and the `maskgate.protocol` it
    imports) and the fake upstream at `rev` into `into`; returns the commit.

    The soak runs for minutes: it must not pick up files that change meanwhile."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", commit, *GATEWAY_PATHS, UPSTREAM_PATH],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def start_upstream(src: Path, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(src / UPSTREAM_PATH),
            "--port",
            "0",
            "--seed",
            str(seed),
            "--chunks",
            "8",
            "--keep-bodies",
            "1",
            "--fault-mix",
            ",".join(RETRYABLE + NON_RETRYABLE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().split()
    return proc, f"http://127.0.0.1:{line[1]}"


def start_gateway(
    src: Path, general: list[str], mask: list[str], workdir: Path
) -> tuple[subprocess.Popen[bytes], int]:
    import yaml

    cfg = {
        "host": "127.0.0.1",
        "port": 0,
        "log_level": "warning",
        "access_log": False,
        "timeouts": {
            "connect_s": 1.0,
            "ttfb_s": 10.0,
            "idle_s": 5.0,
            "health_interval_s": 1.0,
            "health_timeout_s": 5.0,
        },
        "pools": {"general": {"endpoints": general}, "mask": {"endpoints": mask}},
    }
    path = workdir / "soak-gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = (workdir / "soak-gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "maskgate.gateway", "--config", str(path), "--log-level", "info"],
        cwd=src,
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in (workdir / "soak-gateway.log").read_text().splitlines():
            if '"listening"' in line:
                return proc, int(json.loads(line)["port"])
        time.sleep(0.1)
    raise RuntimeError("gateway did not start")


async def one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> str:
    """'ok' or the kind of error the client saw."""
    try:
        async with session.post(url, json=body) as resp:
            data = await resp.read()
            if resp.status != 200:
                try:
                    code = json.loads(data)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = "?"
                return f"status_{resp.status}:{code}"
            if body.get("stream"):
                if b'"error"' in data:
                    return "stream_error_event"
                if not data.rstrip().endswith(b"data: [DONE]"):
                    return "stream_truncated"
            return "ok"
    except (aiohttp.ClientError, TimeoutError) as e:
        return f"client_{type(e).__name__}"


class Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[float, float, str]] = []  # (start offset s, latency s, outcome)

    def add(self, t0: float, start: float, latency: float, outcome: str) -> None:
        self.rows.append((start - t0, latency, outcome))


def pick(rng: random.Random) -> tuple[str, dict[str, Any]]:
    r = rng.random()
    for weight, path, body in MIX:
        if r < weight:
            return path, body
        r -= weight
    return MIX[-1][1], MIX[-1][2]


async def closed_loop(base: str, concurrency: int, seconds: float) -> tuple[float, dict[str, int]]:
    """Successful requests per second with `concurrency` always in flight, and failures."""
    rng = random.Random(1)
    done = 0
    failed: dict[str, int] = {}
    stop = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=CLIENT_TIMEOUT) as session:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                path, body = pick(rng)
                outcome = await one_request(session, base + path, body)
                if outcome == "ok":
                    done += 1
                else:
                    failed[outcome] = failed.get(outcome, 0) + 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - t0), failed


async def open_loop(
    base: str, rate: float, seconds: float, gw: psutil.Process, samples: list[dict[str, float]]
) -> Recorder:
    rng = random.Random(2)
    rec = Recorder()
    # A client pool of bounded size, as real clients have: when the system stalls, requests
    # wait here (their latency still runs from the scheduled time) instead of piling up
    # thousands of connections on the gateway and the upstreams.
    conn = aiohttp.TCPConnector(limit=OPEN_LOOP_CONNECTIONS)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=conn, timeout=CLIENT_TIMEOUT) as session:
        t0 = time.monotonic()

        async def fire(scheduled: float, path: str, body: dict[str, Any]) -> None:
            outcome = await one_request(session, base + path, body)
            rec.add(t0, scheduled, time.monotonic() - scheduled, outcome)

        async def sampler() -> None:
            while True:
                samples.append(resources(gw, time.monotonic() - t0))
                await asyncio.sleep(5)

        sampling = asyncio.create_task(sampler())
        n = int(rate * seconds)
        for i in range(n):
            scheduled = t0 + i / rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            path, body = pick(rng)
            task = asyncio.create_task(fire(scheduled, path, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        sampling.cancel()
    return rec


async def sustainable_rate(
    base: str, ceiling: float, seconds: float, gw: psutil.Process
) -> tuple[float, list[dict[str, float]]]:
    """The highest open-loop rate this harness keeps up with, no faults: stepped up to the
    closed-loop figure, each step must answer 97% of its requests within the step and keep
    p99 under P99_LIMIT_S. (The open loop costs the client more per request than the closed loop,
    and on a 2-core machine the client shares the CPU with the gateway and upstreams, so
    the closed-loop figure alone overstates what an open loop can sustain.)"""
    best, steps = 0.0, []
    for fraction in (0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0):
        rate = ceiling * fraction
        rec = await open_loop(base, rate, seconds, gw, [])
        on_time = sum(1 for t, lt, o in rec.rows if o == "ok" and t + lt < seconds + 1)
        p99 = percentile([lt for _, lt, _ in rec.rows], 0.99)
        steps.append(
            {
                "rate": round(rate),
                "on_time": on_time / max(len(rec.rows), 1),
                "p99_ms": round(p99 * 1e3, 1),
            }
        )
        if on_time < 0.97 * len(rec.rows) or p99 > P99_LIMIT_S:
            break
        best = rate
    if best == 0:
        raise RuntimeError(f"the open loop keeps up with no rate: {steps}")
    return best, steps


def resources(gw: psutil.Process, t: float) -> dict[str, float]:
    return {"t_s": round(t, 1), "rss_mib": gw.memory_info().rss / 2**20, "fds": gw.num_fds()}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def control(urls: list[str], **knobs: Any) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.post(u + "/_control", json=knobs) as r:
                r.raise_for_status()
        out = []
        for u in urls:
            async with s.get(u + "/_control") as r:
                out.append(await r.json())
        return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="maskgate-soak-"))
    src = workdir / "src"
    src.mkdir()
    commit = snapshot(args.rev, src)
    ups = [start_upstream(src, seed) for seed in range(4)]
    general, mask = [u for _, u in ups[:2]], [u for _, u in ups[2:]]
    gw_proc, port = start_gateway(src, general, mask, workdir)
    base = f"http://127.0.0.1:{port}"
    gw = psutil.Process(gw_proc.pid)
    try:
        await asyncio.sleep(2)  # first health checks
        await closed_loop(base, args.concurrency, 3)  # warm-up
        closed_rps, failed = await closed_loop(base, args.concurrency, args.measure_s)
        if failed:  # no faults are injected yet: any failure is the gateway's
            raise RuntimeError(f"requests failed without faults: {failed}; logs in {workdir}")
        max_rps, steps = await sustainable_rate(base, closed_rps, args.step_s, gw)
        rate = args.rate_fraction * max_rps
        print(
            f"closed loop {closed_rps:.0f} req/s; sustainable open loop {max_rps:.0f} req/s "
            f"(steps {steps}); soak at {rate:.0f} req/s for {args.duration_s:.0f} s",
            flush=True,
        )
        await control(general + mask, fault_rate=args.fault_rate, reset_counts=True)
        start = resources(gw, 0.0)
        samples: list[dict[str, float]] = []
        load0 = os.getloadavg()
        rec = await open_loop(base, rate, args.duration_s, gw, samples)
        await asyncio.sleep(2)  # let pooled connections settle
        end = resources(gw, args.duration_s)
        stats = await control(general + mask, fault_rate=0.0)
        async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
            metrics = await r.text()
        result = summarize(args, max_rps, rate, rec, stats, start, end, samples, load0, metrics)
        return {
            **result,
            "commit": commit,
            "closed_loop_rps": round(closed_rps, 1),
            "rate_steps": steps,
        }
    finally:
        gw_proc.terminate()
        gw_proc.wait(timeout=30)
        for proc, _ in ups:
            proc.kill()
            proc.wait()


def summarize(
    args: argparse.Namespace,
    max_rps: float,
    rate: float,
    rec: Recorder,
    stats: list[dict[str, Any]],
    start: dict[str, float],
    end: dict[str, float],
    samples: list[dict[str, float]],
    load0: tuple[float, float, float],
    metrics: str,
) -> dict[str, Any]:
    total = len(rec.rows)
    errors: dict[str, int] = {}
    for _, _, outcome in rec.rows:
        if outcome != "ok":
            errors[outcome] = errors.get(outcome, 0) + 1
    faults: dict[str, int] = {}
    upstream_requests = 0
    for st in stats:
        upstream_requests += st["counts"].get("requests", 0)
        for k, v in st["counts"].items():
            if k.startswith("fault_"):
                faults[k[6:]] = faults.get(k[6:], 0) + v
    non_retryable = sum(faults.get(k, 0) for k in NON_RETRYABLE)
    minutes: list[dict[str, float]] = []
    for m in range(int(args.duration_s // 60) or 1):
        lat = [lt for t, lt, _ in rec.rows if m * 60 <= t < (m + 1) * 60]
        # Answers that ended within the minute: what the system really got through.
        ended = sum(1 for t, lt, _ in rec.rows if m * 60 <= t + lt < (m + 1) * 60)
        minutes.append(
            {
                "minute": m,
                "requests": len(lat),
                "p50_ms": percentile(lat, 0.5) * 1e3,
                "p99_ms": percentile(lat, 0.99) * 1e3,
                "completed_rps": ended / 60,
            }
        )
    retries = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("maskgate_retries_total")
    )
    return {
        "duration_s": args.duration_s,
        "fault_rate": args.fault_rate,
        "max_rps": round(max_rps, 1),
        "target_rps": round(rate, 1),
        "achieved_rps": round(total / args.duration_s, 1),
        "requests": total,
        "client_errors": sum(errors.values()),
        "errors_by_kind": errors,
        "client_error_rate": sum(errors.values()) / max(total, 1),
        "upstream_requests": upstream_requests,
        "faults_injected": faults,
        "non_retryable_faults": non_retryable,
        "non_retryable_fault_rate": non_retryable / max(total, 1),
        "gateway_retries": retries,
        "p99_first_minute_ms": minutes[0]["p99_ms"],
        "p99_last_minute_ms": minutes[-1]["p99_ms"],
        "p99_drift": minutes[-1]["p99_ms"] / minutes[0]["p99_ms"],
        "per_minute": minutes,
        "rss_mib_start": round(start["rss_mib"], 1),
        "rss_mib_end": round(end["rss_mib"], 1),
        "fds_start": start["fds"],
        "fds_end": end["fds"],
        "resources": samples,
        "loadavg_at_start": load0,
        "loadavg_at_end": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    m = result["per_minute"]
    ax1.plot([r["minute"] for r in m], [r["p99_ms"] for r in m], marker="o", label="p99")
    ax1.plot([r["minute"] for r in m], [r["p50_ms"] for r in m], marker="o", label="p50")
    ax1.set(
        xlabel="minute",
        ylabel="latency (ms)",
        title=f"soak at {result['target_rps']:.0f} req/s, {result['fault_rate']:.0%} faults",
    )
    ax1.set_yscale("log")
    ax1.legend()
    res = result["resources"]
    ax2.plot([r["t_s"] for r in res], [r["rss_mib"] for r in res], label="RSS (MiB)")
    ax2.set(xlabel="s", ylabel="RSS (MiB)", title="gateway RSS and open fds")
    ax3 = ax2.twinx()
    ax3.plot([r["t_s"] for r in res], [r["fds"] for r in res], color="tab:red", label="fds")
    ax3.set_ylabel("open fds")
    save(fig, path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--measure-s", type=float, default=20.0, help="closed-loop measurement")
    p.add_argument("--step-s", type=float, default=10.0, help="each open-loop rate step")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rate-fraction", type=float, default=0.8)
    p.add_argument("--fault-rate", type=float, default=0.01)
    p.add_argument("--out", default="soak", help="result file stem under bench/results/")
    p.add_argument("--rev", default="HEAD", help="git revision of the gateway to soak")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / f"{args.out}.png")
    rows = [
        ("max sustainable rate (req/s)", f"{result['max_rps']:.0f}"),
        ("soak rate (req/s)", f"{result['target_rps']:.0f} (achieved {result['achieved_rps']})"),
        ("requests", result["requests"]),
        ("client error rate", f"{result['client_error_rate']:.4%} ({result['client_errors']})"),
        (
            "non-retryable fault rate",
            f"{result['non_retryable_fault_rate']:.4%} ({result['non_retryable_faults']})",
        ),
        ("faults injected", result["faults_injected"]),
        ("gateway retries", int(result["gateway_retries"])),
        (
            "p99 first / last minute (ms)",
            f"{result['p99_first_minute_ms']:.1f} / {result['p99_last_minute_ms']:.1f}",
        ),
        ("RSS start / end (MiB)", f"{result['rss_mib_start']} / {result['rss_mib_end']}"),
        ("open fds start / end", f"{result['fds_start']} / {result['fds_end']}"),
    ]
    for k, v in rows:
        print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
