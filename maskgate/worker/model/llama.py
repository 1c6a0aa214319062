"""The Llama-family decoder (Llama, Mistral, SmolLM2, Qwen2 with qkv bias, Qwen3 with q/k norm).

Runs a flattened batch: input_ids and positions are [N] over all rows of a step, and attention
reads and writes the slot KV cache (see attention.py). Weights load from Hugging Face names;
q/k/v and gate/up are fused into one matmul each at load time. `batch.fused` picks, for the
whole step, the Triton kernels (CUDA) or the torch path (CPU, and the kernels' oracle).
"""

from __future__ import annotations

import torch
from torch import nn

from maskgate.worker.model.attention import AttnBatch, attend
from maskgate.worker.model.config import ModelConfig
from maskgate.worker.model.layers import GatedMLP, RMSNorm, RotaryEmbedding, rope_and_store


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.sliding_window = cfg.sliding_window

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        batch: AttnBatch,
    ) -> torch.Tensor:
        # x: [N, hidden]; kv: this layer's caches, [slots, kv_heads, max_len, head_dim] each
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        cos, sin = rope
        k_cache, v_cache = kv
        if batch.fused:
            # Imported here: triton is needed only on CUDA, as in kernels.sample.
            from maskgate.worker.model import triton_rope

            qn, kn = self.q_norm, self.k_norm
            q = triton_rope.rope_and_store(
                qkv,
                cos,
                sin,
                qn.weight if qn is not None else None,
                kn.weight if kn is not None else None,
                qn.eps if qn is not None else 0.0,
                k_cache,
                v_cache,
                batch.write_slots,
                batch.positions,
                self.num_heads,
            )
        else:
            q, k, v = qkv.split(self.split, dim=-1)
            q = rope_and_store(
                q.view(n, self.num_heads, self.head_dim),
                k.view(n, self.num_kv_heads, self.head_dim),
                v.view(n, self.num_kv_heads, self.head_dim),
                cos,
                sin,
                self.q_norm,
                self.k_norm,
                k_cache,
                v_cache,
                batch.write_slots,
                batch.positions,
            )
        parts = []
        first = 0
        for group in (batch.decode, batch.prefill):
            if group is not None:
                last = first + group.num_tokens
                if batch.fused and group is batch.decode:
                    from maskgate.worker.model.triton_decode_attn import decode_attention

                    # Reads the slots in place; positions are the queries' own.
                    parts.append(
                        decode_attention(
                            q[first:last],
                            k_cache,
                            v_cache,
                            group.slots,
                            batch.positions[first:last],
                            self.sliding_window,
                            group.num_keys,
                        )
                    )
                else:
                    parts.append(attend(q[first:last], k_cache, v_cache, group))
                first = last
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.o_proj(out.reshape(n, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        batch: AttnBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output, [N, hidden]; residual: the stream before it
        (None at the first layer, where x is the embedding). Returns (MLP output, residual);
        the sum is what `x + attn(norm(x))`, `x + mlp(norm(x))` would hold, with each add
        done by the norm that follows it (one fused kernel on the Triton path)."""
        h, residual = self.input_layernorm.add_forward(x, residual, batch.fused)
        h = self.self_attn(h, rope, kv, batch)
        h, residual = self.post_attention_layernorm.add_forward(h, residual, batch.fused)
        return self.mlp(h, batch.fused), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        batch: AttnBatch,
    ) -> torch.Tensor:
        """input_ids, positions: [N] int64 -> final hidden states [N, hidden]."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions, x.dtype)
        residual = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, kv, batch)
        return self.norm.add_forward(x, residual, batch.fused)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, hidden] -> logits [B, vocab] float32."""
        return self.lm_head(hidden).float()

    def load_hf_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up; strict on names."""
        cfg = self.config
        hf = {k.removeprefix("model."): v for k, v in tensors.items()}
        # Some old Llama checkpoints store the rotary buffer; it is recomputed, not loaded.
        hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}
        if cfg.tie_word_embeddings:
            hf.pop("lm_head.weight", None)
        fused: dict[str, torch.Tensor] = {}
        for i in range(cfg.num_hidden_layers):
            a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                parts = [hf.pop(f"{a}{p}_proj.{kind}", None) for p in "qkv"]
                if all(p is not None for p in parts):
                    fused[f"{a}qkv_proj.{kind}"] = torch.cat(parts)  # type: ignore[arg-type]
            gate, up = hf.pop(f"{m}gate_proj.weight", None), hf.pop(f"{m}up_proj.weight", None)
            if gate is not None and up is not None:
                fused[f"{m}gate_up_proj.weight"] = torch.cat([gate, up])
        hf.update(fused)
        own = self.state_dict()
        if cfg.tie_word_embeddings:
            own.pop("lm_head.weight")
        missing = sorted(set(own) - set(hf))
        unexpected = sorted(set(hf) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match the {cfg.model_type} architecture: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for name, param in own.items():
                src = hf[name]
                if src.shape != param.shape:
                    raise ValueError(
                        f"checkpoint tensor {name} has shape {tuple(src.shape)}, "
                        f"expected {tuple(param.shape)}"
                    )
                param.copy_(src)
