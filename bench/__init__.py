"""maskgate's benchmarks, each run as `python -m bench.<name>`."""
