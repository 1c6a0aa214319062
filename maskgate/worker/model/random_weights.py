"""Deterministic random weights in Hugging Face layout, for tiny-random and the benchmarks.

Plain N(0, 0.02) initialisation gives near-flat logits, so every top-p mask would be most of
the vocabulary and greedy decoding would hinge on noise. Instead: embeddings ~ N(0, 1),
projections ~ N(0, 1/fan_in) (so attention mixes context and the residual stream stays O(1)),
and lm_head ~ N(0, logit_std^2 / hidden), which after the final RMSNorm gives logits with a
standard deviation of about `logit_std`. That sets how peaked the next-token distribution is:
with logit_std=3 over 512 tokens a top-p 0.9 mask holds about 35 ids on average; with
logit_std=5 over 151936 tokens, about 100. With tied embeddings the embedding takes the
lm_head's scale (the RMSNorm in front of every layer makes its scale harmless there).
"""

from __future__ import annotations

import math

import torch

from maskgate.worker.model.config import ModelConfig


def random_hf_weights(
    cfg: ModelConfig,
    *,
    seed: int,
    logit_std: float,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Tensors named as in a Hugging Face checkpoint; the same seed gives the same weights."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
        return t.to(dtype)

    h, d = cfg.hidden_size, cfg.head_dim
    q_size, kv_size = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    # A tied embedding is also the lm_head, so it takes the head's scale.
    embed_std = logit_std / math.sqrt(h) if cfg.tie_word_embeddings else 1.0
    out = {"model.embed_tokens.weight": normal((cfg.vocab_size, h), embed_std)}
    for i in range(cfg.num_hidden_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[a + "q_proj.weight"] = normal((q_size, h), 1 / math.sqrt(h))
        out[a + "k_proj.weight"] = normal((kv_size, h), 1 / math.sqrt(h))
        out[a + "v_proj.weight"] = normal((kv_size, h), 1 / math.sqrt(h))
        out[a + "o_proj.weight"] = normal((h, q_size), 1 / math.sqrt(q_size))
        if cfg.qkv_bias:
            out[a + "q_proj.bias"] = normal((q_size,), 0.1)
            out[a + "k_proj.bias"] = normal((kv_size,), 0.1)
            out[a + "v_proj.bias"] = normal((kv_size,), 0.1)
        if cfg.qk_norm:
            # Not all ones, so a test notices if the norm weights are ignored or swapped.
            out[a + "q_norm.weight"] = 1 + normal((d,), 0.1)
            out[a + "k_norm.weight"] = 1 + normal((d,), 0.1)
        out[m + "gate_proj.weight"] = normal((cfg.intermediate_size, h), 1 / math.sqrt(h))
        out[m + "up_proj.weight"] = normal((cfg.intermediate_size, h), 1 / math.sqrt(h))
        out[m + "down_proj.weight"] = normal(
            (h, cfg.intermediate_size), 1 / math.sqrt(cfg.intermediate_size)
        )
        out[f"model.layers.{i}.input_layernorm.weight"] = 1 + normal((h,), 0.1)
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = 1 + normal((h,), 0.1)
    out["model.norm.weight"] = torch.ones(h, device=device, dtype=dtype)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = normal((cfg.vocab_size, h), logit_std / math.sqrt(h))
    return out
