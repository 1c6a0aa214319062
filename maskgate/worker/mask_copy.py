"""A step's mask ids to the host, as int32 arrays the sequences keep without Python lists.

The sampler leaves every mask row's ids back to back in one int32 device buffer (CSR, ids in
mask order). On CUDA they go to a pinned staging buffer in one asynchronous copy, then into a
fresh host array of exactly the step's id count: each mask row keeps a view of it (one NumPy
object per row, never one Python int per id), and the staging buffer is free for the next
step. The answer then writes a view as a list (`lists`) or its bytes as base64 (`packed`).
"""

from __future__ import annotations

import numpy as np
import torch

MaskIds = np.ndarray  # [n] int32: one token's mask ids in mask order (docs/design.md)


class MaskIdsCopy:
    """Copies the first `n` ids of a step's `mask_ids` to a host array the caller owns."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.staging: torch.Tensor | None = None  # [capacity] int32, pinned; CUDA only
        self.copied = torch.cuda.Event() if self.cuda else None

    def copy(self, mask_ids: torch.Tensor, n: int) -> np.ndarray:
        """mask_ids [>= n] int32 (device or host) -> a new host array [n] int32."""
        if n == 0:
            return np.empty(0, dtype=np.int32)
        if not mask_ids.is_cuda:
            return np.array(mask_ids[:n].numpy(), dtype=np.int32)  # a copy, always int32
        staging = self.staging
        if staging is None or staging.numel() < n:
            size = 1 << max(16, (n - 1).bit_length())  # powers of two: few regrowths
            staging = self.staging = torch.empty(size, dtype=torch.int32, pin_memory=True)
        staging[:n].copy_(mask_ids[:n], non_blocking=True)
        assert self.copied is not None
        self.copied.record()
        self.copied.synchronize()  # only this copy, not the whole device
        return staging[:n].numpy().copy()
