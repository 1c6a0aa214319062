"""Logits of worker.model match transformers' own implementation of the same checkpoint.

Each architecture's tiny random checkpoint is written to a temporary directory (config.json,
safetensors, tokenizer) and both implementations load it from there. Compared at every
position through three paths of the runner: one full prefill, chunked prefill, and
token-by-token decode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.model import ModelConfig, load
from maskgate.worker.model.random_weights import random_hf_weights
from maskgate.worker.model.tiny_random import tiny_tokenizer
from maskgate.worker.runner.runner import ModelRunner

_COMMON = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "eos_token_id": 2,
}
ARCHS = {
    # GQA 2:1, untied head, Llama 3.1 rope scaling (original context small enough that the
    # head_dim=16 frequencies fall in all three bands).
    "llama": {
        "model_type": "llama",
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    # q/k/v bias, GQA 4:1, tied embeddings.
    "qwen2": {
        "model_type": "qwen2",
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
    },
    # per-head q/k RMSNorm, head_dim not hidden/heads, tied embeddings.
    "qwen3": {
        "model_type": "qwen3",
        "head_dim": 32,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
    },
    # sliding window shorter than the sequence, linear rope scaling.
    "mistral": {
        "model_type": "mistral",
        "sliding_window": 6,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
}
ATOL = 1e-4


def write_checkpoint(path: Path, arch: str) -> Path:
    raw = {**_COMMON, **ARCHS[arch]}
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(raw))
    weights = random_hf_weights(ModelConfig.from_hf(raw), seed=7, logit_std=3.0)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    tiny_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / request.param, request.param)


def test_logits_match_transformers(checkpoint: Path) -> None:
    ids = torch.randint(0, 512, (23,), generator=torch.Generator().manual_seed(3)).tolist()
    hf = AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]  # [len, vocab]
    # Peaked enough that a wrong token at the top would show, not lost in a flat row.
    assert ref.std(dim=-1).min() > 1.0

    loaded = load(str(checkpoint))
    assert loaded.vocab_size == 512 and 2 in loaded.eos_token_ids
    runner = ModelRunner(loaded, max_num_slots=3, max_model_len=64)

    full = runner.logits([RowWork(slot=0, token_ids=ids, start_pos=0, sample=True)])
    torch.testing.assert_close(full[0], ref[-1], atol=ATOL, rtol=0)

    for start in range(0, len(ids), 5):
        chunk = ids[start : start + 5]
        out = runner.logits([RowWork(slot=1, token_ids=chunk, start_pos=start, sample=True)])
        torch.testing.assert_close(out[0], ref[start + len(chunk) - 1], atol=ATOL, rtol=0)

    for pos, tok in enumerate(ids):
        out = runner.logits([RowWork(slot=2, token_ids=[tok], start_pos=pos, sample=True)])
        torch.testing.assert_close(out[0], ref[pos], atol=ATOL, rtol=0)


def test_tokenizer_and_chat_template_load_from_the_directory(checkpoint: Path) -> None:
    tok = load(str(checkpoint)).tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode("a robot paints")) == "a robot paints"
