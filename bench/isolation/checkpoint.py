"""A random-weights checkpoint shaped like Qwen2.5-1.5B, written once as a Hugging Face directory.

The worker loads models from a directory (config.json, safetensors, tokenizer). No tokenizer
of the real model is available offline, so the directory carries tiny-random's byte-level
tokenizer (512 ids): prompts are sent as input_ids, and output ids past the tokenizer decode to
nothing, which only empties the `text` field. Weights follow maskgate/worker/model/random_weights.py
with the shape and logit_std of bench/shapes.py, as bench/worker_decode.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bench import shapes
from maskgate.worker.model.config import ModelConfig
from maskgate.worker.model.random_weights import random_hf_weights
from maskgate.worker.model.tiny_random import tiny_tokenizer

# config.json: the benchmark shape and the keys a Hugging Face directory carries besides.
QWEN25_15B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    **shapes.QWEN25_15B,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "torch_dtype": "bfloat16",
}
LLAMA32_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    **shapes.LLAMA32_1B,
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}
SEED = 0


def write_checkpoint(path: Path, device: str, config: dict[str, Any] = QWEN25_15B) -> float:
    """Write the checkpoint of `config` (Qwen2.5-1.5B's by default) to `path` (skipped when
    already there); returns seconds spent.

    The weights are drawn on `device` (seconds on a GPU, minutes on a CPU) and saved as bf16.
    """
    t0 = time.monotonic()
    if (path / "model.safetensors").is_file():
        return 0.0
    path.mkdir(parents=True, exist_ok=True)
    weights = random_hf_weights(
        ModelConfig.from_hf(config),
        seed=SEED,
        logit_std=shapes.LOGIT_STD,
        device=device,
        dtype=torch.bfloat16,
    )
    cpu = {k: v.cpu().contiguous() for k, v in weights.items()}
    del weights
    save_file(cpu, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tiny_tokenizer().save_pretrained(str(path))
    return time.monotonic() - t0
