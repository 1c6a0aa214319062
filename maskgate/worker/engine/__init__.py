"""The engine: request state, continuous batching, the prefix cache and the engine loop.

Everything here but the KV cache's allocation (`kv_cache.py`) stays torch-free: the engine and
the scheduler hand `RowWork` to a runner through the step contract in `batch.py` and never
touch a tensor.
"""
