"""The worker's Triton kernels on CUDA, bfloat16, at real shapes (Llama-3.2-1B, Qwen2.5-1.5B,
Qwen3-1.7B), against the torch path; then ModelRunner logits with the fused path against the
unfused one through prefill, CUDA-graph decode and a mixed step.

The kernels round where torch rounds, so elementwise results agree to within a few bf16 ulps
(the float32 mean square, and so rstd, may differ in its last bit); attention is held to a
float32 reference as tightly as SDPA itself is.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.model.attention import AttnGroup, attend, key_mask
from maskgate.worker.model.config import ModelConfig, RopeConfig
from maskgate.worker.model.layers import RMSNorm, RotaryEmbedding, rope_and_store
from maskgate.worker.model.triton_decode_attn import decode_attention
from maskgate.worker.model.triton_norm import add_rms_norm, silu_mul
from maskgate.worker.model.triton_rope import rope_and_store as rope_and_store_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BF16 = torch.bfloat16
ULP = 2.0**-7  # bf16 relative spacing: 8 significant bits
LLAMA3 = RopeConfig(500000.0, "llama3", 32.0, 1.0, 4.0, 8192)
# name: (hidden, intermediate, heads, kv_heads, head_dim, rope, qk_norm)
SHAPES = {
    "llama-3.2-1b": (2048, 8192, 32, 8, 64, LLAMA3, False),
    "qwen2.5-1.5b": (1536, 8960, 12, 2, 128, RopeConfig(1000000.0), False),
    "qwen3-1.7b": (2048, 6144, 16, 8, 128, RopeConfig(1000000.0), True),
}


def randn(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("rows", [1, 64, 129])
def test_add_rms_norm_and_silu_mul(name: str, rows: int) -> None:
    hidden, inter = SHAPES[name][:2]
    x, res, w = randn(rows, hidden), randn(rows, hidden), randn(hidden) * 0.2 + 1
    norm = RMSNorm(hidden, 1e-5).cuda().to(BF16)
    norm.weight.data = w
    summed = res.clone()
    out = add_rms_norm(x, summed, w, 1e-5)
    assert torch.equal(summed, x + res)  # the same rounding of the sum
    torch.testing.assert_close(out, norm(x + res), rtol=4 * ULP, atol=1e-3)
    torch.testing.assert_close(add_rms_norm(x, None, w, 1e-5), norm(x), rtol=4 * ULP, atol=1e-3)
    gate_up = randn(rows, 2 * inter) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), F.silu(gate) * up, rtol=4 * ULP, atol=1e-3)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_rope_and_store(name: str) -> None:
    _, _, heads, kv_heads, dim, rope, qk_norm = SHAPES[name]
    n, slots, max_len = 300, 9, 8192
    pos = torch.randint(0, max_len, (n,), device="cuda")
    slot = torch.randint(0, slots, (n,), device="cuda")
    # One token per (slot, position): duplicate writes would race on either path.
    pos = pos.unique()[:n]
    n = pos.numel()
    slot = slot[:n]
    cos, sin = RotaryEmbedding(rope, dim).cuda()(pos, BF16)
    qkv = randn(n, (heads + 2 * kv_heads) * dim) * 2
    norms = [None, None]
    if qk_norm:
        norms = [RMSNorm(dim, 1e-6).cuda().to(BF16) for _ in range(2)]
        for m in norms:
            m.weight.data = randn(dim) * 0.1 + 1
    caches = [torch.zeros(slots, kv_heads, max_len, dim, device="cuda", dtype=BF16) for _ in "kv"]
    ref_caches = [c.clone() for c in caches]
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    ref_q = rope_and_store(
        q.reshape(n, heads, dim),
        k.reshape(n, kv_heads, dim),
        v.reshape(n, kv_heads, dim),
        cos,
        sin,
        *norms,
        *ref_caches,
        slot,
        pos,
    )
    weights = [m.weight if m is not None else None for m in norms]
    tri_q = rope_and_store_triton(qkv, cos, sin, *weights, 1e-6, *caches, slot, pos, heads)
    torch.testing.assert_close(tri_q, ref_q, rtol=4 * ULP, atol=2e-2)
    torch.testing.assert_close(caches[0], ref_caches[0], rtol=4 * ULP, atol=2e-2)
    assert torch.equal(caches[1], ref_caches[1])


@pytest.mark.parametrize(
    ("name", "rows", "max_keys", "window"),
    [
        ("llama-3.2-1b", 64, 256, None),  # the benchmark's decode shape and key bucket
        ("llama-3.2-1b", 128, 512, None),
        ("qwen2.5-1.5b", 1, 8192, None),  # one long row: the split (flash-decoding) path
        ("qwen2.5-1.5b", 16, 2048, 300),  # sliding window
        ("qwen3-1.7b", 33, 1024, None),
    ],
)
def test_decode_attention(name: str, rows: int, max_keys: int, window: int | None) -> None:
    _, _, heads, kv_heads, dim, _, _ = SHAPES[name]
    slots, max_len = rows + 1, max_keys
    k_cache, v_cache = randn(slots, kv_heads, max_len, dim), randn(slots, kv_heads, max_len, dim)
    pos = torch.randint(0, max_keys, (rows,), device="cuda")
    pos[0] = max_keys - 1  # one row uses the whole bound
    slot = torch.randperm(slots, device="cuda")[:rows]
    qkv = randn(rows, (heads + 2 * kv_heads) * dim)
    q = qkv[:, : heads * dim].view(rows, heads, dim)  # strided, as the decoder passes it
    out = decode_attention(q, k_cache, v_cache, slot, pos, window, max_keys)

    def sdpa(dtype: torch.dtype) -> torch.Tensor:
        mask = key_mask(pos, max_keys, window, dtype)[:, None, None, :]
        group = AttnGroup(slot, mask, max_keys, rows, 1, rows, None, None)
        return attend(q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), group)

    ref32, ref16 = sdpa(torch.float32), sdpa(BF16)
    ours = (out.float() - ref32).abs().max().item()
    theirs = (ref16.float() - ref32).abs().max().item()
    assert ours <= max(2 * theirs, 1e-2), (ours, theirs)


def test_decode_attention_replays_in_a_cuda_graph() -> None:
    k_cache, v_cache = randn(5, 8, 512, 64), randn(5, 8, 512, 64)
    q = randn(4, 32, 64)
    slot = torch.tensor([3, 0, 1, 2], device="cuda")
    pos = torch.tensor([10, 200, 511, 0], device="cuda")
    for splits in (1, 4):
        decode_attention(q, k_cache, v_cache, slot, pos, None, 512, splits)  # compile
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decode_attention(q, k_cache, v_cache, slot, pos, None, 512, splits)
        pos.copy_(torch.tensor([300, 7, 64, 128]))
        q.copy_(randn(4, 32, 64))
        graph.replay()
        fresh = decode_attention(q, k_cache, v_cache, slot, pos, None, 512, splits)
        assert torch.equal(out, fresh)


def _runner_logits(
    name: str, dtype: torch.dtype, fused: bool, kv_bytes: int, steps: int = 8
) -> list:
    """Prefill 5 rows, decode `steps` steps (graphs; 5 rows, then 3), then one mixed step.
    kv_bytes: the KV budget (tests/gpu/conftest.py)."""
    from maskgate.worker.model.loader import build
    from maskgate.worker.model.random_weights import random_hf_weights
    from maskgate.worker.model.tiny_random import tiny_tokenizer
    from maskgate.worker.runner.runner import ModelRunner

    hidden, inter, heads, kv_heads, dim, rope, qk_norm = SHAPES[name]
    raw = {
        "model_type": "qwen3" if qk_norm else ("qwen2" if kv_heads == 2 else "llama"),
        # tiny-random's vocabulary: the sampler's Triton variants (compiled per vocabulary
        # at runner start) are then shared with test_worker_runner_cuda.py.
        "vocab_size": 512,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 4,  # real layer shapes, fewer layers: a quicker test
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": dim,
        "max_position_embeddings": 4096,
        "rope_theta": rope.theta,
        "tie_word_embeddings": True,
    }
    if rope.kind == "llama3":
        raw["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": rope.factor,
            "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
        }
    cfg = ModelConfig.from_hf(raw)
    # bf16 weights for every run, upcast for float32: all runs share the same model.
    weights = random_hf_weights(cfg, seed=1, logit_std=5.0, device="cuda", dtype=BF16)
    weights = {k: v.to(dtype) for k, v in weights.items()}
    loaded = build(
        name, raw, weights, tiny_tokenizer(), frozenset({0}), torch.device("cuda"), dtype
    )
    runner = ModelRunner(
        loaded, max_num_slots=6, max_model_len=640, fused_kernels=fused, kv_cache_bytes=kv_bytes
    )
    assert runner.fused is fused
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (300, 7, 129, 1, 64)]
    outs = [runner.logits([RowWork(i, s, 0, sample=True) for i, s in enumerate(seqs)])]
    pos = [len(s) for s in seqs]
    for step in range(steps):
        live = range(5) if step % 2 == 0 else (0, 2, 4)
        rows = [RowWork(i, [(step * 31 + i) % 500 + 3], pos[i], sample=True) for i in live]
        outs.append(runner.logits(rows))
        for i in live:
            pos[i] += 1
    mixed = [RowWork(0, [11], pos[0], sample=True), RowWork(5, seqs[2][:50], 0, sample=True)]
    outs.append(runner.logits(mixed))
    assert runner.graphs is not None and runner.graphs.num_replays == steps
    return [o.float().cpu() for o in outs]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_runner_fused_logits_match_unfused(name: str, kv_bytes: int) -> None:
    ref = _runner_logits(name, torch.float32, fused=False, kv_bytes=kv_bytes)
    fused32 = _runner_logits(name, torch.float32, fused=True, kv_bytes=kv_bytes)
    for a, b in zip(fused32, ref, strict=True):
        # Logits have a std of ~5; a wrong position, slot or head moves them by O(1).
        torch.testing.assert_close(a, b, atol=2e-2, rtol=0)
    fused16 = _runner_logits(name, BF16, fused=True, kv_bytes=kv_bytes)
    plain16 = _runner_logits(name, BF16, fused=False, kv_bytes=kv_bytes)
    for step, (f, p, r) in enumerate(zip(fused16, plain16, ref, strict=True)):
        # bfloat16 drifts from float32 on both paths; the fused one must not drift more.
        ours, theirs = (f - r).abs(), (p - r).abs()
        assert ours.mean() <= 1.5 * theirs.mean() + 1e-3, (step, ours.mean(), theirs.mean())
        assert ours.max() <= 2 * theirs.max() + 0.05, (step, ours.max(), theirs.max())
