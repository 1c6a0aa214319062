"""Counter-based sampling noise keyed by (seed, step, token id).

The draw is a Gumbel-max race: y = argmax_{j in S} z_j + g_j with g_j = -log(-log(u_j)).
u_j is a pure function of (seed, step, token id), so the token does not depend on the batch
the row sits in. The hash works on 32-bit words held in int64 with multipliers below 2**31,
so every product fits in int64 and the Triton kernels (int64 arithmetic too) compute the
same bits on any device, including the Triton interpreter.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch

# mix32 and row_keys use only operators that mean the same on torch int64 tensors and on
# Python ints (which never overflow), so one definition serves both.
Word = TypeVar("Word", torch.Tensor, int)

MASK32 = 0xFFFFFFFF
# Multipliers below 2**31 keep (x < 2**32) * c below 2**63: no signed overflow anywhere.
MUL_A = 0x7FEB352D
MUL_B = 0x045D9F3B
STEP_SALT = 0x2545F491
ROW_SALT = 0x68E31DA4
# u = ((h >> 9) + 0.5) * 2**-23: 23 random bits, exactly representable in float32, in (0, 1).
U_SHIFT = 9
U_SCALE = 2.0**-23
# A bound on every g = -log(-log(u)) the noise can take (u at most 1 - 2**-24: about 16.64),
# raised by 0.01 for float32's rounding of the two logs (about 1e-6 here).
G_MAX = -math.log(-math.log1p(-(2.0**-24))) + 0.01


def mix32(x: Word) -> Word:
    """A bijective 32-bit integer finaliser. x: int64 in [0, 2**32); returns the same."""
    x = x ^ (x >> 16)
    x = (x * MUL_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MUL_B) & MASK32
    return x ^ (x >> 16)


def row_keys(seed: Word, step: Word) -> tuple[Word, Word]:
    """seed, step: [B] int64 -> two [B] int64 key words in [0, 2**32); on Python ints (any
    value in the int64 range), the same two words as ints."""
    s_lo, s_hi = seed & MASK32, (seed >> 32) & MASK32
    t_lo, t_hi = step & MASK32, (step >> 32) & MASK32
    k0 = mix32(s_lo ^ mix32(t_lo ^ STEP_SALT))
    k1 = mix32(s_hi ^ mix32(t_hi ^ mix32(k0 ^ ROW_SALT)))
    return k0, k1


def gumbel(k0: torch.Tensor, k1: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise for token ids. k0, k1: [B, 1] int64; ids: [B, L] int64 -> [B, L] float32."""
    h = mix32(mix32(ids ^ k0) ^ k1)
    u = ((h >> U_SHIFT).to(torch.float32) + 0.5) * U_SCALE
    return -torch.log(-torch.log(u))
