"""Checks and normalises the arguments of kernels.sample (shapes, dtypes, devices).

Only metadata is inspected: no value of a device tensor is read, so checking costs no host
synchronisation on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Token ids are stored as int32 and packed into the low 32 bits of the order keys.
MAX_VOCAB = 2**31 - 1


@dataclass(frozen=True)
class SampleInputs:
    logits: torch.Tensor  # [B, V] float32 | bfloat16 | float16
    temperature: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int32, -1 or 0 = off
    top_p: torch.Tensor  # [B] float32
    min_p: torch.Tensor  # [B] float32
    want_mask: torch.Tensor  # [B] bool, on the host (it sizes the outputs)
    bounded: torch.Tensor  # [B] bool, on logits.device
    seed: torch.Tensor | None  # [B] int64 or None (noise from torch's generator)
    step: torch.Tensor | None  # [B] int64 or None
    max_mask_tokens: int

    @property
    def batch(self) -> int:
        return self.logits.shape[0]

    @property
    def vocab(self) -> int:
        return self.logits.shape[1]


def _check_row_tensor(
    name: str, t: object, dtype: torch.dtype, batch: int, device: torch.device
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}], got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (like logits), got {t.device}")
    return t.contiguous()


_ZEROS: dict[tuple[torch.dtype, torch.device, int], torch.Tensor] = {}


def _zeros(batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[batch] zeros for an argument left out (bounded, step). Neither path writes these, so
    one buffer per dtype, device and stream serves every call (a fill launch cost ~25 us of
    host time on CUDA; per stream, so the fill is ordered before every use); inside a CUDA
    graph capture a fresh one belongs to the graph instead."""
    stream = 0
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(batch, dtype=dtype, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
    buf = _ZEROS.get((dtype, device, stream))
    if buf is None or buf.numel() < batch:
        buf = torch.zeros(max(batch, 256), dtype=dtype, device=device)
        _ZEROS[(dtype, device, stream)] = buf
    return buf[:batch]


def check_inputs(
    logits: object,
    temperature: object,
    top_k: object,
    top_p: object,
    min_p: object,
    want_mask: object,
    *,
    max_mask_tokens: object,
    seed: object = None,
    step: object = None,
    bounded: object = None,
) -> SampleInputs:
    """Validates every argument; raises TypeError (wrong type/dtype) or ValueError (shape,
    device, range of a host-side value) with a message naming the argument."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [B, V], got {list(logits.shape)}")
    batch, vocab = logits.shape
    if batch < 1 or vocab < 1:
        raise ValueError(f"logits must have B >= 1 and V >= 1, got {list(logits.shape)}")
    if vocab > MAX_VOCAB:
        raise ValueError(f"vocabulary size {vocab} exceeds {MAX_VOCAB}")
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary (stride(1) == 1)")
    if isinstance(max_mask_tokens, bool) or not isinstance(max_mask_tokens, int):
        raise TypeError(f"max_mask_tokens must be an int, got {type(max_mask_tokens).__name__}")
    if max_mask_tokens < 1:
        raise ValueError(f"max_mask_tokens must be >= 1, got {max_mask_tokens}")
    dev = logits.device
    temperature = _check_row_tensor("temperature", temperature, torch.float32, batch, dev)
    top_k = _check_row_tensor("top_k", top_k, torch.int32, batch, dev)
    top_p = _check_row_tensor("top_p", top_p, torch.float32, batch, dev)
    min_p = _check_row_tensor("min_p", min_p, torch.float32, batch, dev)
    want = _check_row_tensor("want_mask", want_mask, torch.bool, batch, torch.device("cpu"))
    if bounded is None:
        bounded_t = _zeros(batch, torch.bool, dev)
    else:
        bounded_t = _check_row_tensor("bounded", bounded, torch.bool, batch, dev)
    if seed is None:
        if step is not None:
            raise ValueError("step was given without seed; pass both or neither")
        seed_t, step_t = None, None
    else:
        seed_t = _check_row_tensor("seed", seed, torch.int64, batch, dev)
        if step is None:
            step_t = _zeros(batch, torch.int64, dev)
        else:
            step_t = _check_row_tensor("step", step, torch.int64, batch, dev)
    return SampleInputs(
        logits=logits,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        want_mask=want,
        bounded=bounded_t,
        seed=seed_t,
        step=step_t,
        max_mask_tokens=max_mask_tokens,
    )
