"""Helpers of bench/pool_isolation.py: checkpoint, processes, load, report."""
