"""Benchmarks, each run from the repository root as `python -m bench.<name>`.

Each prints a table and writes one result set (JSON or CSV, plus a PNG) under bench/results/,
named by what it measures:

  gateway_overhead  the gateway against nginx direct and sglang-router (wrk load)
  worker_decode     the worker's decode throughput with and without masks (one GPU)
  pool_isolation    what top-p-only mask traffic costs general traffic sharing its GPU
  soak              ten minutes of mixed traffic with faulted upstreams
  fuzz_long         the gateway's fuzz properties with thousands of examples each
  kernels           kernels.sample at B = 1 and 128 against the one-pass floor and the sort
  worker_weight_sync  a full weight sync into a running worker (disk, tensors, NCCL)

The kernel benchmarks are described in docs/kernels.md; the rest in docs/performance.md and
docs/reliability.md.
"""
