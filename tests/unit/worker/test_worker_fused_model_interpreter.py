"""The whole decoder on its fused path (every Triton kernel, interpreted on the CPU) against
its torch path, for each architecture: Llama (llama3 rope), Qwen2 (q/k/v bias, GQA 4:1),
Qwen3 (per-head q/k norm, head_dim not hidden / heads) and Mistral (sliding window).

Both paths start from the same weights and empty caches and run the same three steps:
a prefill of two rows of different lengths, a step mixing a decode row with a new prompt
(decode rows first, as the runner orders them), and a decode step of all three rows. The
final hidden states and the KV caches must agree to float32 tolerance after every step.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)

SCRIPT = """
import json
import torch
from maskgate.worker.model.attention import build_attn_batch
from maskgate.worker.model.config import ModelConfig
from maskgate.worker.model.llama import LlamaForCausalLM
from maskgate.worker.model.random_weights import random_hf_weights

COMMON = {"vocab_size": 300, "hidden_size": 48, "intermediate_size": 72, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
ARCHS = {
    "llama": {"model_type": "llama", "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 1, "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "head_dim": 20, "num_attention_heads": 6},
    "mistral": {"model_type": "mistral", "sliding_window": 4},
}
# (slot, token ids, start position): decode rows (one token) before prefill rows.
STEPS = [
    [(0, [5, 9, 2, 77, 31], 0), (1, [8] * 3 + [150, 3, 12, 99, 4, 1], 0)],
    [(0, [17], 5), (2, [250, 6, 44], 0)],
    [(0, [3], 6), (1, [299], 9), (2, [0], 3)],
]
report = {}
for arch, extra in ARCHS.items():
    cfg = ModelConfig.from_hf({**COMMON, **extra})
    model = LlamaForCausalLM(cfg)
    model.load_hf_weights(random_hf_weights(cfg, seed=5, logit_std=3.0))
    model.eval().requires_grad_(False)
    shape = (4, cfg.num_key_value_heads, 32, cfg.head_dim)
    caches = {f: [(torch.zeros(shape), torch.zeros(shape)) for _ in range(2)] for f in (0, 1)}
    errs = []
    for rows in STEPS:
        ids = torch.tensor([t for _, toks, _ in rows for t in toks])
        pos = torch.tensor([s + i for _, toks, s in rows for i in range(len(toks))])
        slots = torch.tensor([slot for slot, toks, _ in rows for _ in toks])
        out = {}
        for fused in (0, 1):
            batch = build_attn_batch(
                slots, pos, [len(t) for _, t, _ in rows], [r[0] for r in rows],
                [r[2] for r in rows], cfg.num_attention_heads // cfg.num_key_value_heads,
                cfg.sliding_window, torch.float32, fused=bool(fused))
            with torch.inference_mode():
                out[fused] = model(ids, pos, caches[fused], batch)
        kv = max((a - b).abs().max().item()
                 for la, lb in zip(caches[0], caches[1]) for a, b in zip(la, lb))
        errs.append([(out[0] - out[1]).abs().max().item(), kv, out[0].abs().max().item()])
    report[arch] = errs
print(json.dumps(report))
"""


def test_fused_decoder_matches_torch_path_for_every_architecture(
    interpreted: Interpreted,
) -> None:
    report = interpreted(SCRIPT)
    assert sorted(report) == ["llama", "mistral", "qwen2", "qwen3"]
    for arch, steps in report.items():
        assert len(steps) == 3
        for hidden_err, kv_err, scale in steps:
            # Hidden states after the final RMSNorm are O(1) (scale > 0.5 shows they are
            # real values, not zeros on both sides).
            assert scale > 0.5, arch
            assert hidden_err < 1e-4 and kv_err < 1e-4, (arch, steps)
