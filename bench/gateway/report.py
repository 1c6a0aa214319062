"""The bench's outputs: a printed table, the speed targets, and JSON/CSV/PNG files.

Targets: on the shared layout, the gateway's defaults against sglang-router on the 1.9 KB chat
case; where the split layout ran, the one-process targets.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

import orjson

from bench.plotting import pyplot, save

Run = dict[str, Any]

# Shared layout: defaults at least the router's peak throughput; added p50 at c=1 within 0.1 ms
# of the router's own.
MIN_DEFAULTS_OVER_ROUTER = 1.0
MAX_ADDED_P50_OVER_ROUTER_MS = 0.1
# Split layout, one process.
MAX_ADDED_P50_MS = 0.3
MIN_RATIO_W1 = 0.6
CSV_FIELDS = [
    "setup", "layout", "case", "concurrency", "rps", "p50_ms", "p90_ms", "p99_ms", "p999_ms",
    "mean_ms", "requests", "errors", "cpu_wrk", "cpu_upstream", "cpu_proxy", "cpu_foreign",
    "rps_spread",
]  # fmt: skip


def key(r: Run) -> str:
    return f"{r['setup']}/{r['layout']}/{r.get('case', 'chat')}"


def _find(runs: list[Run], k: str, c: int) -> Run | None:
    return next((r for r in runs if key(r) == k and r["concurrency"] == c), None)


def _peak(runs: list[Run], k: str) -> float | None:
    rates = [r["rps"] for r in runs if key(r) == k]
    return max(rates) if rates else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _p50(r: Run) -> float:
    """The median over the rounds of their p50s (the median-throughput round's own p50 moves
    with whatever else ran during that round)."""
    return float(statistics.median(r.get("p50_ms_all") or [r["p50_ms"]]))


def spread(r: Run) -> float | None:
    """(max - min) / median of the rounds' req/s: how noisy this point was."""
    rates = r.get("rps_all") or []
    return round((max(rates) - min(rates)) / statistics.median(rates), 3) if rates else None


def summarise(runs: list[Run], c1: int) -> dict[str, Any]:
    """Peaks, added p50 at the lowest concurrency, and the targets.

    Throughput is judged on peak throughput (the best of each set-up over the concurrencies):
    a proxy that sheds throughput past its knee would otherwise flatter the other. Added
    latency is p50 minus nginx direct's p50 (same layout, same case; each the median of the
    rounds' p50s) at c=1, where queueing does not hide the per-request cost.
    """
    for r in runs:
        r["rps_spread"] = spread(r)
    keys = sorted({key(r) for r in runs})
    peaks = {k: _peak(runs, k) for k in keys}
    added: dict[str, float] = {}
    for k in keys:
        setup, layout, case = k.split("/")
        own, direct = _find(runs, k, c1), _find(runs, f"direct/{layout}/{case}", c1)
        if setup != "direct" and own and direct:
            added[k] = round(_p50(own) - _p50(direct), 4)
    out: dict[str, Any] = {"peak_rps": peaks, f"added_p50_ms_at_c{c1}": added, "targets": {}}
    defaults, router = "gateway-auto/shared/chat2k", "router/shared/chat2k"
    checks = [
        (
            "defaults_peak_throughput_over_router",
            _ratio(peaks.get(defaults), peaks.get(router)),
            ">=",
            MIN_DEFAULTS_OVER_ROUTER,
        ),
        (
            "defaults_added_p50_minus_router_added_p50_ms",
            round(added[defaults] - added[router], 4)
            if defaults in added and router in added
            else None,
            "<=",
            MAX_ADDED_P50_OVER_ROUTER_MS,
        ),
        ("w1_split_added_p50_ms", added.get("gateway-w1/split/chat"), "<=", MAX_ADDED_P50_MS),
        (
            "w1_split_peak_throughput_over_router",
            _ratio(peaks.get("gateway-w1/split/chat"), peaks.get("router/split/chat")),
            ">=",
            MIN_RATIO_W1,
        ),
    ]
    for name, value, op, bound in checks:
        met = None if value is None else (value <= bound if op == "<=" else value >= bound)
        out["targets"][name] = {"value": value, "target": f"{op} {bound}", "met": met}
    return out


def table(runs: list[Run], summary: dict[str, Any], rss: dict[str, Any] | None) -> str:
    head = (
        f"{'setup':<13} {'layout':<6} {'case':<6} {'c':>3} {'req/s':>8} {'spread':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'err':>4}  cpu wrk/up/proxy/foreign"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        cpu = f"{r['cpu_wrk']:.2f}/{r['cpu_upstream']:.2f}/{r['cpu_proxy']:.2f}/{r['cpu_foreign']:.2f}"
        lines.append(
            f"{r['setup']:<13} {r['layout']:<6} {r.get('case', 'chat'):<6} {r['concurrency']:>3} "
            f"{r['rps']:>8.0f} {spread(r) or 0:>6.2f} {r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f} "
            f"{r['errors']:>4}  {cpu}"
        )
    lines.append("")
    lines.append("peak req/s: " + "  ".join(f"{k}={v:.0f}" for k, v in summary["peak_rps"].items()))
    for name, added in summary.items():
        if name.startswith("added_p50"):
            lines.append(f"{name}: " + "  ".join(f"{k}={v:+.3f}" for k, v in added.items()))
    lines.append("")
    for name, t in summary["targets"].items():
        verdict = {True: "MET", False: "MISSED", None: "not measured"}[t["met"]]
        lines.append(f"target {name}: {t['value']} (want {t['target']}) -> {verdict}")
    if rss:
        s = rss["summary"]
        lines.append(
            f"RSS {rss['setup']} over {s['seconds']:.0f} s at c={rss['concurrency']}: "
            f"start {s['start_mib']:.1f} MiB, end {s['end_mib']:.1f} MiB, peak {s['peak_mib']:.1f} MiB, "
            f"slope {s['slope_mib_per_min']:+.3f} MiB/min"
        )
    return "\n".join(lines)


def write(out_dir: Path, stem: str, result: dict[str, Any]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv"]
    paths[0].write_bytes(
        orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"
    )
    with paths[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(result["runs"])
    if result.get("rss"):
        paths.append(out_dir / f"{stem}_rss.csv")
        with paths[-1].open("w", newline="") as f:
            w2 = csv.writer(f)
            w2.writerow(["seconds", "rss_mib"])
            w2.writerows(result["rss"]["samples"])
    paths.append(out_dir / f"{stem}.png")
    plot(result, paths[-1])
    return paths


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    runs: list[Run] = result["runs"]
    rss = result.get("rss")
    fig, axes = plt.subplots(1, 3 if rss else 2, figsize=(17 if rss else 12, 4.8))
    for k in sorted({key(r) for r in runs}):
        pts = sorted((r for r in runs if key(r) == k), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in pts]
        style = "-" if pts[0].get("case") != "mask2k" else "--"
        label = k
        drawn = axes[0].plot(cs, [r["rps"] for r in pts], style, marker="o", label=label)
        # The rounds' spread as error bars: the machine's noise, next to the medians.
        axes[0].errorbar(
            cs,
            [r["rps"] for r in pts],
            yerr=[
                [r["rps"] - min(r.get("rps_all") or [r["rps"]]) for r in pts],
                [max(r.get("rps_all") or [r["rps"]]) - r["rps"] for r in pts],
            ],
            fmt="none",
            alpha=0.5,
            color=drawn[0].get_color(),
        )
        line = axes[1].plot(cs, [r["p50_ms"] for r in pts], style, marker="o", label=f"{label} p50")
        axes[1].plot(
            cs, [r["p99_ms"] for r in pts], style, marker="x", alpha=0.5, color=line[0].get_color()
        )
    axes[0].set(
        xscale="log",
        yscale="log",  # nginx direct is an order of magnitude above the proxies
        xlabel="concurrency (wrk connections)",
        ylabel="requests/s",
        title="Throughput",
    )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="concurrency",
        ylabel="ms (o p50, x p99)",
        title="Latency",
    )
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=6)
    for ax in axes[:2]:
        ax.set_xticks(
            result["config"]["concurrency"], [str(c) for c in result["config"]["concurrency"]]
        )
        ax.grid(alpha=0.3)
    if rss:
        ts, ms = zip(*rss["samples"], strict=True)
        axes[2].plot([t / 60 for t in ts], ms)
        axes[2].set(
            xlabel="minutes under load",
            ylabel="RSS MiB (process tree)",
            title=f"{rss['setup']} RSS at c={rss['concurrency']}",
        )
        axes[2].set_ylim(0, max(ms) * 1.2)
        axes[2].grid(alpha=0.3)
    save(fig, path, result["meta"]["title"], dpi=110)
