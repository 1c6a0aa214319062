"""A table, JSON and plot of Nsight Compute's raw metrics for the kernels ncu_pass1.py
launches: where pass 1, resolve and the one-pass floor spend their time.

  ncu -i pass1.ncu-rep --page raw --csv > raw.csv
  python bench/ncu_summary.py raw.csv --labels floor,pass1,pass1_s32k,pass1,resolve \
      [--out bench/results/ncu_pass1]

One column per profiled launch (in launch order, named by --labels): its duration, the
warp instructions it executed, the SMs' active share of the elapsed cycles (the rest is a
partial last wave or the launch's start and end), how busy the issue slots and the ALU, FMA
and XU (exp) pipes were while active, achieved warps, DRAM bytes and throughput, and the
warp stall reasons (cycles per issued instruction). Writes OUT.json and OUT.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib

METRICS = {
    "duration_us": ("gpu__time_duration.sum", 1e-3),
    "warp_instructions_M": ("sm__inst_executed.sum", 1e-6),
    "sm_active_cycles": ("sm__cycles_active.avg", 1.0),
    "elapsed_cycles": ("gpc__cycles_elapsed.max", 1.0),
    "issue_active_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active", 1.0),
    "alu_pipe_pct": ("sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", 1.0),
    "fma_pipe_pct": ("sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", 1.0),
    "xu_pipe_pct": ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", 1.0),
    "warps_active_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", 1.0),
    "dram_read_MB": ("dram__bytes_read.sum", 1e-6),
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
}
STALL = "smsp__average_warps_issue_stalled_"
STALLS = ("long_scoreboard", "not_selected", "math_pipe_throttle", "barrier", "wait")
STALLS += ("short_scoreboard", "branch_resolving", "no_instruction")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarise(path: pathlib.Path, labels: list[str]) -> list[dict]:
    rows = list(csv.reader(path.open()))
    header, data = rows[0], rows[2:]  # the second row holds units
    col = {name: i for i, name in enumerate(header)}
    # ncu reports durations in ns or us depending on the version; its units row says which.
    units = dict(zip(header, rows[1], strict=False))
    out = []
    for j, row in enumerate(data):
        entry = {"launch": labels[j] if j < len(labels) else f"launch{j}"}
        entry["kernel"] = row[col["Kernel Name"]] if "Kernel Name" in col else ""
        entry["grid"] = row[col["Grid Size"]] if "Grid Size" in col else ""
        for key, (metric, scale) in METRICS.items():
            if metric not in col:
                continue
            value = number(row[col[metric]])
            if value is None:
                continue
            if key == "duration_us" and units.get(metric, "") == "us":
                scale = 1.0
            entry[key] = value * scale
        if "sm_active_cycles" in entry and entry.get("elapsed_cycles"):
            entry["sm_active_pct"] = 100 * entry["sm_active_cycles"] / entry["elapsed_cycles"]
        for stall in STALLS:
            metric = f"{STALL}{stall}_per_issue_active.ratio"
            if metric in col and (value := number(row[col[metric]])) is not None:
                entry[f"stall_{stall}"] = value
        out.append(entry)
    return out


def plot(entries: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["sm_active_pct", "issue_active_pct", "alu_pipe_pct", "xu_pipe_pct", "dram_pct"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [e["launch"] for e in entries]
    ax0.bar(names, [e.get("duration_us", 0) for e in entries], color="tab:gray")
    ax0.set_ylabel("us (one launch under ncu, clocks unlocked)")
    ax0.set_title("duration")
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ax1.bar(
            [x + i * width for x in range(len(entries))],
            [e.get(key, 0) for e in entries],
            width,
            label=key.replace("_pct", ""),
        )
    ax1.set_xticks([x + 0.4 - width / 2 for x in range(len(entries))], names)
    ax1.set_ylabel("% of peak")
    ax1.set_title("activity while the SMs are active (sm_active: of elapsed)")
    ax1.legend(fontsize=7)
    for ax in (ax0, ax1):
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", help="ncu --page raw --csv output")
    ap.add_argument("--labels", default="", help="names of the launches, in order")
    ap.add_argument("--out", default="bench/results/ncu_pass1")
    args = ap.parse_args()
    entries = summarise(pathlib.Path(args.raw), [x for x in args.labels.split(",") if x])
    keys = ["duration_us", "warp_instructions_M", "sm_active_pct", "issue_active_pct"]
    keys += ["alu_pipe_pct", "fma_pipe_pct", "xu_pipe_pct", "warps_active_pct", "dram_pct"]
    keys += [f"stall_{s}" for s in STALLS]
    print(f"{'':28s}" + "".join(f"{e['launch']:>16s}" for e in entries))
    for key in keys:
        cells = [e.get(key) for e in entries]
        print(
            f"{key:28s}" + "".join(f"{c:16.2f}" if c is not None else f"{'-':>16s}" for c in cells)
        )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(entries, indent=1))
    plot(entries, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
