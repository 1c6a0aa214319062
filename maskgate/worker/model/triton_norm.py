"""Triton kernels for the decoder's per-token elementwise work: residual add + RMSNorm, and
SiLU(gate) * up. CUDA only; the torch twins in layers.py are the CPU path and the test oracle.

Each kernel rounds where the torch path rounds (the sum to the model dtype before the norm,
the normalised row before the weight, SiLU before the product), so in bfloat16 the two paths
differ only by the float32 reduction order of the mean square.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from maskgate.kernels import FP_FUSION

# One program normalises one row of at most this many columns (hidden sizes reach ~16k).
MAX_NORM_COLS = 65536
SILU_BLOCK = 1024


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    x_row,
    res_row,
    out_row,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < n_cols
    x = tl.load(x_ptr + row * x_row + cols, mask=keep, other=0.0)
    if HAS_RES:
        # The new residual is rounded to the model dtype, as `x + residual` is in torch.
        s = x.to(tl.float32) + tl.load(res_ptr + row * res_row + cols, mask=keep).to(tl.float32)
        x = s.to(x.dtype)
        tl.store(res_ptr + row * res_row + cols, x, mask=keep)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    normed = (h * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_row + cols, (w * normed).to(x.dtype), mask=keep)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_row, out_row, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < n_cols
    gate = tl.load(gu_ptr + row * gu_row + cols, mask=keep, other=0.0)
    up = tl.load(gu_ptr + row * gu_row + n_cols + cols, mask=keep, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * out_row + cols, (act * up.to(tl.float32)).to(gate.dtype), mask=keep)


def _check_rows(name: str, t: torch.Tensor, cols: int) -> None:
    if t.dim() != 2 or t.shape[1] != cols or t.stride(1) != 1:
        raise ValueError(
            f"{name} must be [rows, {cols}] with unit column stride, got shape "
            f"{tuple(t.shape)} strides {t.stride()}"
        )


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x: [N, H]; residual: [N, H] or None; weight: [H] -> normed [N, H] (new tensor).

    With a residual, `residual` is updated in place to `x + residual` and that sum is what
    gets normalised; without one, x itself is normalised. All in the model dtype.
    """
    n, cols = x.shape
    _check_rows("x", x, cols)
    if residual is not None:
        _check_rows("residual", residual, cols)
        if residual.shape[0] != n or residual.dtype != x.dtype:
            raise ValueError("residual must match x in rows and dtype")
    if weight.shape != (cols,) or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous [{cols}] vector")
    if cols > MAX_NORM_COLS:
        raise ValueError(f"rows of {cols} columns exceed the kernel's {MAX_NORM_COLS}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if n == 0:
        return out
    block = triton.next_power_of_2(cols)
    res = residual if residual is not None else x
    _add_rms_norm_kernel[(n,)](
        x,
        res,
        weight,
        out,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        cols,
        eps,
        HAS_RES=residual is not None,
        BLOCK=block,
        num_warps=min(16, max(1, block // 256)),
        enable_fp_fusion=FP_FUSION,
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [N, 2 * I] (gate columns first) -> silu(gate) * up, [N, I]."""
    n, width = gate_up.shape
    if width % 2:
        raise ValueError(f"gate_up must have an even width, got {width}")
    cols = width // 2
    _check_rows("gate_up", gate_up, width)
    out = torch.empty((n, cols), dtype=gate_up.dtype, device=gate_up.device)
    if n == 0:
        return out
    grid = (n, triton.cdiv(cols, SILU_BLOCK))
    _silu_mul_kernel[grid](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        cols,
        BLOCK=SILU_BLOCK,
        num_warps=4,
        enable_fp_fusion=FP_FUSION,
    )
    return out
