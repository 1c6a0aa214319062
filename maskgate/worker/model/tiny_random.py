"""`tiny-random`: a small Llama with deterministic random weights and a built-in tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained in-process on the short text
below (so any string encodes, and every id decodes), with a ChatML chat template and
`<|im_end|>` as EOS. The same objects can be written out as a Hugging Face directory
(`save_tiny_random`), which both this worker and transformers load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from maskgate.worker.model.config import ModelConfig
from maskgate.worker.model.random_weights import random_hf_weights

SEED = 20241129
LOGIT_STD = 3.0  # see random_weights.py: top-p 0.9 masks of about 35 of 512 ids
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
GENERATION_CONFIG: dict[str, Any] = {"bos_token_id": 0, "eos_token_id": [2, 0]}
_CORPUS = """\
The gateway sends every request that asks for a sampling mask to a pool of workers that
serve nothing else, so the cost of computing masks stays inside that pool. A sampling mask
is the set of token ids the sampler could have drawn from at one step, after top-k, top-p
and min-p have cut the tail of the distribution. Reinforcement learning needs the mask and
the log-prob of the sampled token under the truncated distribution to train correctly.
Hello! How are you today? I am fine, thank you. What is the weather like in the city?
It is sunny and warm, with a light wind from the sea. Let us write a short story about a
small robot that learns to paint. Once upon a time there was a robot named Pix. Every
morning Pix rolled to the window and watched the light change on the hills. One day it
found a box of colours and a brush, and it started to paint what it saw: green fields,
blue rivers, red roofs, and a yellow sun. The people of the town came to see the pictures.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024. Code: def add(a, b): return a + b
print("hello world") for i in range(10): x = x * 2 + 1 if x > 3 else x - 1
Questions and answers: what is two plus two? Four. Which is larger, seven or nine? Nine.
"""


def tiny_config() -> ModelConfig:
    return ModelConfig.from_hf(CONFIG)


def tiny_weights() -> dict[str, torch.Tensor]:
    """float32 CPU tensors in Hugging Face names; identical on every call."""
    return random_hf_weights(tiny_config(), seed=SEED, logit_std=LOGIT_STD)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE of exactly CONFIG['vocab_size'] ids, specials first (ids 0, 1, 2)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer)
    if tok.get_vocab_size() != CONFIG["vocab_size"]:
        raise RuntimeError(f"tiny-random tokenizer has {tok.get_vocab_size()} ids")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def save_tiny_random(path: str | Path) -> Path:
    """Write tiny-random as a Hugging Face directory (config, safetensors, tokenizer)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    save_file(tiny_weights(), str(out / "model.safetensors"), metadata={"format": "pt"})
    tiny_tokenizer().save_pretrained(str(out))
    return out
