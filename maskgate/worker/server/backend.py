"""Loading the model and its runner from the config: the one place the server touches torch.

Imports of torch and the model code happen inside `load_backend`, so that importing the
server (and the `maskgate` CLI) stays torch-free until a worker actually starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maskgate.worker.config import WorkerConfig
from maskgate.worker.engine.batch import Runner

log = logging.getLogger("maskgate.worker")


@dataclass(slots=True)
class Backend:
    runner: Runner
    tokenizer: Any  # HF-style: encode / decode / apply_chat_template
    model_name: str


def load_backend(config: WorkerConfig) -> Backend:
    import torch

    from maskgate.worker.model import load
    from maskgate.worker.runner.runner import ModelRunner

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    dtype = None if config.dtype == "auto" else getattr(torch, config.dtype)
    if config.cpu_threads is not None:
        torch.set_num_threads(config.cpu_threads)
    log.info("loading model %s on %s", config.model, device)
    loaded = load(
        config.model,
        device,
        dtype,
        progress=lambda msg: log.info("%s", msg),
        cache_dir=Path(config.cache_dir) if config.cache_dir else None,
    )
    runner = ModelRunner(
        loaded,
        max_num_slots=config.max_num_seqs,
        max_model_len=config.max_model_len,
        kv_cache_bytes=None if config.kv_memory_gb is None else int(config.kv_memory_gb * 2**30),
        max_mask_tokens=config.max_mask_tokens,
        cuda_graphs=config.cuda_graphs,
        fused_kernels=config.fused_kernels,
        mask_impl=config.mask_impl,
    )
    log.info(
        "runner ready: %d KV slots x %d tokens, vocab %d",
        runner.max_num_slots,
        runner.max_model_len,
        runner.vocab_size,
    )
    return Backend(runner=runner, tokenizer=loaded.tokenizer, model_name=loaded.name)
