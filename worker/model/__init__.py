"""Llama-family models: loading by spec, the built-in tiny-random model, GGUF conversion."""

from worker.model.config import ModelConfig, ModelConfigError
from worker.model.gguf_convert import ModelFetchError, cache_root, ensure_smollm2
from worker.model.loader import LoadedModel, ModelLoadError, load
from worker.model.tiny_random import save_tiny_random

__all__ = [
    "LoadedModel",
    "ModelConfig",
    "ModelConfigError",
    "ModelFetchError",
    "ModelLoadError",
    "cache_root",
    "ensure_smollm2",
    "load",
    "save_tiny_random",
]
