"""Llama-family models: loading by spec, the built-in tiny-random model, GGUF conversion."""

from maskgate.worker.model.config import ModelConfig, ModelConfigError
from maskgate.worker.model.gguf_convert import ModelFetchError, cache_root, ensure_smollm2
from maskgate.worker.model.loader import LoadedModel, ModelLoadError, load
from maskgate.worker.model.tiny_random import save_tiny_random

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
