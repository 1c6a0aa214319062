"""SampleResult: the outputs of kernels.sample for one decode step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

STATUS_OK = 0
STATUS_OVERFLOW = 1  # exact mode, |S| > max_mask_tokens: no ids emitted for the row
STATUS_TRUNCATED = 2  # bounded mode, |S| > max_mask_tokens: first C ids, y kept


@dataclass(frozen=True)
class SampleResult:
    """Per-step sampling outputs; B rows, R of them asked for a mask.

    Flagged rows (nan_rows) have token 0, logprob NaN and an empty mask: the caller fails
    them with worker_numerical_error and must not commit the token.

    On CUDA, mask_ids is a buffer of capacity R * min(C, V) (no host sync is allowed to
    learn N); only mask_ids[:mask_offsets[-1]] is meaningful. On CPU its length is exactly N.
    """

    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32, log-prob of the token over the support S (<= 0)
    mask_rows: torch.Tensor  # [R] int64, batch rows that asked for a mask, ascending
    mask_offsets: torch.Tensor  # [R+1] int64, CSR offsets into mask_ids
    mask_ids: torch.Tensor  # [>= N] int32, each row's ids in design order (3.9)
    mask_status: torch.Tensor  # [R] int8: STATUS_OK | STATUS_OVERFLOW | STATUS_TRUNCATED
    nan_rows: torch.Tensor  # [B] bool: a NaN or +inf in z (greedy rows too), or no finite z
    fallback_rows: torch.Tensor  # [B] bool: rows whose support needed the slow full pass
    support_sizes: torch.Tensor  # [B] int64: |S| (0 for flagged rows)
    # Pass 1's per-segment statistics of z (CUDA path only; None on the torch path): the
    # segment max and sum exp(z - max), [B, n_segments] float32. They give a row's full
    # log-normaliser without another read of the logits (worker/runner/raw_logprobs.py).
    chunk_max: torch.Tensor | None = None
    chunk_sumexp: torch.Tensor | None = None

    def masks(self) -> list[list[int]]:
        """The R masks as host lists (one device-to-host copy)."""
        offsets = self.mask_offsets.cpu().tolist()
        ids = self.mask_ids[: offsets[-1]].cpu().tolist()
        return [ids[offsets[r] : offsets[r + 1]] for r in range(len(offsets) - 1)]
