"""Driving a target with wrk and accounting for where the CPU went during the run.

On a 2-core machine shared with other work, a number is only as good as the run it came
from: each measurement records the CPU seconds spent by wrk, nginx, the proxy and, by
difference from the system-wide total, by everything else ("foreign"), so a run that was
disturbed by other processes shows it.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil

from bench.gateway.cases import CASES, Case
from bench.gateway.procs import taskset

LUA = Path(__file__).with_name("post_body.lua")
_TMP = Path(tempfile.gettempdir())  # where the request body files go by default


@dataclass(frozen=True)
class Load:
    cpus: str  # wrk's core(s)
    threads: int = 1  # wrk threads; one keeps the load generator identical across set-ups
    timeout_s: int = 5


def _proc_cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def run_wrk(
    load: Load,
    url: str,
    concurrency: int,
    duration_s: float,
    upstream: list[psutil.Process],
    proxy: list[psutil.Process],
    case: Case = CASES["chat"],
    body_dir: Path = _TMP,
) -> dict[str, object]:
    """One wrk run POSTing `case` to {url}{case.path}; returns throughput, latency and CPU use."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    argv = [
        *taskset(load.cpus), "wrk",
        "-t", str(min(load.threads, concurrency)),
        "-c", str(concurrency),
        "-d", f"{duration_s:g}s",
        "--timeout", f"{load.timeout_s}s",
        "-s", str(LUA),
        url + case.path,
    ]  # fmt: skip
    env = {**os.environ, "BENCH_BODY_FILE": str(case.write(body_dir))}
    wrk0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, up0, px0 = _busy_s(), _proc_cpu_s(upstream), _proc_cpu_s(proxy)
    out = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    busy1, up1, px1 = _busy_s(), _proc_cpu_s(upstream), _proc_cpu_s(proxy)
    wrk1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRK_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    raw = orjson.loads(line.removeprefix("WRK_JSON "))
    seconds = raw["duration_us"] / 1e6
    errors = sum(raw["errors"].values())
    wrk_cpu = (wrk1.ru_utime + wrk1.ru_stime) - (wrk0.ru_utime + wrk0.ru_stime)
    busy, up, px = busy1 - busy0, up1 - up0, px1 - px0
    lat = raw["latency_us"]
    return {
        "case": case.name,
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "requests": raw["requests"],
        "errors": errors,
        "error_detail": raw["errors"],
        "rps": round(raw["requests"] / seconds, 1),
        "p50_ms": lat["p50"] / 1000,
        "p90_ms": lat["p90"] / 1000,
        "p99_ms": lat["p99"] / 1000,
        "p999_ms": lat["p999"] / 1000,
        "mean_ms": round(lat["mean"] / 1000, 4),
        # CPU seconds per wall second (1.0 = one core busy for the whole run).
        "cpu_wrk": round(wrk_cpu / seconds, 3),
        "cpu_upstream": round(up / seconds, 3),
        "cpu_proxy": round(px / seconds, 3),
        "cpu_foreign": round(max(0.0, busy - wrk_cpu - up - px) / seconds, 3),
    }
