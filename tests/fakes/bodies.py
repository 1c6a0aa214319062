"""Request bodies the gateway's integration tests share."""

from __future__ import annotations

from typing import Any

# A mask request every policy rule accepts: top_k bounds the support, meta info is on.
MASK_CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "return_sampling_mask": True,
    "return_meta_info": True,
    "top_k": 20,
    "max_tokens": 8,
}

# A /generate mask request every rule accepts (top_k bounds the support).
MASK_GEN: dict[str, Any] = {
    "text": "x",
    "return_sampling_mask": True,
    "sampling_params": {"top_k": 3},
}
# The same with a small token cap.
MASK_GEN_CAPPED: dict[str, Any] = {**MASK_GEN, "sampling_params": {"top_k": 3, "max_new_tokens": 4}}
# Breaks rule 7 (full vocabulary): refused on every path and method that reaches /generate,
# never forwarded to any pool.
BAD_GEN: dict[str, Any] = {"text": "x", "return_sampling_mask": True, "sampling_params": {}}
