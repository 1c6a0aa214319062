"""Request bodies the gateway's tests share."""

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


# Mask requests for the policy's unit tests, one builder per route: top_k 10 and 100 new
# tokens, meta info on; `fields` replace the defaults, and a field given as `...` is left out.


def completion_body(**fields: Any) -> dict[str, Any]:
    body = {
        "model": "m",
        "prompt": "hi",
        "return_sampling_mask": True,
        "return_meta_info": True,
        "top_k": 10,
        "max_tokens": 100,
        **fields,
    }
    return {k: v for k, v in body.items() if v is not ...}


def chat_body(**fields: Any) -> dict[str, Any]:
    body = {**completion_body(**fields), "messages": [{"role": "user", "content": "hi"}]}
    body.pop("prompt", None)
    return body


def generate_body(**fields: Any) -> dict[str, Any]:
    body = {
        "text": "hi",
        "return_sampling_mask": True,
        "sampling_params": {"top_k": 10, "max_new_tokens": 100},
        **fields,
    }
    return {k: v for k, v in body.items() if v is not ...}
