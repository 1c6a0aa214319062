"""Every Triton kernel of maskgate/worker/model compiles for an H100/H200 (sm_90), without a GPU.

The interpreter tests run the kernels' logic in numpy; they do not lower them. Lowering
catches what only the compiler sees (tl.dot shape limits, type promotion in loops, layouts),
so each kernel variant the runner launches on a Llama-3.2-1B or Qwen2.5-1.5B shape is compiled
here to a cubin with the ptxas that ships with Triton.
"""

from __future__ import annotations

from typing import Any

import pytest

triton = pytest.importorskip("triton")

from maskgate.worker.model import triton_decode_attn, triton_norm, triton_rope  # noqa: E402

I64 = {"c_slot": "i64"}  # slot strides exceed int32 for long slots


def _attn(dt: str, group: int, dim: int, split: bool, window: bool) -> tuple[Any, dict, dict]:
    sig = {p: f"*{dt}" for p in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    sig.update({p: "*i64" for p in ("slot_ptr", "pos_ptr")})
    sig.update({p: "*fp32" for p in ("m_ptr", "l_ptr", "acc_ptr")})
    sig.update(q_row="i32", c_slot="i64", c_head="i32", c_pos="i32")
    sig.update(scale_log2="fp32", window="i32", part="i32")
    const = {
        "G": group,
        "D": dim,
        "BLOCK_G": max(16, triton.next_power_of_2(group)),
        "BLOCK_D": triton.next_power_of_2(dim),
        "BLOCK": triton_decode_attn.BLOCK_N,
        "SPLIT": split,
        "HAS_WINDOW": window,
        "PRECISION": "ieee" if dt == "fp32" else "tf32",
    }
    return triton_decode_attn._decode_attn_kernel, sig, const


def _rope(heads: int, kv_heads: int, dim: int, qk_norm: bool) -> tuple[Any, dict, dict]:
    sig = {p: "*bf16" for p in ("qkv_ptr", "cos_ptr", "sin_ptr", "qw_ptr", "kw_ptr")}
    sig.update(slot_ptr="*i64", pos_ptr="*i64", kc_ptr="*bf16", vc_ptr="*bf16")
    sig.update(qkv_row="i32", cos_row="i32", c_slot="i64", c_head="i32", c_pos="i32")
    sig["eps"] = "fp32"
    const = {
        "H": heads,
        "KVH": kv_heads,
        "HALF": dim // 2,
        "BLOCK_H": triton.next_power_of_2(heads),
        "BLOCK_HALF": triton.next_power_of_2(dim // 2),
        "QK_NORM": qk_norm,
    }
    return triton_rope._rope_store_kernel, sig, const


NORM_SIG = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16"}
NORM_SIG.update(x_row="i32", res_row="i32", out_row="i32", n_cols="i32", eps="fp32")
SILU_SIG = {"gu_ptr": "*bf16", "out_ptr": "*bf16", "gu_row": "i32", "out_row": "i32"}
SILU_SIG["n_cols"] = "i32"
COMBINE_SIG = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "out_ptr": "*bf16"}
COMBINE_SIG["num_splits"] = "i32"

VARIANTS = {
    "add_rms_norm": (
        triton_norm._add_rms_norm_kernel,
        NORM_SIG,
        {"HAS_RES": True, "BLOCK": 2048},
    ),
    "silu_mul": (triton_norm._silu_mul_kernel, SILU_SIG, {"BLOCK": triton_norm.SILU_BLOCK}),
    "rope_llama": _rope(32, 8, 64, False),
    "rope_qwen3": _rope(16, 8, 128, True),
    "attn_llama_bf16": _attn("bf16", 4, 64, False, False),
    "attn_qwen_split_window": _attn("bf16", 6, 128, True, True),
    "attn_fp32_ieee": _attn("fp32", 4, 64, False, False),
    "combine": (
        triton_decode_attn._combine_kernel,
        COMBINE_SIG,
        {"D": 128, "BLOCK_S": triton_decode_attn.MAX_SPLITS, "BLOCK_D": 128},
    ),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_kernel_compiles_for_sm90(name: str, sm90_compile: Any) -> None:
    fn, sig, const = VARIANTS[name]
    sm90_compile(fn, sig, const)
