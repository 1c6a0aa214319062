"""Launches for Nsight Compute: where pass 1 and resolve spend their time at the target case
(B = 128, V = 151936, fp32 Zipf rows, top-p 0.95, every row a mask).

  ncu --clock-control none --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      -k "regex:_floor_kernel|band_lanes_kernel|resolve_kernel" \
      --launch-skip 10 --launch-count 5 -o pass1 python bench/ncu_pass1.py [VARIANT ...]

Each round launches, in order: the one-pass floor (4096-token chunks), pass 1 alone for each
bench_kernels.py variant named (default: `default`, the 16384-token segments of 1280
programs, and `l512s32k`, 32768-token segments in 640 programs, one wave), then a whole
kernels.sample (pass 1 and resolve_kernel). The first two rounds compile and warm up
(--launch-skip skips their matching launches: 5 a round with the default variants), the
third is the one profiled. Without ncu it just runs the rounds.
"""

from __future__ import annotations

import pathlib
import sys

import torch

if __package__ in (None, ""):  # run as a script: import from the repository root
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.bench_kernels import CAP, _args, band_pass, make_inputs
from bench.kernel_baselines import floor_pass
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.triton_path import band_config, sample_triton

BATCH, VOCAB = 128, 151936


def main() -> None:
    variants = sys.argv[1:] or ["default", "l512s32k"]
    buf = make_inputs(BATCH, VOCAB, torch.float32, "p0.95", False, 0)
    inp = check_inputs(**_args(buf), max_mask_tokens=CAP)
    cfg = band_config(VOCAB, batch=BATCH)
    for _ in range(3):
        floor_pass(buf["logits"], 4096)
        for v in variants:
            band_pass(buf["logits"], buf["temperature"], v)
        sample_triton(inp, cfg)
    torch.cuda.synchronize()
    print("rounds done", flush=True)


if __name__ == "__main__":
    main()
