"""Gateway overhead: nginx direct vs the maskgate gateway vs sglang-router, driven by wrk.

All set-ups sit in front of the same fixed-response nginx (bench/gateway/nginx.conf.template)
and get the same load: wrk, one thread, POSTing one request case (bench/gateway/cases.py:
`chat` 110 B, `chat2k` a 1.9 KB chat completion, `mask2k` a 2 KB `/generate` mask request) at
each concurrency after a warm-up. Two core layouts on a 2-core machine:

  shared  wrk, nginx and the proxy all on cpus 0-1, scheduled by the kernel: the gateway
          with its defaults (`workers: auto`, one process per CPU) against sglang-router free
          to use both cores, on chat2k, and the gateway's mask path on mask2k. This is the
          default plan: the throughput and added-latency targets are judged on it.
  split   wrk + nginx on cpu 0, the proxy alone on cpu 1 (`--layouts split`): one gateway
          process against sglang-router restricted to one core, on `chat`.

Measurements are interleaved: all proxies of a layout run side by side (idle when not
loaded), and each round measures every (set-up, case, concurrency) once, `--repeat` rounds;
the median by req/s is kept and every round is recorded, so the spread shows how noisy the
machine was. Each run also records the CPU used by anything else on the machine (`foreign`).

    .venv/bin/python -m bench.gateway_overhead                      # the shared plan (~6 min)
    .venv/bin/python -m bench.gateway_overhead --layouts split,shared --profile-seconds 15
    .venv/bin/python -m bench.gateway_overhead --rss-seconds 300    # add the RSS run

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
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.gateway import procs, report
from bench.gateway.cases import CASES
from bench.gateway.load import Load, run_wrk
from bench.gateway.machine import set_priority, versions
from bench.gateway.rss import RssSampler, tree_rss_mib
from bench.gateway.upstream import Nginx

# layout -> (cpus for wrk and nginx, cpus for the proxy)
LAYOUTS = {"split": ("0", "1"), "shared": ("0,1", "0,1")}
# (set-up, layout, case) in run order; direct runs for every layout and case, so each
# added latency has its baseline.
PLAN = [
    ("direct", "split", "chat"),
    ("gateway-w1", "split", "chat"),
    ("router", "split", "chat"),
    ("direct", "shared", "chat2k"),
    ("router", "shared", "chat2k"),
    ("gateway-auto", "shared", "chat2k"),
    ("direct", "shared", "mask2k"),
    ("gateway-auto", "shared", "mask2k"),
]
# Not run unless named in --setups: one process and two processes on the shared layout, and
# bare aiohttp processes that show the gateway's floor.
EXTRA = [
    ("gateway-w1", "shared", "chat2k"),
    ("gateway-w2", "shared", "chat2k"),
    # A/B of one process on the mask path: this checkout against `--base-root`.
    ("direct", "split", "mask2k"),
    ("gateway-w1", "split", "mask2k"),
    ("gateway-w1-base", "split", "mask2k"),
    *[(f"aiohttp-{m}", "split", "chat") for m in ("answer", "proxy", "lean")],
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated wrk connection counts")
    # Whole seconds throughout: wrk takes no fractions.
    p.add_argument("--seconds", type=int, default=4, help="seconds per measured wrk run")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="measured runs per point; the median by req/s is kept (all are recorded)",
    )
    p.add_argument(
        "--warmup", type=int, default=1, help="discarded seconds before each measurement"
    )
    p.add_argument(
        "--setups",
        default=",".join(sorted({s for s, _, _ in PLAN})),
        help="subset of set-ups to run (also: gateway-w1/w2 on shared, aiohttp-* floors)",
    )
    p.add_argument("--layouts", default="shared", help="subset of core layouts: shared,split")
    p.add_argument("--rss-seconds", type=int, default=0, help="gateway RSS run length; 0 skips it")
    p.add_argument("--rss-concurrency", type=int, default=64)
    p.add_argument(
        "--profile-seconds", type=int, default=0, help="py-spy the gateway under load; 0 skips"
    )
    p.add_argument("--profile-concurrency", type=int, default=64)
    p.add_argument("--profile-case", default="mask2k", choices=sorted(CASES))
    p.add_argument(
        "--profile-only",
        action="store_true",
        help="only the py-spy run (writes {stem}_profile.*, leaves {stem}.json alone)",
    )
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
    p.add_argument(
        "--base-root",
        type=Path,
        default=None,
        help="another checkout for the gateway-w1-base set-up (an A/B against this one)",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--stem", default="gateway", help="output file name stem under --out")
    args = p.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.setups_named = any(a.startswith("--setups") for a in sys.argv[1:])
    args.setups = set(args.setups.split(","))
    args.layouts = set(args.layouts.split(","))
    unknown = (args.setups - {s for s, _, _ in PLAN + EXTRA}) | (args.layouts - set(LAYOUTS))
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
    workers = setup.removeprefix("gateway-").removesuffix("-base")
    root = args.base_root if setup.endswith("-base") else args.gateway_root
    if root is None:
        raise SystemExit(f"{setup} needs --base-root")
    proxy = procs.gateway(
        upstream,
        cpus,
        None if workers == "auto" else int(workers.removeprefix("w")),
        args.access_log,
        root,
    )
    proxy.name = setup
    return proxy


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    body_dir = Path(tempfile.mkdtemp(prefix="bench-bodies-"))
    for layout in ("split", "shared"):
        entries = PLAN + (EXTRA if args.setups_named else [])
        plan = [(s, c) for s, lay, c in entries if lay == layout and s in args.setups]
        if layout not in args.layouts or not plan:
            continue
        load_cpus, proxy_cpus = LAYOUTS[layout]
        with Nginx(load_cpus) as nginx, ExitStack() as stack:
            upstream = psutil.Process(nginx.proc.pid)  # type: ignore[union-attr]
            up_procs = [upstream, *upstream.children()]
            proxies: dict[str, procs.Proxy | None] = {}
            for setup in dict.fromkeys(s for s, _ in plan):  # all side by side, idle until used
                proxy = proxies[setup] = make_proxy(setup, nginx.url, proxy_cpus, args)
                if proxy is not None:
                    stack.callback(proxy.stop)
                    proxy.start()
            reps: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
            for rnd in range(args.repeat):
                for setup, case in plan:
                    proxy = proxies[setup]
                    target = proxy.url if proxy else nginx.url
                    px_procs = proxy.processes() if proxy else []
                    for c in args.concurrency:
                        load = Load(load_cpus)
                        kw = {"case": CASES[case], "body_dir": body_dir}
                        run_wrk(load, target, c, args.warmup, up_procs, px_procs, **kw)
                        r = run_wrk(load, target, c, args.seconds, up_procs, px_procs, **kw)
                        r["round"] = rnd
                        r["proxy_processes"] = len(px_procs)
                        r["proxy_threads"] = sum(p.num_threads() for p in px_procs)
                        reps.setdefault((setup, case, c), []).append(r)
                        print(
                            f"round {rnd} {setup:<12} {layout:<6} {case:<6} c={c:<3} "
                            f"{r['rps']:>8.0f} req/s  p50 {r['p50_ms']:.3f} ms  "
                            f"p99 {r['p99_ms']:.3f} ms  errors {r['errors']}  "
                            f"foreign cpu {r['cpu_foreign']:.2f}",
                            flush=True,
                        )
            for (setup, _case, _c), rs in reps.items():
                rs.sort(key=lambda r: r["rps"])
                r = {"setup": setup, "layout": layout, **rs[len(rs) // 2]}
                r["rps_all"] = [x["rps"] for x in rs]
                r["p50_ms_all"] = [x["p50_ms"] for x in rs]
                r["cpu_foreign_all"] = [x["cpu_foreign"] for x in rs]
                # CPU time per request (us): less sensitive to neighbours than req/s.
                r["proxy_cpu_us_per_req_all"] = [
                    round(x["cpu_proxy"] / x["rps"] * 1e6, 1) for x in rs if x["rps"]
                ]
                runs.append(r)
    shutil.rmtree(body_dir, ignore_errors=True)
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
    """py-spy one gateway process (split layout) under load on `--profile-case`: a flame
    graph and raw stacks."""
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
                    case=CASES[args.profile_case],
                    body_dir=args.out,
                )
                (args.out / f"body_{args.profile_case}.json").unlink(missing_ok=True)
                _, err = spy_proc.communicate(timeout=60)
                if spy_proc.returncode != 0:
                    raise SystemExit(f"py-spy failed: {err.decode()[-2000:]}")
                # The flame graph's title holds the command line: no absolute paths in results.
                path.write_text(
                    path.read_text().replace(f"{procs.REPO}/", "").replace(spy, "py-spy")
                )
                files[fmt] = path.name
        finally:
            proxy.stop()
    print(f"profile: {files}")
    return files


def _argv_without_paths(argv: list[str]) -> list[str]:
    """The command line for the results, with no machine paths: `--out DIR` left out, the
    checkouts named by their last component."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if a == "--out" or a.startswith("--out=") or (i and argv[i - 1] == "--out"):
            continue
        out.append(Path(a).name if i and argv[i - 1] in ("--base-root", "--gateway-root") else a)
    return out


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
        f"maskgate gateway vs nginx direct and sglang-router {meta['sglang_router']} "
        f"({meta['cpus']}x {meta['cpu']}, {meta['started_utc']}, git {meta['git_commit']})"
    )
    if args.profile_only:
        profile_run(args)  # its files only: the results of the last full run stay
        return
    runs = measure(args)
    summary = report.summarise(runs, min(args.concurrency))
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
        "cases": {name: {"path": c.path, "body_bytes": len(c.body)} for name, c in CASES.items()},
        "interleaved": True,
        "access_log": args.access_log,
        "nice": args.nice,
        "autogroup": Path("/proc/self/autogroup").read_text().strip()
        if Path("/proc/self/autogroup").exists()
        else None,
        # No absolute paths in the results: they are committed.
        "gateway_root": "." if args.gateway_root == procs.REPO else args.gateway_root.name,
        "base_root": args.base_root.name if args.base_root else None,
        "argv": _argv_without_paths(sys.argv[1:]),
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
