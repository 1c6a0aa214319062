"""Request bodies the gateway's integration tests share (imported by name: see conftest.py)."""

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
