"""The bench's outputs: a printed table, the targets of issue 2, and JSON/CSV/PNG files."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import orjson

Run = dict[str, Any]

# Issue 2's speed targets.
MAX_ADDED_P50_MS = 0.3
MIN_RATIO_W1 = 0.6
MIN_RATIO_W2 = 1.0
CSV_FIELDS = [
    "setup", "layout", "concurrency", "rps", "p50_ms", "p90_ms", "p99_ms", "p999_ms",
    "mean_ms", "requests", "errors", "cpu_wrk", "cpu_upstream", "cpu_proxy", "cpu_foreign",
]  # fmt: skip


def _find(runs: list[Run], setup: str, layout: str, c: int) -> Run | None:
    return next(
        (r for r in runs if (r["setup"], r["layout"], r["concurrency"]) == (setup, layout, c)),
        None,
    )


def _peak(runs: list[Run], setup: str, layout: str) -> float | None:
    rates = [r["rps"] for r in runs if (r["setup"], r["layout"]) == (setup, layout)]
    return max(rates) if rates else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarise(runs: list[Run], concurrencies: list[int]) -> dict[str, Any]:
    """Ratios between set-ups at each concurrency and at their peaks, and the targets.

    Throughput targets are judged on peak throughput (the best of each set-up over the
    concurrencies), not at one concurrency: a proxy that sheds throughput past its knee
    (sglang-router does, sharing cores with wrk and nginx at c=64) would otherwise flatter
    the other. Added latency is judged at c=1, where queueing does not hide the per-request
    cost.
    """
    out: dict[str, Any] = {"per_concurrency": {}, "peak": {}, "targets": {}}
    for c in concurrencies:
        row: dict[str, float] = {}
        direct = _find(runs, "direct", "split", c)
        gw1 = _find(runs, "gateway-w1", "split", c)
        gw2 = _find(runs, "gateway-w2", "shared", c)
        r1 = _find(runs, "router", "split", c)
        r2 = _find(runs, "router", "shared", c)
        if gw1 and direct:
            row["gateway_w1_added_p50_ms"] = round(gw1["p50_ms"] - direct["p50_ms"], 4)
        if r1 and direct:
            row["router_added_p50_ms"] = round(r1["p50_ms"] - direct["p50_ms"], 4)
        if gw1 and r1:
            row["gateway_w1_over_router"] = round(gw1["rps"] / r1["rps"], 3)
        if gw2 and r2:
            row["gateway_w2_over_router"] = round(gw2["rps"] / r2["rps"], 3)
        out["per_concurrency"][c] = row
    peaks = {
        f"{setup}/{layout}": _peak(runs, setup, layout)
        for setup, layout in sorted({(r["setup"], r["layout"]) for r in runs})
    }
    out["peak"] = {
        "rps": peaks,
        "gateway_w1_over_router": _ratio(peaks.get("gateway-w1/split"), peaks.get("router/split")),
        "gateway_w2_over_router": _ratio(
            peaks.get("gateway-w2/shared"), peaks.get("router/shared")
        ),
    }
    first = out["per_concurrency"][min(concurrencies)]
    checks = [
        ("added_p50_ms_at_c1", first.get("gateway_w1_added_p50_ms"), "<=", MAX_ADDED_P50_MS),
        (
            "w1_peak_throughput_over_router",
            out["peak"]["gateway_w1_over_router"],
            ">=",
            MIN_RATIO_W1,
        ),
        (
            "w2_peak_throughput_over_router",
            out["peak"]["gateway_w2_over_router"],
            ">=",
            MIN_RATIO_W2,
        ),
    ]
    for name, value, op, bound in checks:
        met = None if value is None else (value <= bound if op == "<=" else value >= bound)
        out["targets"][name] = {"value": value, "target": f"{op} {bound}", "met": met}
    return out


def table(runs: list[Run], summary: dict[str, Any], rss: dict[str, Any] | None) -> str:
    head = f"{'setup':<12} {'layout':<7} {'c':>3} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'err':>5}  cpu wrk/up/proxy/foreign"
    lines = [head, "-" * len(head)]
    for r in runs:
        cpu = f"{r['cpu_wrk']:.2f}/{r['cpu_upstream']:.2f}/{r['cpu_proxy']:.2f}/{r['cpu_foreign']:.2f}"
        lines.append(
            f"{r['setup']:<12} {r['layout']:<7} {r['concurrency']:>3} {r['rps']:>9.0f} "
            f"{r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['errors']:>5}  {cpu}"
        )
    lines.append("")
    for c, row in summary["per_concurrency"].items():
        lines.append(f"c={c:<3} " + "  ".join(f"{k}={v}" for k, v in row.items()))
    peak = summary["peak"]
    lines.append(
        "peak req/s: " + "  ".join(f"{k}={v:.0f}" for k, v in peak["rps"].items() if v is not None)
    )
    lines.append(
        f"peak ratios: gateway_w1_over_router={peak['gateway_w1_over_router']}  "
        f"gateway_w2_over_router={peak['gateway_w2_over_router']}"
    )
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: list[Run] = result["runs"]
    rss = result.get("rss")
    fig, axes = plt.subplots(1, 3 if rss else 2, figsize=(17 if rss else 12, 4.8))
    series = sorted({(r["setup"], r["layout"]) for r in runs})
    for setup, layout in series:
        pts = sorted(
            (r for r in runs if (r["setup"], r["layout"]) == (setup, layout)),
            key=lambda r: r["concurrency"],
        )
        cs = [r["concurrency"] for r in pts]
        style = "-" if layout == "split" else "--"
        label = f"{setup} ({layout})"
        axes[0].plot(cs, [r["rps"] for r in pts], style, marker="o", label=label)
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
    fig.suptitle(result["meta"]["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
