"""Figures of one layout from the clients' records, the table, the JSON and the plot.

Definitions, over the window [t0, t1] after warm-up:
  throughput  tokens whose chunk arrived inside the window / window length (tokens/s)
  TTFT        first token arrival - send, for requests sent inside the window
  TPOT        (last token - first token) / (tokens - 1), for requests that got all their
              tokens inside the window (the time per output token after the first)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.plotting import pyplot, save

LAYOUTS = {
    "sort_all_rows": "1. co-batched, sort-all-rows baseline",
    "kernel": "2. co-batched, row-filtered kernel",
    "isolated": "3. isolated by the gateway (2 processes, 1 GPU)",
    # --gpus 2: each worker owns a card
    "sort_all_rows@2": "1. co-batched, sort all rows, 2 mixed workers / 2 GPUs",
    "kernel@2": "2. co-batched, kernel, 2 mixed workers / 2 GPUs",
    "isolated@2": "3. isolated: general on GPU 0, mask on GPU 1",
    "general_only": "4. general traffic alone, 1 GPU",
}

SHORT = {
    "sort_all_rows": "1. co-batched\nsort all rows",
    "kernel": "2. co-batched\nrow-filtered kernel",
    "isolated": "3. isolated\n(2 processes, 1 GPU)",
    "sort_all_rows@2": "1. co-batched, sort\n2 GPUs",
    "kernel@2": "2. co-batched, kernel\n2 GPUs",
    "isolated@2": "3. isolated\n1 GPU each",
    "general_only": "4. general only\n1 GPU",
}


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def summarise(
    records: list[dict[str, Any]],
    t0: float,
    t1: float,
    max_new_tokens: dict[str, int],
    gpus: int = 1,
) -> dict[str, Any]:
    out: dict[str, Any] = {"window_s": round(t1 - t0, 3), "gpus": gpus}
    for kind in ("general", "mask"):
        recs = [r for r in records if r["kind"] == kind]
        tokens = sum(n for r in recs for t, n in r["chunks"] if t0 <= t <= t1)
        ttft = [
            r["chunks"][0][0] - r["sent"] for r in recs if t0 <= r["sent"] <= t1 and r["chunks"]
        ]
        tpot = []
        for r in recs:
            n = sum(c[1] for c in r["chunks"])
            if n == max_new_tokens[kind] and n > 1:
                first, last = r["chunks"][0][0], r["chunks"][-1][0]
                if t0 <= first and last <= t1:
                    tpot.append((last - first) / (n - 1))
        errors = [r["error"] for r in recs if r["error"]]
        out[kind] = {
            "tok_s": round(tokens / (t1 - t0), 1),
            "requests_sent_in_window": sum(1 for r in recs if t0 <= r["sent"] <= t1),
            "requests_timed": len(tpot),
            "ttft_ms_p50": _ms(pct(ttft, 50)),
            "ttft_ms_p99": _ms(pct(ttft, 99)),
            "tpot_ms_p50": _ms(pct(tpot, 50)),
            "tpot_ms_p99": _ms(pct(tpot, 99)),
            "errors": len(errors),
            "error_examples": sorted(set(errors))[:3],
        }
        if kind == "mask":
            steps = sum(r["mask_tokens"] for r in recs)
            out[kind]["mean_mask_ids"] = (
                round(sum(r["mask_ids"] for r in recs) / steps, 1) if steps else None
            )
            out[kind]["truncated_steps"] = sum(r["truncated"] for r in recs)
    out["total_tok_s_per_gpu"] = round((out["general"]["tok_s"] + out["mask"]["tok_s"]) / gpus, 1)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def label(key: str, short: bool = False) -> str:
    """A result's name: its layout, and the load when it is not the light one."""
    layout, _, load = key.partition("+")
    name = (SHORT if short else LAYOUTS).get(layout, layout)
    return f"{name}{chr(10) if short else ' '}({load} mask load)" if load else name


def _f(v: Any, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def table(results: dict[str, dict[str, Any]]) -> str:
    head = (
        f"{'layout':<68} {'TPOT p50':>9} {'TPOT p99':>9} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'gen tok/s':>10} {'mask tok/s':>10} {'tok/s/GPU':>10} {'errors':>7}"
    )
    lines = [head, "-" * len(head)]
    for key, res in results.items():
        g, m = res["general"], res["mask"]
        lines.append(
            f"{label(key):<68} {_f(g['tpot_ms_p50']):>9} {_f(g['tpot_ms_p99']):>9} "
            f"{_f(g['ttft_ms_p50']):>9} {_f(g['ttft_ms_p99']):>9} {_f(g['tok_s']):>10} "
            f"{_f(m['tok_s']):>10} {_f(res.get('total_tok_s_per_gpu')):>10} "
            f"{g['errors'] + m['errors']:>7}"
        )
    lines.append("(TPOT and TTFT of the general traffic, in ms)")
    return "\n".join(lines)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    keys = [k for k in results if results[k]["general"]["tok_s"]]  # a failed layout: no bars
    missing = [label(k) for k in results if k not in keys]
    if missing:
        title += "\nno tokens in the window (not plotted): " + "; ".join(missing)
    labels = [label(k, short=True) for k in keys]
    panels = [
        ("general TPOT (ms)", [("tpot_ms_p50", "p50"), ("tpot_ms_p99", "p99")], "general"),
        ("general TTFT (ms)", [("ttft_ms_p50", "p50"), ("ttft_ms_p99", "p99")], "general"),
        ("general throughput (tokens/s)", [("tok_s", "")], "general"),
        ("mask throughput (tokens/s)", [("tok_s", "")], "mask"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8))
    for ax, (name, series, kind) in zip(axes, panels, strict=True):
        width = 0.8 / len(series)
        for i, (field, legend) in enumerate(series):
            vals = [results[k][kind][field] or 0 for k in keys]
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(keys))]
            bars = ax.bar(xs, vals, width, label=legend or None)
            ax.bar_label(bars, fmt="%.0f" if max(vals, default=0) >= 100 else "%.1f", fontsize=8)
        ax.set_title(name)
        ax.set_xticks(range(len(keys)), labels, fontsize=8)
        if len(series) > 1:
            ax.legend(fontsize=8)
    save(fig, path, title, dpi=110, title_size=10)
