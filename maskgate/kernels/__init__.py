"""Sampling-mask kernels: one op, `sample`, and the sort-all baseline beside it.

    sample                 one token per row and the sampling masks of the rows that ask
                           (CUDA: the Triton path, triton/; elsewhere the torch path, cpu/)
    sample_sort_all_rows   the baseline: every row sorted over the vocabulary whenever one
                           row asks for a mask (same arguments, same result)

The mask semantics they implement are in docs/design.md (mask semantics). Beside the two ops,
the names their callers need: the result type and its overflow status, the scaling of logits
every path shares, the launch shape that varies with the batch (Triton compiles one
variant per shape, so a warm-up meets each one), and the fused multiply-add setting every
Triton launch passes (the worker's model kernels too).

The float64 oracle (reference.py) and the paths' modules are imported explicitly by tests and
benchmarks; they are not part of the serving API.
"""

from maskgate.kernels.order import scaled_logits
from maskgate.kernels.result import STATUS_OVERFLOW, SampleResult
from maskgate.kernels.sample import sample
from maskgate.kernels.sort_all import sample_sort_all_rows
from maskgate.kernels.triton.config import FP_FUSION, default_config

__all__ = [
    "FP_FUSION",
    "STATUS_OVERFLOW",
    "SampleResult",
    "default_config",
    "sample",
    "sample_sort_all_rows",
    "scaled_logits",
]
