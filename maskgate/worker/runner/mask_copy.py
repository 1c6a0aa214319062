"""A step's mask ids to the host, as int32 arrays the sequences keep without Python lists.

The sampler leaves every mask row's ids back to back in one int32 device buffer (CSR, ids in
mask order). On CUDA they go to a pinned staging buffer in one asynchronous copy (the host
waits for that copy only), which the sampler cuts into one small int32 array per mask row
(one NumPy object per row, never one Python int per id) before the next step reuses the
buffer. The answer then writes each token's array as a list (`lists`) or their bytes as
base64 (`packed`).
"""

from __future__ import annotations

import numpy as np
import torch


class MaskIdsCopy:
    """The first `n` ids of a step's `mask_ids` on the host, valid until the next call."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.staging: torch.Tensor | None = None  # [capacity] int32, pinned; CUDA only
        self.copied = torch.cuda.Event() if self.cuda else None
        # Under the overlap schedule a later step is already queued on the main stream when
        # this step's ids are copied: the copy runs on its own stream, after `after` only.
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def copy(
        self, mask_ids: torch.Tensor, n: int, after: torch.cuda.Event | None = None
    ) -> np.ndarray:
        """mask_ids [>= n] int32 (device or host) -> a host array [n] int32 (a view of the
        staging buffer on CUDA: the caller copies what it keeps before the next call).
        `after`: the event that marks `mask_ids` written (None: the current stream's work)."""
        if n == 0:
            return np.empty(0, dtype=np.int32)
        if not mask_ids.is_cuda:
            return mask_ids[:n].numpy().astype(np.int32, copy=False)
        staging = self.staging
        if staging is None or staging.numel() < n:
            size = 1 << max(16, (n - 1).bit_length())  # powers of two: few regrowths
            staging = self.staging = torch.empty(size, dtype=torch.int32, pin_memory=True)
        assert self.copied is not None and self.stream is not None
        with torch.cuda.stream(self.stream):
            if after is None:
                self.stream.wait_stream(torch.cuda.current_stream(mask_ids.device))
            else:
                self.stream.wait_event(after)
            staging[:n].copy_(mask_ids[:n], non_blocking=True)
            self.copied.record(self.stream)
        self.copied.synchronize()  # only this copy, not the whole device
        return staging[:n].numpy()
