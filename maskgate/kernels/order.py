"""The total order of the mask semantics (z descending, then token id ascending) as int64 keys
(docs/design.md, mask semantics).

key = (ordered_bits(z) << 32) | (0xFFFFFFFF - id): a larger key comes first. ordered_bits maps
float32 to int32 monotonically, so comparing keys compares (z, -id) lexicographically. -0.0 is
folded into +0.0 first so that equal values tie on the id, as the design says.
"""

from __future__ import annotations

import torch

LOW32 = 0xFFFFFFFF
# The greedy threshold, compared in float64 so every path agrees on T == 1e-6.
GREEDY_T = 1e-6


def scaled_logits(x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """x: [B, V] float32, temperature: [B] float32 -> z: [B, V] float32.

    Greedy rows (T < 1e-6) keep x unscaled: only their argmax matters. Division is IEEE
    round-to-nearest float32, as the mask semantics ask.
    """
    greedy = temperature.double() < GREEDY_T
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature)
    # + 0.0 folds -0.0 into +0.0 (round to nearest: -0.0 + 0.0 = +0.0) and leaves every other
    # value as it is, in place: one pass, where a compare and a select took three.
    return (x / safe_t[:, None]).add_(0.0)


def ordered_bits(z: torch.Tensor) -> torch.Tensor:
    """z: float32 (no -0.0) -> int32 monotone in z (negative floats get their magnitude
    bits flipped)."""
    bits = z.view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def order_keys(z: torch.Tensor) -> torch.Tensor:
    """z: [B, V] float32 (no -0.0) -> [B, V] int64 keys; sorting keys descending gives design
    order."""
    low = LOW32 - torch.arange(z.shape[-1], device=z.device, dtype=torch.int64)
    return (ordered_bits(z).to(torch.int64) << 32) | low


def pack_keys(z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Keys of given tokens: z float32 and ids int64 of the same shape (-0.0 allowed)."""
    z = torch.where(z == 0, torch.zeros_like(z), z)
    return (ordered_bits(z).to(torch.int64) << 32) | (LOW32 - ids)


def key_ids(keys: torch.Tensor) -> torch.Tensor:
    """Token ids back from keys (int64)."""
    return LOW32 - (keys & LOW32)


def key_z(keys: torch.Tensor) -> torch.Tensor:
    """z back from keys (float32; ordered_bits is its own inverse)."""
    return ordered_bits((keys >> 32).to(torch.int32)).view(torch.float32)
