"""The long fuzz run: the fuzz tests of tests/integration/fuzz with thousands of examples each.

CI runs the same properties with a few hundred examples; this runs --examples per property
(three properties: valid mask requests, broken mask requests and garbage, general requests),
so the default of 3,400 makes 10,200 cases. It prints the outcome of every case by verdict
and writes bench/results/fuzz_long.json and fuzz_long.png.

    .venv/bin/python -m bench.fuzz_long                  # >= 10,000 cases (a few minutes)
    .venv/bin/python -m bench.fuzz_long --examples 500   # a quick look
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.plotting import pyplot, save

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def run(examples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "outcomes.jsonl"
        env = {
            **os.environ,
            "MASKGATE_FUZZ_EXAMPLES": str(examples),
            "MASKGATE_FUZZ_REPORT": str(report),
        }
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "tests/integration/fuzz",
            "-q",
            "-p",
            "no:cacheprovider",
            "--hypothesis-show-statistics",
        ]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - t0
        lines = report.read_text().splitlines() if report.exists() else []
    per_test = [json.loads(line) for line in lines]
    total: collections.Counter[str] = collections.Counter()
    for t in per_test:
        total.update(t["outcomes"])
    return {
        "examples_per_property": examples,
        "cases": sum(total.values()),
        "passed": proc.returncode == 0,
        "pytest_exit_code": proc.returncode,
        "elapsed_s": round(elapsed, 1),
        "outcomes": dict(sorted(total.items())),
        "per_property": per_test,
        "pytest_tail": proc.stdout[-3000:],
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    items = sorted(result["outcomes"].items(), key=lambda kv: -kv[1])
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([k for k, _ in items], [v for _, v in items])
    ax.set_xscale("log")
    ax.invert_yaxis()
    verdict = "all properties held" if result["passed"] else "FAILED"
    ax.set(xlabel="cases", title=f"fuzz: {result['cases']} cases, {verdict}")
    save(fig, path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=3400, help="examples per property")
    args = p.parse_args()
    result = run(args.examples)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fuzz_long.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "fuzz_long.png")
    print(f"{'cases':40} {result['cases']}")
    print(f"{'all properties held':40} {result['passed']}")
    print(f"{'elapsed (s)':40} {result['elapsed_s']}")
    for outcome, count in result["outcomes"].items():
        print(f"  {outcome:38} {count}")
    if not result["passed"]:
        print(result["pytest_tail"])
        sys.exit(1)


if __name__ == "__main__":
    main()
