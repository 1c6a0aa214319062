"""Helpers of bench/bench_isolation.py: checkpoint, processes, load, report."""
