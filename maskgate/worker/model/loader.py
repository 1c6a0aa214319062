"""Load a model by spec: a Hugging Face directory, a .gguf file, `tiny-random` or `smollm2`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from maskgate.worker.model import tiny_random
from maskgate.worker.model.config import ModelConfig
from maskgate.worker.model.gguf_convert import ensure_gguf_converted, ensure_smollm2
from maskgate.worker.model.layers import rope_inv_freq
from maskgate.worker.model.llama import LlamaForCausalLM

Progress = Callable[[str], None]


class ModelLoadError(ValueError):
    """The model spec names nothing loadable; the message says what is wrong."""


@dataclass(slots=True)
class LoadedModel:
    name: str  # served model name
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length, e.g. Qwen pads it)."""
        return self.config.vocab_size


def load(
    spec: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
    cache_dir: Path | None = None,
) -> LoadedModel:
    """Load `spec` onto `device`; dtype defaults to float32 on CPU, bfloat16 on CUDA.
    `cache_dir`: where converted models live (default: `gguf_convert.cache_root()`)."""
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    say = progress or (lambda _msg: None)
    if spec == "tiny-random":
        return build(
            "tiny-random",
            tiny_random.CONFIG,
            tiny_random.tiny_weights(),
            tiny_random.tiny_tokenizer(),
            _eos_ids(tiny_random.CONFIG, tiny_random.GENERATION_CONFIG, None),
            dev,
            dtype,
        )
    if spec == "smollm2":
        return load_hf_dir(ensure_smollm2(cache_dir, progress=say), dev, dtype, say, name="smollm2")
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return load_hf_dir(ensure_gguf_converted(path, cache_dir, progress=say), dev, dtype, say)
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"model {spec!r} is not 'tiny-random', 'smollm2', a .gguf file, or a directory "
            "with config.json"
        )
    return load_hf_dir(path, dev, dtype, say)


def load_hf_dir(
    path: Path,
    device: torch.device,
    dtype: torch.dtype,
    say: Progress,
    name: str | None = None,
) -> LoadedModel:
    """config.json + *.safetensors + tokenizer (with chat template), all read offline."""
    raw = json.loads((path / "config.json").read_text())
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    say(f"loading {path.name}: {len(files)} safetensors file(s) to {device} as {dtype}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f), device="cpu"))
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    gen_path = path / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    eos = _eos_ids(raw, gen, tokenizer)
    return build(name or path.name, raw, tensors, tokenizer, eos, device, dtype)


def build(
    name: str,
    raw_config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    tokenizer: PreTrainedTokenizerBase,
    eos_token_ids: frozenset[int],
    device: torch.device,
    dtype: torch.dtype,
) -> LoadedModel:
    """Instantiate the decoder from a config dict and Hugging Face-named tensors."""
    cfg = ModelConfig.from_hf(raw_config)
    # Build on the meta device (no random init of weights about to be overwritten), then
    # allocate on the target device; the rotary buffer is not a weight and is rebuilt.
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary.inv_freq = rope_inv_freq(cfg.rope, cfg.head_dim).to(device)
    model.load_hf_weights(tensors)
    model.eval().requires_grad_(False)
    if not eos_token_ids:
        raise ModelLoadError(f"{name}: no EOS token id in config, generation config or tokenizer")
    return LoadedModel(name, cfg, model, tokenizer, eos_token_ids, device, dtype)


def _eos_ids(
    raw: dict[str, Any], gen: dict[str, Any], tokenizer: PreTrainedTokenizerBase | None
) -> frozenset[int]:
    ids: set[int] = set()
    for value in (raw.get("eos_token_id"), gen.get("eos_token_id")):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
