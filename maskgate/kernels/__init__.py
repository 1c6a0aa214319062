"""Sampling-mask kernels: kernels.sample and its result type.

The mask semantics they implement are in docs/design.md (mask semantics).

kernels.reference (the float64 oracle) is imported explicitly by tests; it is not part of the
serving API.
"""

from maskgate.kernels.result import SampleResult
from maskgate.kernels.sample import sample

__all__ = ["SampleResult", "sample"]
