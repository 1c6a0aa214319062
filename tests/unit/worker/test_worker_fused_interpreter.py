"""The worker's Triton kernels (worker/model/triton_*.py) against the torch path, on the CPU
through the Triton interpreter (TRITON_INTERPRET=1).

The variable must be set before triton is imported, so each check runs in a fresh Python
process and prints JSON. Everything is float32: the interpreter casts float32 to bfloat16 by
truncation where the GPU rounds to nearest, so bfloat16 parity is checked on the GPU
(tests/gpu/test_worker_fused_gpu.py). Shapes are small and odd: non-power-of-two widths and
head dims, GQA ratios 1, 3 and 4, contexts from 1 key to a full slot.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("triton")

Interpreted = Callable[[str], dict]  # the `interpreted` fixture (tests/unit/conftest.py)
TOL = 2e-5  # float32: the two paths differ only in reduction order

PRELUDE = """
import json
import torch
from torch.nn import functional as F
from maskgate.worker.model.attention import AttnGroup, attend, key_mask
from maskgate.worker.model.config import RopeConfig
from maskgate.worker.model.layers import RMSNorm, RotaryEmbedding, rope_and_store
from maskgate.worker.model.triton_decode_attn import decode_attention
from maskgate.worker.model.triton_norm import add_rms_norm, silu_mul
from maskgate.worker.model import triton_rope

g = torch.Generator().manual_seed(0)
def randn(*shape):
    return torch.randn(*shape, generator=g)
def err(a, b):
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
"""

NORM = """
out = []
for rows, cols in ((1, 1), (7, 99), (3, 111), (2, 2048)):
    x, r, w = randn(rows, cols), randn(rows, cols), randn(cols)
    norm = RMSNorm(cols, 1e-5)
    norm.weight.data = w
    res = r.clone()
    fused = add_rms_norm(x, res, w, 1e-5)
    out.append([err(fused, norm(x + r)), err(res, x + r), err(add_rms_norm(x, None, w, 1e-5), norm(x))])
# Strided rows (a column slice of a wider buffer) read the right elements.
wide = randn(5, 130)
w = randn(99)
norm = RMSNorm(99, 1e-6)
norm.weight.data = w
out.append([err(add_rms_norm(wide[:, 7:106], None, w, 1e-6), norm(wide[:, 7:106])), 0.0, 0.0])
silu = []
for rows, cols in ((1, 1), (5, 77), (2, 1100)):
    gu = randn(rows, 2 * cols)
    gate, up = gu.chunk(2, dim=-1)
    silu.append(err(silu_mul(gu), F.silu(gate) * up))
print(json.dumps({"norm": out, "silu": silu}))
"""

ROPE = """
n, slots_n, max_len = 6, 4, 40
ropes = {
    "default": RopeConfig(theta=10000.0),
    "llama3": RopeConfig(theta=500000.0, kind="llama3", factor=8.0,
                         original_max_position_embeddings=16),
    "linear": RopeConfig(theta=10000.0, kind="linear", factor=2.0),
}
pos = torch.tensor([0, 3, 17, 39, 8, 9])
slots = torch.tensor([0, 1, 2, 3, 1, 1])
report = []
for (q_heads, kv_heads, dim), kind, qk_norm in CASES:
    cos, sin = RotaryEmbedding(ropes[kind], dim)(pos, torch.float32)
    qkv = randn(n, (q_heads + 2 * kv_heads) * dim)
    norms = [RMSNorm(dim, 1e-6) for _ in range(2)] if qk_norm else [None, None]
    for m in norms:
        if m is not None:
            m.weight.data = 1 + randn(dim) * 0.1
    caches = [randn(slots_n, kv_heads, max_len, dim) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    q, k, v = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    ref_q = rope_and_store(
        q.reshape(n, q_heads, dim), k.reshape(n, kv_heads, dim), v.reshape(n, kv_heads, dim),
        cos, sin, *norms, *ref_caches, slots, pos)
    buf = qkv.clone()
    weights = [m.weight if m is not None else None for m in norms]
    tri_q = triton_rope.rope_and_store(buf, cos, sin, *weights, 1e-6, *caches, slots, pos, q_heads)
    report.append({
        "q": err(tri_q, ref_q),
        "in_place": tri_q.data_ptr() == buf.data_ptr(),
        "k_cache": err(caches[0], ref_caches[0]),
        "v_cache": err(caches[1], ref_caches[1]),
        "kv_columns_untouched": bool(torch.equal(buf[:, q_heads * dim:], qkv[:, q_heads * dim:])),
    })
print(json.dumps(report))
"""

ATTN = """
slots_n, max_len = 6, 256
# Rows of different context lengths (1 key to 200), slots out of order.
pos = torch.tensor([0, 1, 36, 130, 199])
slots = torch.tensor([4, 0, 5, 2, 1])
rows = len(pos)
report = []
for q_heads, kv_heads, dim in CASES:
    k_cache = randn(slots_n, kv_heads, max_len, dim)
    v_cache = randn(slots_n, kv_heads, max_len, dim)
    # q as the decoder passes it: a strided [rows, heads, dim] view of a wider qkv buffer.
    buf = randn(rows, (q_heads + 2 * kv_heads) * dim)
    q = buf[:, : q_heads * dim].view(rows, q_heads, dim)
    out = {}
    for window in (None, 5):
        # max_keys: the tightest bound (200) and a key bucket past it, as CUDA graphs pass.
        for max_keys in (200, 256):
            mask = key_mask(pos, max_keys, window, torch.float32)
            group = AttnGroup(slots, mask[:, None, None, :], max_keys, rows, 1, rows, None, None)
            ref = attend(q, k_cache, v_cache, group)
            # 1 split; 4 splits of 64 keys (the longest row spans all four, short rows
            # leave splits empty).
            for splits in (1, 4):
                tri = decode_attention(q, k_cache, v_cache, slots, pos, window, max_keys, splits)
                out[f"w{window}-k{max_keys}-s{splits}"] = err(tri, ref)
    # Keys past a row's position never reach the output, even when they hold NaN.
    k_cache[slots[2], :, 37:] = float("nan")
    v_cache[slots[2], :, 37:] = float("nan")
    tri = decode_attention(q, k_cache, v_cache, slots, pos, None, max_len, 4)
    out["nan_free"] = bool(torch.isfinite(tri).all())
    report.append(out)
print(json.dumps(report))
"""

ROPE_CASES = [
    ((4, 2, 20), "llama3", False),  # GQA 2:1, head_dim 20 (half 10: a padded tile)
    ((6, 2, 16), "default", False),  # GQA 3:1, a Qwen2-like shape
    ((8, 2, 32), "default", True),  # GQA 4:1, Qwen3 per-head q/k norm
    ((3, 3, 48), "linear", False),  # no GQA, head_dim 48
]
# (query heads, KV heads, head_dim): GQA 1, 3, 4 and 3; head dims 16, 20, 48, 64.
ATTN_CASES = [(4, 4, 16), (6, 2, 20), (8, 2, 48), (3, 1, 64)]


def test_add_rms_norm_and_silu_mul_match_torch(interpreted: Interpreted) -> None:
    out = interpreted(PRELUDE + NORM)
    assert len(out["norm"]) == 5 and len(out["silu"]) == 3
    for normed, residual, no_residual in out["norm"]:
        assert normed < TOL and residual == 0.0 and no_residual < TOL
    assert max(out["silu"]) < TOL


def test_rope_and_store_matches_torch(interpreted: Interpreted) -> None:
    report = interpreted(PRELUDE + f"CASES = {ROPE_CASES!r}\n" + ROPE)
    assert len(report) == len(ROPE_CASES)
    for case, out in zip(ROPE_CASES, report, strict=True):
        assert out["q"] < TOL and out["in_place"], case
        assert out["k_cache"] < TOL and out["v_cache"] == 0.0, case
        assert out["kv_columns_untouched"], case


def test_decode_attention_matches_sdpa_over_gathered_keys(interpreted: Interpreted) -> None:
    report = interpreted(PRELUDE + f"CASES = {ATTN_CASES!r}\n" + ATTN)
    assert len(report) == len(ATTN_CASES)
    for case, out in zip(ATTN_CASES, report, strict=True):
        assert out.pop("nan_free"), case
        assert len(out) == 8  # 2 windows x 2 key bounds x 2 split counts
        assert max(out.values()) < TOL, (case, out)
