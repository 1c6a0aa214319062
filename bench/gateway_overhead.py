"""Gateway overhead: nginx direct vs the maskgate gateway vs sglang-router, driven by wrk.

All set-ups sit in front of the same fixed-response nginx (bench/gateway/nginx.conf.template)
and get the same load: wrk, one thread, POSTing a small non-mask chat completion at each
concurrency after a warm-up. Two core layouts on a 2-core machine, identical across the
set-ups that are compared with each other:

  split   wrk + nginx on cpu 0, the proxy alone on cpu 1. The single-process gateway is
          compared with sglang-router restricted to one core (its tokio runtime then runs one
          worker thread), and both with nginx direct (cpu 1 idle).
  shared  wrk, nginx and the proxy all on cpus 0-1, scheduled by the kernel. `--workers 2`
          is compared with sglang-router free to use both cores.

Then an RSS run: the single-process gateway (split layout) under load for --rss-seconds,
sampled once a second. Optionally a py-spy profile of the gateway under load.

    .venv/bin/python -m bench.gateway_overhead --profile-seconds 15  # everything (~13 min)
    .venv/bin/python -m bench.gateway_overhead --rss-seconds 0       # skip the RSS run
    .venv/bin/python -m bench.gateway_overhead --setups direct,router --rss-seconds 0

Needs nginx and wrk (apt-get install -y nginx wrk) and, for the router set-up,
`pip install sglang-router`; py-spy for --profile-seconds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.gateway import procs, report
from bench.gateway.load import Load, run_wrk
from bench.gateway.machine import set_priority, versions
from bench.gateway.rss import RssSampler, tree_rss_mib
from bench.gateway.upstream import Nginx

# layout -> (cpus for wrk and nginx, cpus for the proxy)
LAYOUTS = {"split": ("0", "1"), "shared": ("0,1", "0,1")}
# (set-up, layout) in run order; direct runs in both layouts so each comparison has a baseline.
PLAN = [
    ("direct", "split"),
    ("gateway-w1", "split"),
    ("router", "split"),
    ("direct", "shared"),
    ("gateway-w1", "shared"),
    ("gateway-w2", "shared"),
    ("router", "shared"),
]
# Not run unless named in --setups: bare aiohttp processes that show the gateway's floor.
FLOORS = [(f"aiohttp-{m}", "split") for m in ("answer", "proxy", "lean")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated wrk connection counts")
    # Whole seconds throughout: wrk takes no fractions.
    p.add_argument("--seconds", type=int, default=5, help="seconds per measured wrk run")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="measured runs per point; the median by req/s is kept (all are recorded)",
    )
    p.add_argument(
        "--warmup", type=int, default=3, help="discarded seconds before each measurement"
    )
    p.add_argument(
        "--setups", default=",".join(sorted({s for s, _ in PLAN})), help="subset of set-ups to run"
    )
    p.add_argument("--layouts", default="split,shared", help="subset of core layouts to run")
    p.add_argument(
        "--rss-seconds", type=int, default=300, help="gateway RSS run length; 0 skips it"
    )
    p.add_argument("--rss-concurrency", type=int, default=64)
    p.add_argument(
        "--profile-seconds", type=int, default=0, help="py-spy the gateway under load; 0 skips"
    )
    p.add_argument("--profile-concurrency", type=int, default=64)
    p.add_argument(
        "--access-log",
        action="store_true",
        help="per-request logs on in both proxies (gateway default, router --log-level info); "
        "off by default in both (gateway --no-access-log, router --log-level warn)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=-15,
        help="niceness for the bench and everything it starts (inherited); negative values "
        "keep other work on the machine from skewing the numbers (needs root)",
    )
    p.add_argument(
        "--gateway-root",
        type=Path,
        default=procs.REPO,
        help="run the gateway from this checkout (to compare versions); default this one",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--stem", default="gateway", help="output file name stem under --out")
    args = p.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.setups = set(args.setups.split(","))
    args.layouts = set(args.layouts.split(","))
    unknown = (args.setups - {s for s, _ in PLAN + FLOORS}) | (args.layouts - set(LAYOUTS))
    if unknown:
        p.error(f"unknown set-up or layout: {', '.join(sorted(unknown))}")
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        p.error("the core layouts need at least 2 CPUs")
    return args


def make_proxy(
    setup: str, upstream: str, cpus: str, args: argparse.Namespace
) -> procs.Proxy | None:
    if setup == "direct":
        return None
    if setup.startswith("aiohttp-"):
        return procs.floor(upstream, cpus, setup.removeprefix("aiohttp-"))
    if setup == "router":
        return procs.router(upstream, cpus, args.access_log)
    return procs.gateway(
        upstream, cpus, int(setup.removeprefix("gateway-w")), args.access_log, args.gateway_root
    )


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for layout in ("split", "shared"):
        plan = [s for s, lay in PLAN + FLOORS if lay == layout and s in args.setups]
        if layout not in args.layouts or not plan:
            continue
        load_cpus, proxy_cpus = LAYOUTS[layout]
        with Nginx(load_cpus) as nginx:
            upstream = psutil.Process(nginx.proc.pid)  # type: ignore[union-attr]
            up_procs = [upstream, *upstream.children()]
            for setup in plan:
                with ExitStack() as stack:
                    proxy = make_proxy(setup, nginx.url, proxy_cpus, args)
                    if proxy is not None:
                        stack.callback(proxy.stop)
                        proxy.start()
                    target = proxy.url if proxy else nginx.url
                    px_procs = proxy.processes() if proxy else []
                    threads = sum(p.num_threads() for p in px_procs)
                    for c in args.concurrency:
                        load = Load(load_cpus)
                        run_wrk(load, target, c, args.warmup, up_procs, px_procs)
                        reps = [
                            run_wrk(load, target, c, args.seconds, up_procs, px_procs)
                            for _ in range(args.repeat)
                        ]
                        reps.sort(key=lambda r: r["rps"])
                        r = {"setup": setup, "layout": layout, **reps[len(reps) // 2]}
                        r["rps_all"] = [x["rps"] for x in reps]
                        r["p50_ms_all"] = [x["p50_ms"] for x in reps]
                        r["proxy_processes"], r["proxy_threads"] = len(px_procs), threads
                        runs.append(r)
                        print(
                            f"{setup:<12} {layout:<7} c={c:<3} {r['rps']:>8.0f} req/s  "
                            f"p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  "
                            f"errors {r['errors']}  foreign cpu {r['cpu_foreign']:.2f}",
                            flush=True,
                        )
    return runs


def rss_run(args: argparse.Namespace) -> dict[str, Any]:
    load_cpus, proxy_cpus = LAYOUTS["split"]
    with Nginx(load_cpus) as nginx:
        proxy = procs.gateway(nginx.url, proxy_cpus, 1, args.access_log, args.gateway_root).start()
        try:
            px = proxy.processes()
            idle = tree_rss_mib(px)
            up = psutil.Process(nginx.proc.pid)  # type: ignore[union-attr]
            with RssSampler(px, interval_s=1.0) as sampler:
                r = run_wrk(
                    Load(load_cpus), proxy.url, args.rss_concurrency, args.rss_seconds, [up], px
                )
        finally:
            proxy.stop()
    summary = sampler.summary()
    print(f"RSS: idle {idle:.1f} MiB, {summary}  ({r['rps']:.0f} req/s, {r['errors']} errors)")
    return {
        "setup": "gateway-w1",
        "layout": "split",
        "concurrency": args.rss_concurrency,
        "idle_mib": round(idle, 2),
        "summary": summary,
        "load": r,
        "samples": sampler.samples,
    }


def profile_run(args: argparse.Namespace) -> dict[str, str]:
    """py-spy the single-process gateway (split layout) under load: a flame graph and raw stacks."""
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    load_cpus, proxy_cpus = LAYOUTS["split"]
    files = {}
    with Nginx(load_cpus) as nginx:
        proxy = procs.gateway(nginx.url, proxy_cpus, 1, args.access_log, args.gateway_root).start()
        try:
            pid = str(proxy.processes()[-1].pid)  # the serving process (a child with --workers)
            for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
                path = args.out / f"{args.stem}_profile.{suffix}"
                # py-spy samples from the load core so the gateway's core is left to the gateway.
                spy_proc = subprocess.Popen(
                    [*procs.taskset(load_cpus), spy, "record", "--pid", pid, "--rate", "250",
                     "--duration", f"{args.profile_seconds:g}", "--format", fmt, "-o", str(path),
                     "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                )  # fmt: skip
                time.sleep(0.5)
                up = psutil.Process(nginx.proc.pid)  # type: ignore[union-attr]
                run_wrk(
                    Load(load_cpus),
                    proxy.url,
                    args.profile_concurrency,
                    args.profile_seconds,
                    [up],
                    [],
                )
                _, err = spy_proc.communicate(timeout=60)
                if spy_proc.returncode != 0:
                    raise SystemExit(f"py-spy failed: {err.decode()[-2000:]}")
                # The flame graph's title holds the command line: no absolute paths in results.
                path.write_text(path.read_text().replace(f"{procs.REPO}/", ""))
                files[fmt] = path.name
        finally:
            proxy.stop()
    print(f"profile: {files}")
    return files


def main() -> None:
    args = parse_args()
    restore = set_priority(args.nice)
    try:
        run(args, base_nice=0 if restore is None else restore)
    finally:
        if restore is not None:
            set_priority(restore)


def run(args: argparse.Namespace, base_nice: int) -> None:
    started = datetime.datetime.now(datetime.UTC)
    meta = {"started_utc": started.isoformat(timespec="seconds"), **versions()}
    meta["title"] = (
        f"maskgate gateway overhead vs nginx direct and sglang-router {meta['sglang_router']} "
        f"({meta['cpus']}x {meta['cpu']}, {meta['started_utc']}, git {meta['git_commit']})"
    )
    runs = measure(args)
    summary = report.summarise(runs, args.concurrency)
    prof = profile_run(args) if args.profile_seconds > 0 else None
    rss = None
    if args.rss_seconds > 0:
        # Long and not timing-sensitive: leave other work on the machine its usual share.
        set_priority(base_nice)
        rss = rss_run(args)
    config = {
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "layouts": {k: {"wrk_nginx_cpus": v[0], "proxy_cpus": v[1]} for k, v in LAYOUTS.items()},
        "wrk_threads": 1,
        "access_log": args.access_log,
        "nice": args.nice,
        "autogroup": Path("/proc/self/autogroup").read_text().strip()
        if Path("/proc/self/autogroup").exists()
        else None,
        # No absolute paths in the results: they are committed.
        "gateway_root": "." if args.gateway_root == procs.REPO else args.gateway_root.name,
        "argv": sys.argv[1:],
    }
    result = {
        "meta": meta,
        "config": config,
        "runs": runs,
        "summary": summary,
        "rss": rss,
        "profile": prof,
    }
    print()
    print(report.table(runs, summary, rss))
    for path in report.write(args.out, args.stem, result):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
