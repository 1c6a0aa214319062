"""config.json parsing: both transformers layouts, rope scaling, and clear errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from maskgate.worker.model import ModelConfig, ModelConfigError
from maskgate.worker.model.layers import rope_inv_freq

BASE: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_defaults_and_derived_fields() -> None:
    cfg = ModelConfig.from_hf(BASE)
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope.theta) == (16, 4, 10000.0)
    assert not cfg.qkv_bias and not cfg.qk_norm and cfg.sliding_window is None
    qwen2 = ModelConfig.from_hf({**BASE, "model_type": "qwen2", "sliding_window": 4096})
    assert qwen2.qkv_bias and qwen2.sliding_window is None  # use_sliding_window is false
    assert ModelConfig.from_hf({**BASE, "model_type": "qwen3"}).qk_norm
    mistral = ModelConfig.from_hf({**BASE, "model_type": "mistral", "sliding_window": 8})
    assert mistral.sliding_window == 8


def test_rope_parameters_read_from_v4_and_v5_layouts() -> None:
    v4 = ModelConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": LLAMA3})
    v5 = ModelConfig.from_hf({**BASE, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}})
    assert v4.rope == v5.rope and v4.rope.kind == "llama3" and v4.rope.theta == 500000.0
    old_key = {**BASE, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert ModelConfig.from_hf(old_key).rope.factor == 4.0


def test_llama3_frequencies_match_transformers() -> None:
    raw = {**BASE, "hidden_size": 2048, "num_attention_heads": 32}
    raw["rope_parameters"] = {**LLAMA3, "rope_theta": 500000.0}
    ours = rope_inv_freq(ModelConfig.from_hf(raw).rope, 64)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**raw), torch.device("cpu"))
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_unsupported_configs_fail_clearly(change: dict[str, Any], message: str) -> None:
    raw = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf(raw)
