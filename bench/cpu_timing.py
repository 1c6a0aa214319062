"""Timing kernels.sample on the CPU path: the arguments of one case and its median times.

Shared by bench_kernels.py's `--cpu` run and cpu_path_ab.py's processes (which pass the
`sample` of the tree they time).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def sample_args(
    logits: torch.Tensor, top_k: int, top_p: float, min_p: float, want_mask: bool = True
) -> tuple[torch.Tensor, ...]:
    """maskgate.kernels.sample's positional arguments for a batch with one setting on every row, at
    temperature 1."""
    batch = logits.shape[0]
    return (
        logits,
        torch.ones(batch),
        torch.full((batch,), top_k, dtype=torch.int32),
        torch.full((batch,), top_p),
        torch.full((batch,), min_p),
        torch.full((batch,), want_mask, dtype=torch.bool),
    )


def median_times(call: Callable[[], Any], repeats: int, warmup: int = 0) -> tuple[float, float]:
    """(wall ms, CPU ms of this process): the medians over `repeats` calls after `warmup`."""
    for _ in range(warmup):
        call()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3
