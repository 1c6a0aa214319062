"""Test support for maskgate.kernels: the result checks against the float64 oracle
(conformance), the test and benchmark logits (workloads), seeded random batches run on both
paths (fuzz) and the Triton interpreter's faster reductions (interpreter). Importable as
`kernels_support` (tests/conftest.py puts tests/ on sys.path)."""
