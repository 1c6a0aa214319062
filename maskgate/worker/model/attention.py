"""Attention over the slot KV cache for a flattened batch of mixed prefill chunks and decodes.

A step's tokens are flattened to [N] in row order, decode rows (one token each) first, then
prefill rows. Each group runs one `scaled_dot_product_attention` call over keys gathered from
its rows' slots; masks depend only on query positions (a key is visible iff its position is
<= the query's and inside the sliding window), so stale entries past a row's length never
need clearing.

GQA without repeating K/V: the G query heads sharing a KV head are laid out along the query
axis, q: [R, kv_heads, G * Lq, head_dim] against k, v: [R, kv_heads, K, head_dim].

On the fused (CUDA) path the decode rows skip all of this: triton_decode_attn reads their
slots in place and needs neither a gather nor a mask tensor. Prefill rows always come here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(slots=True)
class AttnGroup:
    """Rows that share one padded attention call."""

    slots: torch.Tensor  # [R] int64 KV slot per row
    # [R, 1, G * Lq, K] (or [R, 1, 1, K] for decode), in the model's dtype: 0 where the key is
    # visible, -inf elsewhere. Additive rather than bool: torch converts a bool mask inside
    # every SDPA call, and its CPU kernel is several times slower with one. None for the
    # decode group of a fused step (the Triton kernel masks by position itself).
    mask: torch.Tensor | None
    num_keys: int  # K: keys read per row, >= every row's last position + 1
    num_rows: int
    lq: int  # padded query length per row
    num_tokens: int  # real tokens in the group (<= num_rows * lq)
    pad_index: torch.Tensor | None  # [R * lq] group token -> padded slot; None: no padding
    unpad_index: torch.Tensor | None  # [num_tokens] padded slot -> group token


@dataclass(slots=True)
class AttnBatch:
    write_slots: torch.Tensor  # [N] int64 slot each token's K/V is written to
    positions: torch.Tensor  # [N] int64 position of each token
    decode: AttnGroup | None  # tokens [0, decode.num_tokens)
    prefill: AttnGroup | None  # the remaining tokens
    fused: bool = False  # run the step's Triton kernels (CUDA only) instead of the torch path


def key_mask(
    qpos: torch.Tensor, num_keys: int, sliding_window: int | None, dtype: torch.dtype
) -> torch.Tensor:
    """qpos: [..., Lq] int64 -> [..., Lq, num_keys] additive mask (0 visible, -inf hidden)."""
    keys = torch.arange(num_keys, device=qpos.device)
    qpos = qpos.unsqueeze(-1)
    hidden = keys > qpos
    if sliding_window is not None:
        hidden |= keys <= qpos - sliding_window
    zeros = torch.zeros(hidden.shape, dtype=dtype, device=qpos.device)
    return zeros.masked_fill_(hidden, float("-inf"))


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: AttnGroup
) -> torch.Tensor:
    """q: [num_tokens, H, D]; caches: [slots, kv_heads, max_len, D] -> [num_tokens, H, D]."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    g, r, lq = heads // kv_heads, group.num_rows, group.lq
    num_keys = group.num_keys
    assert group.mask is not None, "the torch path needs the group's mask"
    if group.pad_index is not None:
        q = q.index_select(0, group.pad_index)
    # Slice before gathering so only the first num_keys positions of each slot are copied.
    k = k_cache[:, :, :num_keys].index_select(0, group.slots)
    v = v_cache[:, :, :num_keys].index_select(0, group.slots)
    q = q.view(r, lq, kv_heads, g, dim).permute(0, 2, 3, 1, 4).reshape(r, kv_heads, g * lq, dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask)
    out = out.view(r, kv_heads, g, lq, dim).permute(0, 3, 1, 2, 4).reshape(r * lq, heads, dim)
    if group.unpad_index is not None:
        out = out.index_select(0, group.unpad_index)
    return out


def build_attn_batch(
    write_slots: torch.Tensor,
    positions: torch.Tensor,
    row_lens: list[int],
    row_slots: list[int],
    row_starts: list[int],
    num_heads_per_kv: int,
    sliding_window: int | None,
    dtype: torch.dtype,
    fused: bool = False,
) -> AttnBatch:
    """Plan one step; rows must be ordered decode rows (length 1) first, then prefill rows.

    write_slots, positions: [N] int64 on the model's device; row_* are host lists (one per row).
    fused: the step runs the Triton kernels, so the decode rows need no mask.
    """
    device = positions.device
    num_decode = 0
    while num_decode < len(row_lens) and row_lens[num_decode] == 1:
        num_decode += 1
    decode = None
    if num_decode:
        qpos = positions[:num_decode]
        num_keys = max(row_starts[:num_decode]) + 1
        decode = AttnGroup(
            slots=write_slots[:num_decode],
            mask=None
            if fused
            else key_mask(qpos, num_keys, sliding_window, dtype)[:, None, None, :],
            num_keys=num_keys,
            num_rows=num_decode,
            lq=1,
            num_tokens=num_decode,
            pad_index=None,
            unpad_index=None,
        )
    prefill = None
    lens = row_lens[num_decode:]
    if lens:
        lq = max(lens)
        num_keys = max(s + n for s, n in zip(row_starts[num_decode:], lens, strict=True))
        pad: list[int] = []
        unpad: list[int] = []
        first = 0
        for i, n in enumerate(lens):
            # Pad a short row by repeating its last token: its mask row stays non-empty.
            pad.extend(first + min(j, n - 1) for j in range(lq))
            unpad.extend(i * lq + j for j in range(n))
            first += n
        padded = len(lens) * lq != first
        pad_index = torch.tensor(pad, device=device) if padded else None
        qpos = positions[num_decode:]
        if pad_index is not None:
            qpos = qpos.index_select(0, pad_index)
        mask = key_mask(qpos.view(len(lens), lq), num_keys, sliding_window, dtype)
        prefill = AttnGroup(
            slots=torch.tensor(row_slots[num_decode:], device=device),
            mask=mask.repeat(1, num_heads_per_kv, 1)[:, None],
            num_keys=num_keys,
            num_rows=len(lens),
            lq=lq,
            num_tokens=first,
            pad_index=pad_index,
            unpad_index=torch.tensor(unpad, device=device) if padded else None,
        )
    return AttnBatch(write_slots, positions, decode, prefill, fused)
